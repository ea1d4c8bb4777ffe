// Package inflighttest is the conformance suite of inflight.Limiter: the
// one truth the memory and Redis implementations are both held to.
package inflighttest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate/floodgate/inflight"
)

// NewFunc returns a fresh limiter of the given limit, with no key held.
type NewFunc func(t *testing.T, limit int) inflight.Limiter

// Run runs the conformance suite on the limiters newL makes: the cap,
// release (idempotent, concurrent), independent keys, a canceled context,
// and many goroutines never holding more than the limit at once.
func Run(t *testing.T, newL NewFunc) {
	t.Run("CapAndRelease", func(t *testing.T) { testCapAndRelease(t, newL(t, 3)) })
	t.Run("ReleaseIsIdempotent", func(t *testing.T) { testIdempotent(t, newL(t, 2)) })
	t.Run("ConcurrentDoubleRelease", func(t *testing.T) { testConcurrentRelease(t, newL(t, 1)) })
	t.Run("KeysIndependent", func(t *testing.T) { testKeysIndependent(t, newL(t, 1)) })
	t.Run("CanceledContext", func(t *testing.T) { testCanceled(t, newL(t, 1)) })
	t.Run("NeverOverLimit", func(t *testing.T) { testNeverOverLimit(t, newL(t, 4)) })
}

// MustAcquire takes a slot of key or fails the test.
func MustAcquire(t *testing.T, l inflight.Limiter, key string) *inflight.Token {
	t.Helper()
	tok, ok, err := l.Acquire(context.Background(), key)
	if err != nil || !ok {
		t.Fatalf("Acquire(%q) = %v, %v; want a slot", key, ok, err)
	}
	return tok
}

// MustRefuse fails the test unless key is refused.
func MustRefuse(t *testing.T, l inflight.Limiter, key string) {
	t.Helper()
	tok, ok, err := l.Acquire(context.Background(), key)
	if err != nil || ok || tok != nil {
		t.Fatalf("Acquire(%q) = %v, %v, %v; want a refusal", key, tok, ok, err)
	}
}

func testCapAndRelease(t *testing.T, l inflight.Limiter) {
	if l.Limit() != 3 {
		t.Fatalf("Limit() = %d, want 3", l.Limit())
	}
	toks := []*inflight.Token{MustAcquire(t, l, "k"), MustAcquire(t, l, "k"), MustAcquire(t, l, "k")}
	MustRefuse(t, l, "k")
	MustRefuse(t, l, "k") // a refusal takes nothing
	toks[1].Release()
	if !toks[1].Released() || toks[0].Released() {
		t.Fatal("Released() wrong")
	}
	toks[1] = MustAcquire(t, l, "k")
	MustRefuse(t, l, "k")
	for _, tok := range toks {
		tok.Release()
	}
	for range 3 {
		MustAcquire(t, l, "k").Release()
	}
}

// A second Release must not give back a slot someone else now holds.
func testIdempotent(t *testing.T, l inflight.Limiter) {
	a := MustAcquire(t, l, "k")
	b := MustAcquire(t, l, "k")
	a.Release()
	c := MustAcquire(t, l, "k")
	a.Release() // again: nothing
	a.Release()
	MustRefuse(t, l, "k") // b and c still hold both slots
	b.Release()
	c.Release()
	var nilTok *inflight.Token
	nilTok.Release() // a nil token is a no-op, never a panic
}

func testConcurrentRelease(t *testing.T, l inflight.Limiter) {
	for range 20 {
		tok := MustAcquire(t, l, "k")
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(tok.Release)
		}
		wg.Wait()
		held := MustAcquire(t, l, "k")
		MustRefuse(t, l, "k") // 8 releases freed one slot, not eight
		held.Release()
	}
}

func testKeysIndependent(t *testing.T, l inflight.Limiter) {
	a := MustAcquire(t, l, "a")
	b := MustAcquire(t, l, "b")
	MustRefuse(t, l, "a")
	MustRefuse(t, l, "b")
	a.Release()
	MustRefuse(t, l, "b")
	MustAcquire(t, l, "a").Release()
	b.Release()
}

func testCanceled(t *testing.T, l inflight.Limiter) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	tok, ok, err := l.Acquire(ctx, "k")
	if err == nil || ok || tok != nil {
		t.Fatalf("Acquire on a canceled context = %v, %v, %v; want an error", tok, ok, err)
	}
	MustAcquire(t, l, "k").Release() // it took nothing
}

// Many goroutines on few keys: the test's own counter of holders never
// passes the limit, and reaches it (the test is not vacuous).
func testNeverOverLimit(t *testing.T, l inflight.Limiter) {
	const keys, workers, rounds = 3, 24, 150
	limit := int64(l.Limit())
	var in, peak [keys]atomic.Int64
	var admitted atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for i := range rounds {
				k := (w + i) % keys
				tok, ok, err := l.Acquire(context.Background(), fmt.Sprint("key", k))
				if err != nil {
					errs <- err
					return
				}
				if !ok {
					continue
				}
				n := in[k].Add(1)
				if n > limit {
					errs <- fmt.Errorf("key%d: %d in flight, limit %d", k, n, limit)
					in[k].Add(-1)
					tok.Release()
					return // one error per worker: errs never fills
				}
				for p := peak[k].Load(); n > p && !peak[k].CompareAndSwap(p, n); p = peak[k].Load() {
				}
				admitted.Add(1)
				time.Sleep(200 * time.Microsecond) // hold it a little, so holders overlap
				in[k].Add(-1)                      // before Release: the counter never lags the truth
				tok.Release()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	var top int64
	for k := range keys {
		top = max(top, peak[k].Load())
	}
	if top != limit {
		t.Fatalf("peak in flight %d; the test never reached the limit %d", top, limit)
	}
	t.Logf("%d admitted of %d", admitted.Load(), workers*rounds)
}

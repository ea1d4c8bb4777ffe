package deferq_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/floodgate/floodgate/deferq"
	"github.com/floodgate/floodgate/internal/redistest"
)

// flaky is a Deliver that fails the requests whose body is in fail, and
// records every attempt's body in order.
type flaky struct {
	mu       sync.Mutex
	fail     map[string]bool
	attempts []string
}

func (f *flaky) deliver(_ context.Context, r *http.Request) (*deferq.Result, error) {
	b, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.attempts = append(f.attempts, string(b))
	if f.fail[string(b)] {
		return nil, errors.New("upstream down")
	}
	return &deferq.Result{Status: http.StatusOK, Body: b}, nil
}

func (f *flaky) seen() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.attempts...)
}

// onceUntil calls Once until it has handed out a request (claimed after
// ClaimIdle, or read) or dead-lettered one, or fails the test after 10 s.
func onceUntil(t *testing.T, q *deferq.Queue, d deferq.Deliver) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, _ := q.Len(context.Background())
		ok, err := q.Once(context.Background(), "w", d)
		m, _ := q.Len(context.Background())
		if ok || err != nil || m < n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no request handed out in 10 s")
		}
	}
}

// TestDeadLetter: a request whose delivery always fails is tried exactly
// MaxDeliveries (3) times, then moved to the dead-letter stream: its poll
// answers 502, the queue is empty, DeadLen counts it and DeadLetters
// shows it. The dead-letter stream keeps at most MaxDead (2): of 4 dead
// requests, the newest 2. A request that succeeds on its second try is
// delivered, not dead-lettered.
func TestDeadLetter(t *testing.T) {
	srv := redistest.Standalone(t)
	q := newQueue(t, srv.Addr, deferq.Options{MaxDeliveries: 3, MaxDead: 2, ClaimIdle: 30 * time.Millisecond, Block: 5 * time.Millisecond})
	f := front(t, q)
	locs := accept(t, f, 1) // body0
	fl := &flaky{fail: map[string]bool{"body0": true}}
	for range 4 { // 3 attempts, then the dead-lettering
		onceUntil(t, q, fl.deliver)
	}
	if got := fl.seen(); len(got) != 3 {
		t.Fatalf("attempts %v; want exactly 3 (MaxDeliveries)", got)
	}
	st, body, _ := get(t, f.URL+locs[0])
	if st != http.StatusBadGateway || !strings.Contains(body, "3 attempts") {
		t.Errorf("poll of the dead request: %d %q; want 502 naming 3 attempts", st, body)
	}
	ctx := context.Background()
	if n, _ := q.Len(ctx); n != 0 {
		t.Errorf("Len = %d after dead-lettering, want 0", n)
	}
	if n, _ := q.DeadLen(ctx); n != 1 {
		t.Errorf("DeadLen = %d, want 1", n)
	}
	ds, err := q.DeadLetters(ctx, 10)
	if err != nil || len(ds) != 1 || ds[0].ID != sidOf(locs[0]) || ds[0].Method != "POST" || ds[0].URL != "/orders?n=0" {
		t.Errorf("DeadLetters = %+v, %v", ds, err)
	}
	// 3 more dead (accept numbers them body0..body2 again): the stream
	// keeps the newest 2
	fl.mu.Lock()
	fl.fail = map[string]bool{"body0": true, "body1": true, "body2": true}
	fl.mu.Unlock()
	more := accept(t, f, 3)
	for range 3 * 4 {
		onceUntil(t, q, fl.deliver)
	}
	if n, _ := q.DeadLen(ctx); n != 2 {
		t.Errorf("DeadLen = %d after 4 dead with MaxDead 2, want 2", n)
	}
	if ds, _ := q.DeadLetters(ctx, 10); len(ds) != 2 || ds[0].ID != sidOf(more[1]) || ds[1].ID != sidOf(more[2]) {
		t.Errorf("dead letters %+v; want the newest two, %s and %s", ds, sidOf(more[1]), sidOf(more[2]))
	}
	if n, _ := q.Len(ctx); n != 0 {
		t.Errorf("Len = %d, want 0", n)
	}
	// fails once, then succeeds: delivered on the second try
	fl.mu.Lock()
	fl.fail = map[string]bool{"body0": true}
	fl.attempts = nil
	fl.mu.Unlock()
	loc := accept(t, f, 1)[0]
	onceUntil(t, q, fl.deliver)
	fl.mu.Lock()
	fl.fail = nil
	fl.mu.Unlock()
	onceUntil(t, q, fl.deliver)
	if st, body, _ := get(t, f.URL+loc); st != 200 || body != "body0" || len(fl.seen()) != 2 {
		t.Errorf("a request failing once: poll %d %q after %v; want 200 on the second try", st, body, fl.seen())
	}
	if n, _ := q.DeadLen(ctx); n != 2 {
		t.Errorf("DeadLen = %d, want still 2", n)
	}
}

// TestOrderAfterReclaim: one worker, five requests; the first delivery
// fails. The worker goes on with the second and third; once the first
// has been pending for ClaimIdle, the next Once reclaims it before it
// reads the fourth: the order is 0 (failed), 1, 2, 0, 3, 4 — a reclaimed
// request comes after those a worker took meanwhile, and before those
// not yet taken (docs/THROTTLE.md, "Guarantees and limits").
func TestOrderAfterReclaim(t *testing.T) {
	srv := redistest.Standalone(t)
	q := newQueue(t, srv.Addr, deferq.Options{ClaimIdle: time.Second, Block: 5 * time.Millisecond})
	f := front(t, q)
	accept(t, f, 5)
	fl := &flaky{fail: map[string]bool{"body0": true}}
	ctx := context.Background()
	if ok, err := q.Once(ctx, "w", fl.deliver); !ok || err == nil {
		t.Fatalf("the failing delivery: %v, %v", ok, err)
	}
	fl.mu.Lock()
	fl.fail = nil
	fl.mu.Unlock()
	for range 2 {
		if ok, err := q.Once(ctx, "w", fl.deliver); !ok || err != nil {
			t.Fatal(ok, err)
		}
	}
	if got := strings.Join(fl.seen(), " "); got != "body0 body1 body2" {
		t.Fatalf("before the reclaim: %s", got) // the first was not reclaimed before ClaimIdle
	}
	time.Sleep(1100 * time.Millisecond) // past ClaimIdle on Redis's clock: what is tested is the order, not the time
	for range 3 {
		if ok, err := q.Once(ctx, "w", fl.deliver); !ok || err != nil {
			t.Fatal(ok, err)
		}
	}
	if got := strings.Join(fl.seen(), " "); got != "body0 body1 body2 body0 body3 body4" {
		t.Errorf("order %s; want body0 body1 body2 body0 body3 body4", got)
	}
}

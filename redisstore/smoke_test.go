package redisstore_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
	"weak"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/redistest"
	"github.com/floodgate/floodgate/redisstore"
	"github.com/floodgate/floodgate/storekit"
)

func TestSmoke(t *testing.T) {
	srv := redistest.Standalone(t)
	s, err := redisstore.New("redis://"+srv.Addr, redisstore.Options{ClientTime: true, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	defer func() {
		if st := s.Stats(); st.Errors != 0 || st.Calls == 0 {
			t.Errorf("stats %+v", st)
		}
	}()
	for _, r := range []floodgate.Rule{
		{Algorithm: floodgate.TokenBucket, Limit: 3, Period: time.Minute},
		{Algorithm: floodgate.TokenBucket, Limit: 3, Period: time.Minute, Refill: floodgate.RefillInterval},
		{Algorithm: floodgate.LeakyBucketShaper, Limit: 3, Period: time.Minute},
		{Algorithm: floodgate.FixedWindow, Limit: 3, Period: time.Minute},
		{Algorithm: floodgate.FixedWindow, Limit: 3, Calendar: floodgate.CalendarDay},
		{Algorithm: floodgate.SlidingLog, Limit: 3, Period: time.Minute},
		{Algorithm: floodgate.SlidingWindow, Limit: 3, Period: time.Minute},
		{Algorithm: floodgate.SlidingSubwindow, Limit: 3, Period: time.Minute, Granularity: time.Second},
	} {
		p := floodgate.MustPolicy("smoke-"+string(r.Algorithm)+string(r.Refill)+string(r.Calendar), r)
		mem := make([]int64, storekit.Width(p))
		now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
		for i := range 6 {
			now += int64(i) * 7_000_000
			op := floodgate.Op{Policy: p, Key: "k", Kind: floodgate.OpAllow, Cost: 1}
			want := storekit.Apply(p, mem, now, op)
			got, err := s.Do(ctx, now, op)
			if err != nil || got != want {
				t.Errorf("%s step %d:\n got %+v %v\nwant %+v", p.Name(), i, got, err, want)
			}
		}
	}
}

// A cost far beyond every rule (the service passes a client's hits_addend
// up to 2^52) is refused as too large and consumes nothing, and a refund as
// large empties the state, in Redis's Lua as in Go: exact, no overflow.
func TestHugeCost(t *testing.T) {
	s := openStore(t, redistest.Standalone(t), redisstore.Options{ClientTime: true, Timeout: time.Second})
	ctx := context.Background()
	const huge = 1 << 52
	for _, r := range []floodgate.Rule{
		{Algorithm: floodgate.TokenBucket, Limit: 3, Period: time.Minute},
		{Algorithm: floodgate.TokenBucket, Limit: 3, Period: time.Minute, Refill: floodgate.RefillInterval},
		{Algorithm: floodgate.LeakyBucketShaper, Limit: 3, Period: time.Minute},
		{Algorithm: floodgate.FixedWindow, Limit: 3, Period: 365 * 24 * time.Hour},
		{Algorithm: floodgate.FixedWindow, Limit: 1<<32 - 1, Period: time.Second}, // Envoy's largest requests_per_unit
		{Algorithm: floodgate.FixedWindow, Limit: 1<<51 - 1, Period: time.Hour},
		{Algorithm: floodgate.SlidingLog, Limit: 3, Period: time.Minute},
		{Algorithm: floodgate.SlidingWindow, Limit: 3, Period: time.Minute},
		{Algorithm: floodgate.SlidingSubwindow, Limit: 3, Period: time.Minute, Granularity: time.Second},
		{Algorithm: floodgate.GCRA, Limit: 1, Period: 365 * 24 * time.Hour},
	} {
		p := floodgate.MustPolicy("huge-"+string(r.Algorithm)+string(r.Refill), r)
		mem := make([]int64, storekit.Width(p))
		now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
		for i, step := range []struct {
			kind floodgate.OpKind
			cost int64
		}{{floodgate.OpAllow, 1}, {floodgate.OpAllow, huge}, {floodgate.OpAllow, 1}, {floodgate.OpRefund, huge}, {floodgate.OpAllow, 1}} {
			now += 1_000
			op := floodgate.Op{Policy: p, Key: "k", Kind: step.kind, Cost: step.cost}
			want := storekit.Apply(p, mem, now, op)
			got, err := s.Do(ctx, now, op)
			if err != nil || got != want {
				t.Errorf("%s step %d:\n got %+v %v\nwant %+v", p.Name(), i, got, err, want)
			}
			if step.kind == floodgate.OpAllow && step.cost == huge && (want.Allowed || want.Reason != floodgate.ReasonCostTooLarge) {
				t.Errorf("%s: a cost of 2^52 %+v, want refused as too large", p.Name(), want)
			}
		}
	}
}

// rediss:// to a server without TLS says what is likely wrong, not only
// that the handshake timed out.
func TestRedissToPlainServer(t *testing.T) {
	srv := redistest.Standalone(t)
	_, err := redisstore.New("rediss://"+srv.Addr, redisstore.Options{})
	if err == nil || !strings.Contains(err.Error(), "speaks TLS") {
		t.Fatalf("rediss:// to a plain server: %v", err)
	}
}

// The store keeps nothing of a policy once its users drop it: every reload
// of the rules makes new policy objects, and a map of them here grew by
// each one for good (about 21 MB a reload of 20,000 descriptors).
func TestPoliciesAreNotRetained(t *testing.T) {
	srv := redistest.Standalone(t)
	s := openStore(t, srv, redisstore.Options{})
	var dropped []weak.Pointer[floodgate.Policy]
	for i := range 50 {
		p := floodgate.MustPolicy(fmt.Sprint("gone", i), floodgate.Rule{Name: "r", Algorithm: floodgate.FixedWindow, Limit: 5, Period: time.Minute, OnStoreFailure: floodgate.FailLocal, LocalPercent: 50})
		if _, err := s.Do(context.Background(), time.Now().UnixMicro(), floodgate.Op{Policy: p, Key: "k", Cost: 1}); err != nil {
			t.Fatal(err)
		}
		dropped = append(dropped, weak.Make(p))
	}
	// A decision's last goroutines (a coalesced call's sender) may still
	// hold its policy for a moment after Do returns; a retained one is
	// held for good. So collect until none is alive, for a while.
	kept := 0
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		runtime.GC()
		kept = 0
		for _, w := range dropped {
			if w.Value() != nil {
				kept++
			}
		}
		if kept == 0 || time.Now().After(deadline) {
			break
		}
	}
	if kept > 0 {
		t.Fatalf("%d of 50 policies no one uses are still alive after 10 s", kept)
	}
}

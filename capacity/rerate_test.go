package capacity

import (
	"context"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate/floodgate/clock"
)

// The top half's tests: leases given to a resource directly (setLease, the
// bottom half's one entry into it), on a manual clock. The client's servers
// are a closed loopback port, so its background refreshes fail and change
// nothing. The tests against real servers are in client_test.go.

var t0 = time.Date(2026, 11, 27, 4, 0, 0, 0, time.UTC)

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// newOffline returns a client whose servers cannot be reached.
func newOffline(t *testing.T, clk *clock.Manual) *Client {
	t.Helper()
	c, err := New(ClientOptions{Addrs: []string{closedAddr(t)}, Clock: clk, Logger: quietLogger(), RPCTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// admit calls Allow n times and returns how many were admitted.
func admit(t *testing.T, r *Resource, n int) int {
	t.Helper()
	got := 0
	for range n {
		d, err := r.Allow(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			got++
		}
	}
	return got
}

func mkLease(capa float64, clk *clock.Manual, d time.Duration) Lease {
	return Lease{Capacity: capa, Expiry: clk.Now().Add(d), Refresh: d / 4, Safe: capa / 2}
}

func setLease(r *Resource, l Lease) { r.setLease(l, r.Wants(), r.c.clock.NowMicro()) }

// A bigger lease keeps what the bucket consumed: a spent bucket of 10 gets
// only the 90 the bigger bucket of 100 has room for, not a fresh 100; the
// rate then is the new one exactly.
func TestRerateGrowKeepsSpentBucket(t *testing.T) {
	clk := clock.NewManual(t0)
	c := newOffline(t, clk)
	r, err := c.Resource("grow", Options{Wants: 100, Mode: Pessimistic})
	if err != nil {
		t.Fatal(err)
	}
	if got := admit(t, r, 5); got != 0 {
		t.Fatalf("pessimistic, no lease yet: admitted %d, want 0", got)
	}
	setLease(r, mkLease(10, clk, time.Minute))
	if got := admit(t, r, 50); got != 10 {
		t.Fatalf("lease 10/s: admitted %d at once, want the burst of 10", got)
	}
	setLease(r, mkLease(100, clk, time.Minute))
	if got := admit(t, r, 200); got != 90 {
		t.Fatalf("after growing to 100/s with 10 spent: admitted %d at once, want 90 (never a fresh 100)", got)
	}
	clk.Advance(100 * time.Millisecond)
	if got := admit(t, r, 200); got != 10 {
		t.Fatalf("100ms at 100/s: admitted %d, want 10", got)
	}
	clk.Advance(time.Second)
	if got := admit(t, r, 500); got != 100 {
		t.Fatalf("a second at 100/s: admitted %d, want the burst of 100", got)
	}
}

// A smaller lease clamps the bucket to its size: what was spent stays
// spent, and the new, slower rate refills it.
func TestRerateShrinkNeverOverAdmits(t *testing.T) {
	clk := clock.NewManual(t0)
	c := newOffline(t, clk)
	r, err := c.Resource("shrink", Options{Wants: 100})
	if err != nil {
		t.Fatal(err)
	}
	setLease(r, mkLease(100, clk, time.Minute))
	if got := admit(t, r, 50); got != 50 {
		t.Fatalf("lease 100/s: admitted %d of 50", got)
	}
	setLease(r, mkLease(10, clk, time.Minute))
	if got := admit(t, r, 50); got != 0 {
		t.Fatalf("after shrinking to 10/s with 50 spent: admitted %d, want 0", got)
	}
	clk.Advance(500 * time.Millisecond)
	if got := admit(t, r, 50); got != 5 {
		t.Fatalf("500ms at 10/s: admitted %d, want 5", got)
	}
}

// A capacity of 0 refuses everything and freezes the bucket: what it had
// consumed is still consumed when capacity comes back.
func TestZeroCapacityFreezesBucket(t *testing.T) {
	clk := clock.NewManual(t0)
	c := newOffline(t, clk)
	r, err := c.Resource("zero", Options{Wants: 10, Mode: Pessimistic})
	if err != nil {
		t.Fatal(err)
	}
	setLease(r, mkLease(10, clk, time.Minute))
	if got := admit(t, r, 10); got != 10 {
		t.Fatalf("admitted %d of the burst of 10", got)
	}
	setLease(r, mkLease(0, clk, time.Minute))
	clk.Advance(10 * time.Second)
	if got := admit(t, r, 10); got != 0 {
		t.Fatalf("capacity 0: admitted %d", got)
	}
	d, _ := r.Allow(context.Background())
	if d.Allowed || d.Rule != "capacity" {
		t.Fatalf("capacity 0: decision %+v, want refused by rule capacity", d)
	}
	setLease(r, mkLease(10, clk, time.Minute))
	if got := admit(t, r, 10); got != 0 {
		t.Fatalf("back to 10/s after 10s at 0: admitted %d at once, want 0 (the bucket stayed spent)", got)
	}
	clk.Advance(300 * time.Millisecond)
	if got := admit(t, r, 10); got != 3 {
		t.Fatalf("300ms at 10/s: admitted %d, want 3", got)
	}
}

// Fractions of a request per second are rated exactly: 2.5/s admits 5 in
// two seconds after its burst of 3 (ceil 2.5).
func TestFractionalCapacity(t *testing.T) {
	clk := clock.NewManual(t0)
	c := newOffline(t, clk)
	r, err := c.Resource("frac", Options{Wants: 3})
	if err != nil {
		t.Fatal(err)
	}
	setLease(r, mkLease(2.5, clk, time.Hour))
	if got := admit(t, r, 10); got != 3 {
		t.Fatalf("burst of 2.5/s: admitted %d, want 3", got)
	}
	clk.Advance(2 * time.Second)
	if got := admit(t, r, 10); got != 3 {
		// 5 refilled but the bucket holds 3.
		t.Fatalf("2s at 2.5/s into a bucket of 3: admitted %d, want 3", got)
	}
	clk.Advance(400 * time.Millisecond)
	if got := admit(t, r, 10); got != 1 {
		t.Fatalf("400ms at 2.5/s: admitted %d, want 1", got)
	}
}

// Each mode's capacity when the lease expires, exactly at the expiry on
// the clock, and before any lease.
func TestModesAtExpiry(t *testing.T) {
	cases := []struct {
		mode        Mode
		before      float64 // no lease yet
		afterExpiry float64
	}{
		{Pessimistic, 0, 0},
		{Optimistic, 40, 40},
		{Safe, 7, 15}, // SafeCapacity 7 until a lease brings the server's 15
		{"", 7, 15},
	}
	for _, tc := range cases {
		t.Run(string(tc.mode), func(t *testing.T) {
			clk := clock.NewManual(t0)
			c := newOffline(t, clk)
			r, err := c.Resource("m", Options{Wants: 40, Mode: tc.mode, SafeCapacity: 7})
			if err != nil {
				t.Fatal(err)
			}
			if got := r.Capacity(); got != tc.before {
				t.Fatalf("before a lease: capacity %v, want %v", got, tc.before)
			}
			setLease(r, Lease{Capacity: 30, Safe: 15, Expiry: t0.Add(time.Minute), Refresh: 5 * time.Second})
			clk.Set(t0.Add(time.Minute - time.Microsecond))
			if got := r.Capacity(); got != 30 || !r.Leased() {
				t.Fatalf("1µs before expiry: capacity %v (leased %v), want 30 from the lease", got, r.Leased())
			}
			clk.Set(t0.Add(time.Minute))
			if got := r.Capacity(); got != tc.afterExpiry || r.Leased() {
				t.Fatalf("at expiry: capacity %v (leased %v), want %v from the mode", got, r.Leased(), tc.afterExpiry)
			}
		})
	}
}

// Optimistic mode follows the wants while there is no lease.
func TestOptimisticFollowsWants(t *testing.T) {
	clk := clock.NewManual(t0)
	c := newOffline(t, clk)
	r, err := c.Resource("opt", Options{Wants: 5, Mode: Optimistic})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.SetWants(50); err != nil {
		t.Fatal(err)
	}
	if got := r.Capacity(); got != 50 {
		t.Fatalf("capacity %v, want 50", got)
	}
	if got := admit(t, r, 100); got != 50 {
		t.Fatalf("admitted %d, want the burst of 50", got)
	}
}

// Bad options are refused, naming what is wrong.
func TestBadOptions(t *testing.T) {
	clk := clock.NewManual(t0)
	c := newOffline(t, clk)
	for _, tc := range []struct {
		id string
		o  Options
	}{
		{"", Options{}},
		{"x", Options{Wants: -1}},
		{"x", Options{Wants: math.NaN()}},
		{"x", Options{Mode: "hopeful"}},
		{"x", Options{SafeCapacity: math.Inf(1)}},
	} {
		if _, err := c.Resource(tc.id, tc.o); err == nil {
			t.Errorf("Resource(%q, %+v): no error", tc.id, tc.o)
		}
	}
	if _, err := c.Resource("dup", Options{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Resource("dup", Options{}); err == nil {
		t.Error("a resource added twice: no error")
	}
	r, _ := c.Resource("w", Options{})
	if err := r.SetWants(math.Inf(1)); err == nil {
		t.Error("SetWants(+Inf): no error")
	}
	if _, err := New(ClientOptions{}); err == nil {
		t.Error("New without addresses: no error")
	}
	if _, err := New(ClientOptions{Addrs: []string{"a:1"}, Jitter: 0.9}); err == nil {
		t.Error("New with jitter 0.9: no error")
	}
}

// Allow while the leases change under it, concurrently (run with -race):
// never more admitted than the buckets allowed. Time moves in steps; the
// bound is the first bucket, plus each step's refill at its rate, plus
// what each shrink forgave (the engine clamps what was consumed to the
// smaller bucket).
func TestAllowWhileLeasesChange(t *testing.T) {
	clk := clock.NewManual(t0)
	c := newOffline(t, clk)
	r, err := c.Resource("race", Options{Wants: 100, Mode: Pessimistic})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	capa := 50.0
	setLease(r, mkLease(capa, clk, time.Hour))
	bound := capa
	var admitted atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if d, err := r.Allow(context.Background()); err == nil && d.Allowed {
					admitted.Add(1)
				}
				_ = r.Capacity()
			}
		})
	}
	const step = 50 * time.Millisecond
	for range 200 {
		next := float64(10 + rng.IntN(190))
		if next < capa {
			bound += capa - next // the shrink's forgiveness
		}
		setLease(r, mkLease(next, clk, time.Hour))
		capa = next
		clk.Advance(step)
		bound += capa * step.Seconds()
	}
	close(stop)
	wg.Wait()
	if got := float64(admitted.Load()); got > math.Ceil(bound) {
		t.Fatalf("admitted %v, more than the buckets allowed (%v)", got, math.Ceil(bound))
	}
	if admitted.Load() == 0 {
		t.Fatal("admitted nothing")
	}
}

// Wait at capacity 0 blocks until a lease brings capacity, then takes one
// unit of it; a context that ends first consumes nothing.
func TestWaitForCapacity(t *testing.T) {
	clk := clock.NewManual(t0)
	c := newOffline(t, clk)
	r, err := c.Resource("wait", Options{Wants: 10, Mode: Pessimistic})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := r.Wait(ctx); err == nil {
		t.Fatal("Wait at capacity 0 with an ended context: no error")
	}
	done := make(chan error, 1)
	go func() { done <- r.Wait(context.Background()) }()
	select {
	case err := <-done:
		t.Fatalf("Wait at capacity 0 returned %v before any lease", err)
	default:
	}
	setLease(r, mkLease(10, clk, time.Minute))
	if err := waitDone(t, done); err != nil {
		t.Fatal(err)
	}
	if got := admit(t, r, 20); got != 9 {
		t.Fatalf("after one Wait: admitted %d of the burst of 10, want 9", got)
	}

	// A lease of 0 until its expiry: Wait sleeps on the clock until then,
	// and optimistic mode's wants after it.
	r2, err := c.Resource("wait0", Options{Wants: 5, Mode: Optimistic})
	if err != nil {
		t.Fatal(err)
	}
	setLease(r2, mkLease(0, clk, time.Minute))
	go func() { done <- r2.Wait(context.Background()) }()
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	if err := clk.WaitForSleepers(wctx, 2); err != nil { // the refresh loop and Wait
		t.Fatal(err)
	}
	clk.Advance(time.Minute)
	if err := waitDone(t, done); err != nil {
		t.Fatal(err)
	}
	if got := r2.Capacity(); got != 5 {
		t.Fatalf("after the lease of 0 expired: capacity %v, want 5 (optimistic)", got)
	}
}

// waitDone returns what a Wait sent on done, failing after 10s.
func waitDone(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not return 10s after the capacity came")
		return nil
	}
}

package grpclimit_test

import (
	"context"
	"io"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/gate"
	"github.com/floodgate/floodgate/grpclimit"
	"github.com/floodgate/floodgate/memstore"
	"github.com/floodgate/floodgate/throttle"
)

// delayRig is a Throttle with ThrottleOptions.Limiter over the health
// service on real gRPC (a loopback listener), the quota a limit whose
// action is gate.Delay: one call an hour per x-user (a bucket of one:
// the first passes, the next waits an hour, the one after two; up to 10
// hours), on a memstore the test reads and a manual clock. Service
// "hold" blocks until release is called.
type delayRig struct {
	th      *throttle.Throttler
	clk     *clock.Manual
	conn    *grpc.ClientConn
	peek    func(user string) floodgate.Decision // the user's bucket, from the store
	release func()
	mu      sync.Mutex
	served  map[string]int // by user
}

func newDelayRig(t *testing.T, tc throttle.Config) *delayRig {
	t.Helper()
	st, err := memstore.New(memstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	clk := clock.NewManual(time.Unix(1_800_000_000, 0))
	pol := floodgate.MustPolicy("slow", floodgate.Rule{Algorithm: floodgate.TokenBucket, Limit: 1, Period: time.Hour})
	lim, err := grpclimit.New(grpclimit.Options{Config: gate.Config{Store: st, Clock: clk, Limits: []gate.Limit{{
		Name: "slow", Policy: pol, Key: []gate.Part{gate.Header("x-user")}, Action: gate.Delay, MaxDelay: 10 * time.Hour,
	}}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lim.Close)
	r := &delayRig{th: throttle.New(tc), clk: clk, served: map[string]int{}}
	hold := make(chan struct{})
	var once sync.Once
	r.release = func() { once.Do(func() { close(hold) }) }
	h := &ctlHealth{check: func(ctx context.Context, svc string) error {
		md, _ := metadata.FromIncomingContext(ctx)
		r.mu.Lock()
		r.served[md.Get("x-user")[0]]++
		r.mu.Unlock()
		if svc == "hold" {
			<-hold
		}
		return nil
	}}
	r.conn = dialTo(t, serveThrottledWith(t, grpclimit.ThrottleOptions{Throttler: r.th, Limiter: lim}, h))
	t.Cleanup(r.release) // a failed test's held calls, before the server stops
	peeker := floodgate.NewLimiter(pol, st, floodgate.WithClock(clk))
	r.peek = func(user string) floodgate.Decision {
		d, err := peeker.PeekN(context.Background(), user, 0)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	return r
}

// call makes a call of svc as user, unary or streaming, in the
// background: its trailer and error on the channel.
func (r *delayRig) call(ctx context.Context, user, svc string, stream bool) chan callResult {
	ch := make(chan callResult, 1)
	go func() {
		ctx := metadata.AppendToOutgoingContext(ctx, "x-user", user)
		cl := healthpb.NewHealthClient(r.conn)
		var tr metadata.MD
		if !stream {
			_, err := cl.Check(ctx, &healthpb.HealthCheckRequest{Service: svc}, grpc.Trailer(&tr))
			ch <- callResult{tr, err}
			return
		}
		st, err := cl.Watch(ctx, &healthpb.HealthCheckRequest{Service: svc})
		if err == nil {
			if _, err = st.Recv(); err == nil {
				_, end := st.Recv() // to the end: the trailer is there after it
				if end != io.EOF {
					err = end
				}
			}
			tr = st.Trailer()
		}
		ch <- callResult{tr, err}
	}()
	return ch
}

type callResult struct {
	tr  metadata.MD
	err error
}

func (r *delayRig) saw(user string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.served[user]
}

// sleepers waits until the gate's clock has n sleepers (the delays).
func sleepers(t *testing.T, clk *clock.Manual, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := clk.WaitForSleepers(ctx, n); err != nil {
		t.Fatalf("want %d calls in their delay: %d after 10 s", n, clk.Sleepers())
	}
}

// TestThrottleLimiterDelayHoldsNoSlot: with ThrottleOptions.Limiter, the
// throttler's limit at 2 and no queue, 3 calls waiting out the quota's
// delay (1, 2 and 3 hours; unary and streaming) hold no slot and no
// queued cost: all 3 reach their delay (before the change 2 held both
// slots and the third was shed at arrival), and calls of other users are
// served at once. A caller that leaves during its delay frees everything
// and its hour is given back. A delay that ends while both slots are held
// is shed: UNAVAILABLE (queue_full) with the retry-after trailer and no
// ratelimit ones, never reaching the handler, and the hour it reserved is
// given back (read in the store: it spends no quota). A delay that ends
// with a slot free is served (a stream), re-admitted, not admitted twice.
func TestThrottleLimiterDelayHoldsNoSlot(t *testing.T) {
	r := newDelayRig(t, throttle.Config{Limit: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if res := <-r.call(ctx, "u", "x", false); res.err != nil {
		t.Fatalf("the first call: %v (the bucket's one)", res.err)
	}
	shed := r.call(ctx, "u", "x", false)
	sleepers(t, r.clk, 1)
	served := r.call(ctx, "u", "x", true)
	sleepers(t, r.clk, 2)
	lctx, leave := context.WithCancel(ctx)
	defer leave()
	left := r.call(lctx, "u", "x", false)
	sleepers(t, r.clk, 3)
	if st := r.th.Stats(); st.InFlight != 0 || st.Queued != 0 || st.QueuedCost != 0 || st.Admitted != 4 || st.Suspended != 3 {
		t.Fatalf("3 calls in their delay: %+v; want nothing in flight or queued, 4 admitted, 3 suspended", st)
	}
	for _, u := range []string{"f1", "f2", "f3"} {
		if res := <-r.call(ctx, u, "x", u == "f2"); res.err != nil {
			t.Fatalf("another user's call while 3 are delayed: %v, want OK at once", res.err)
		}
	}
	if d := r.peek("u"); d.ResetAfter != 4*time.Hour {
		t.Fatalf("the bucket with 3 delays reserved: full in %v, want 4h", d.ResetAfter)
	}

	// a caller leaves during its delay
	leave()
	if res := <-left; status.Code(res.err) != codes.Canceled {
		t.Errorf("the caller that left: %v", res.err)
	}
	sleepers(t, r.clk, 2)
	waitFor(t, "the hour of the call that left given back", func() bool { return r.peek("u").ResetAfter == 3*time.Hour })
	if st := r.th.Stats(); st.InFlight != 0 || st.Queued != 0 {
		t.Errorf("after a caller left its delay: %+v", st)
	}

	// both slots held: the delay that ends is shed, its hour given back
	holds := []chan callResult{r.call(ctx, "h1", "hold", false), r.call(ctx, "h2", "hold", true)}
	waitFor(t, "both slots held", func() bool { return r.th.Stats().InFlight == 2 && r.saw("h1") == 1 && r.saw("h2") == 1 })
	refused := r.th.Stats().Refused[throttle.Critical]
	r.clk.Advance(time.Hour)
	res := <-shed
	if !shedFor(res.err, "queue_full") || len(res.tr["retry-after"]) != 1 || res.tr["retry-after"][0] != "1" || len(res.tr["ratelimit-policy"]) != 0 {
		t.Fatalf("a delay ending with both slots held: %v %v; want UNAVAILABLE (queue_full), retry-after 1, no ratelimit trailers", res.err, res.tr)
	}
	if st := r.th.Stats(); st.Refused[throttle.Critical] != refused+1 || st.InFlight != 2 || st.Queued != 0 || st.Readmitted != 0 {
		t.Errorf("after the shed delay: %+v; want one more refused, the 2 holders in flight", st)
	}
	if d := r.peek("u"); d.ResetAfter != time.Hour {
		t.Errorf("after the shed delay the bucket is full in %v, want 1h (2h: the shed call spent its hour)", d.ResetAfter)
	}
	if n := r.saw("u"); n != 1 {
		t.Errorf("the handler saw %d calls of u, want 1 (the first)", n)
	}
	r.release()
	for _, h := range holds {
		if res := <-h; res.err != nil {
			t.Fatalf("a held call: %v", res.err)
		}
	}
	waitFor(t, "the slots back", func() bool { return r.th.Stats().InFlight == 0 })

	// the next delay ends with the slots free: served
	r.clk.Advance(time.Hour)
	if res := <-served; res.err != nil {
		t.Fatalf("a delay ending with the slots free: %v, want OK", res.err)
	}
	waitFor(t, "nothing in flight", func() bool { return r.th.Stats().InFlight == 0 })
	if n := r.saw("u"); n != 2 {
		t.Errorf("the handler saw %d calls of u, want 2", n)
	}
	// admitted: the first, 3 delayed, 3 other users, 2 holders, each once
	if st := r.th.Stats(); st.Admitted != 9 || st.Suspended != 3 || st.Readmitted != 1 || st.Completions != 7 || st.Queued != 0 {
		t.Errorf("at the end: %+v; want 9 admitted, 3 suspended, 1 readmitted, 7 completions, nothing queued", st)
	}
}

// TestThrottleLimiterDelayEndsQueuedCallerLeaves: a delay that ends
// while the one slot is held waits in the throttler's queue like any
// arrival; its caller's leaving there takes it out (withdrawn, CANCELED),
// the hour its delay reserved is given back, and nothing stays queued or
// in flight; unary and streaming.
func TestThrottleLimiterDelayEndsQueuedCallerLeaves(t *testing.T) {
	for _, stream := range []bool{false, true} {
		r := newDelayRig(t, throttle.Config{Limit: 1, MaxQueueCost: time.Hour})
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if res := <-r.call(ctx, "u", "x", stream); res.err != nil {
			t.Fatal(res.err)
		}
		lctx, leave := context.WithCancel(ctx)
		left := r.call(lctx, "u", "x", stream)
		sleepers(t, r.clk, 1)
		held := r.call(ctx, "h", "hold", false)
		waitFor(t, "the slot held", func() bool { return r.th.Stats().InFlight == 1 && r.saw("h") == 1 })
		r.clk.Advance(time.Hour)
		waitFor(t, "the delayed call queued", func() bool { return r.th.Stats().Queued == 1 })
		leave()
		if res := <-left; status.Code(res.err) != codes.Canceled {
			t.Errorf("stream %v: the caller that left: %v", stream, res.err)
		}
		waitFor(t, "the queue empty", func() bool { return r.th.Stats().Queued == 0 })
		waitFor(t, "the hour given back", func() bool { d := r.peek("u"); return d.ResetAfter == 0 && d.Remaining == 1 })
		r.release()
		if res := <-held; res.err != nil {
			t.Fatal(res.err)
		}
		waitFor(t, "nothing in flight", func() bool { return r.th.Stats().InFlight == 0 })
		if st := r.th.Stats(); st.Withdrawn[throttle.Critical] != 1 || st.QueuedCost != 0 || st.Readmitted != 0 {
			t.Errorf("stream %v: throttler %+v; want 1 withdrawn, nothing queued", stream, st)
		}
		if n := r.saw("u"); n != 1 {
			t.Errorf("stream %v: the handler saw %d calls of u, want 1", stream, n)
		}
	}
}

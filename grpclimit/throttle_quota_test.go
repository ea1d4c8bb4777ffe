package grpclimit_test

import (
	"context"
	"fmt"
	"io"
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

// quotaRig is a Throttle with ThrottleOptions.Limiter (a quota of quota
// a minute per x-user, on a memstore and a manual clock) over the health
// service on real gRPC; service "hold" blocks until release is closed.
type quotaRig struct {
	th      *throttle.Throttler
	conn    *grpc.ClientConn
	peek    func(user string) int64 // the user's remaining quota, from the store
	release chan struct{}
	held    chan struct{}
	served  chan string
}

func newQuotaRig(t *testing.T, quota int64, tc throttle.Config) *quotaRig {
	t.Helper()
	st, err := memstore.New(memstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	clk := clock.NewManual(time.Unix(1_800_000_000, 0))
	pol := floodgate.MustPolicy("per-user", floodgate.Rule{Algorithm: floodgate.TokenBucket, Limit: quota, Period: time.Minute})
	lim, err := grpclimit.New(grpclimit.Options{Config: gate.Config{Store: st, Clock: clk, Limits: []gate.Limit{
		{Name: "per-user", Policy: pol, Key: []gate.Part{gate.Header("x-user")}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lim.Close)
	r := &quotaRig{th: throttle.New(tc), release: make(chan struct{}), held: make(chan struct{}, 1), served: make(chan string, 64)}
	h := &ctlHealth{check: func(ctx context.Context, svc string) error {
		md, _ := metadata.FromIncomingContext(ctx)
		r.served <- md.Get("x-user")[0]
		if svc == "hold" {
			r.held <- struct{}{}
			<-r.release
		}
		return nil
	}}
	r.conn = dialTo(t, serveThrottledWith(t, grpclimit.ThrottleOptions{Throttler: r.th, Limiter: lim}, h))
	t.Cleanup(func() { // a failed test's held call
		select {
		case <-r.release:
		default:
			close(r.release)
		}
	})
	peeker := floodgate.NewLimiter(pol, st, floodgate.WithClock(clk))
	r.peek = func(user string) int64 {
		d, err := peeker.PeekN(context.Background(), user, 0)
		if err != nil {
			t.Fatal(err)
		}
		return d.Remaining
	}
	return r
}

// send calls svc as user at level crit, unary or streaming, returning
// the trailer and the error.
func (r *quotaRig) send(ctx context.Context, user, svc string, crit throttle.Criticality, stream bool) (metadata.MD, error) {
	ctx = metadata.AppendToOutgoingContext(ctx, "x-user", user, "x-criticality", crit.String())
	cl := healthpb.NewHealthClient(r.conn)
	var tr metadata.MD
	if !stream {
		_, err := cl.Check(ctx, &healthpb.HealthCheckRequest{Service: svc}, grpc.Trailer(&tr))
		return tr, err
	}
	st, err := cl.Watch(ctx, &healthpb.HealthCheckRequest{Service: svc})
	if err != nil {
		return nil, err
	}
	if _, err = st.Recv(); err == nil {
		// the handler sends one message and returns: read to the end,
		// after which the trailer is there (reading it before races)
		if _, end := st.Recv(); end != io.EOF {
			return nil, fmt.Errorf("after the stream's message: %v, want EOF", end)
		}
	}
	return st.Trailer(), err
}

// TestThrottleLimiterShedSpendsNoQuota: with ThrottleOptions.Limiter,
// calls the throttler sheds — their client gone while queued, evicted
// from the queue, at a full queue; unary and streaming — are never
// decided by the quota: the user's remaining quota in the store is whole
// afterwards, none reached the handler, and exactly its 2 calls pass
// after the load. Fails with the quota before the throttler (chaining
// Limiter.Unary first).
func TestThrottleLimiterShedSpendsNoQuota(t *testing.T) {
	for _, stream := range []bool{false, true} {
		// one slot, a queue of one call (1 ms predicted before any
		// completion: a new rig for each round)
		r := newQuotaRig(t, 2, throttle.Config{Limit: 1, MaxQueueCost: time.Millisecond})
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		hold := async(func() error { _, err := r.send(ctx, "holder", "hold", throttle.Critical, false); return err })
		<-r.held
		<-r.served
		const y = "y"
		// queued, then its client leaves
		cctx, ccancel := context.WithCancel(ctx)
		left := async(func() error { _, err := r.send(cctx, y, "x", throttle.Sheddable, stream); return err })
		waitFor(t, "a call queued", func() bool { return r.th.Stats().Queued == 1 })
		ccancel()
		if err := <-left; status.Code(err) != codes.Canceled {
			t.Errorf("stream %v: left while queued: %v, want CANCELED", stream, err)
		}
		waitFor(t, "the queue empty", func() bool { return r.th.Stats().Queued == 0 })
		// queued, then evicted by another user's CRITICAL, which waits
		// for the slot at the now full queue
		evicted := async(func() error { _, err := r.send(ctx, y, "x", throttle.Sheddable, stream); return err })
		waitFor(t, "a call queued", func() bool { return r.th.Stats().Queued == 1 })
		critical := async(func() error { _, err := r.send(ctx, "z", "x", throttle.Critical, stream); return err })
		if err := <-evicted; !shedFor(err, "evicted") {
			t.Errorf("stream %v: evicted: %v, want UNAVAILABLE, evicted", stream, err)
		}
		for range 3 {
			if tr, err := r.send(ctx, y, "x", throttle.Sheddable, stream); !shedFor(err, "queue_full") || len(tr["retry-after"]) != 1 {
				t.Errorf("stream %v: at a full queue: %v %v, want UNAVAILABLE, queue_full, retry-after", stream, err, tr)
			}
		}
		if got := r.peek(y); got != 2 {
			t.Errorf("stream %v: after 5 shed calls, %d of the user's quota of 2 remain in the store", stream, got)
		}
		close(r.release)
		if err := <-hold; err != nil {
			t.Fatal(err)
		}
		if err := <-critical; err != nil {
			t.Fatalf("stream %v: the CRITICAL call: %v", stream, err)
		}
		if u := <-r.served; u != "z" || len(r.served) != 0 {
			t.Fatalf("stream %v: the handler served %q and %d more; want only z's call (no shed one)", stream, u, len(r.served))
		}
		for i, want := range []codes.Code{codes.OK, codes.OK, codes.ResourceExhausted, codes.ResourceExhausted} {
			tr, err := r.send(ctx, y, "x", throttle.Sheddable, stream)
			if status.Code(err) != want {
				t.Errorf("stream %v: after the load, call %d of the shed user: %v, want %v (its quota of 2 untouched by the 5 shed)", stream, i+1, err, want)
			}
			if len(tr["ratelimit-policy"]) != 1 {
				t.Errorf("stream %v: call %d: trailer %v, want the quota's ratelimit-policy", stream, i+1, tr)
			}
		}
		if got := r.peek(y); got != 0 {
			t.Errorf("stream %v: after 2 served, %d remain", stream, got)
		}
		if st := r.th.Stats(); st.InFlight != 0 || st.Queued != 0 {
			t.Errorf("stream %v: after: %+v", stream, st)
		}
	}
}

// TestThrottleLimiterRefusalReleasesSlot: with ThrottleOptions.Limiter,
// a call the quota refuses (RESOURCE_EXHAUSTED) gives its throttler slot
// back at once, without a completion: with one slot and no queue, ten
// refused calls in a row, unary and streaming, each find the slot free
// (none is shed UNAVAILABLE), another user's call is then admitted, and
// only the calls that ran count completions.
func TestThrottleLimiterRefusalReleasesSlot(t *testing.T) {
	r := newQuotaRig(t, 1, throttle.Config{Limit: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := r.send(ctx, "y", "x", throttle.Critical, false); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		tr, err := r.send(ctx, "y", "x", throttle.Critical, i%2 == 1)
		if status.Code(err) != codes.ResourceExhausted || len(tr["retry-after"]) != 1 {
			t.Fatalf("refused call %d (stream %v): %v %v; want RESOURCE_EXHAUSTED with retry-after (UNAVAILABLE: a refused call held the slot)", i+1, i%2 == 1, err, tr)
		}
		if st := r.th.Stats(); st.InFlight != 0 {
			t.Fatalf("after refused call %d: %d in flight", i+1, st.InFlight)
		}
	}
	for _, stream := range []bool{false, true} {
		if _, err := r.send(ctx, "w"+map[bool]string{false: "u", true: "s"}[stream], "x", throttle.Sheddable, stream); err != nil {
			t.Fatalf("another user (stream %v): %v", stream, err)
		}
	}
	st := r.th.Stats()
	if st.Admitted != 13 || st.Completions != 3 || st.InFlight != 0 || st.Refused != [4]uint64{} {
		t.Errorf("throttler %+v; want 13 admitted, 3 completions (the refused 10 none), nothing in flight or shed", st)
	}
	if n := len(r.served); n != 3 {
		t.Errorf("%d calls reached the handler, want 3", n)
	}
}

// A Limiter not made by New is refused with an error, never a panic.
func TestNewThrottleZeroLimiter(t *testing.T) {
	_, err := grpclimit.NewThrottle(grpclimit.ThrottleOptions{Throttler: throttle.New(throttle.Config{}), Limiter: &grpclimit.Limiter{}})
	if err == nil || err.Error() != "grpclimit: ThrottleOptions.Limiter was not made by grpclimit.New" {
		t.Fatalf("err %v", err)
	}
}

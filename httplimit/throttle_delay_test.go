package httplimit_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/gate"
	"github.com/floodgate/floodgate/httplimit"
	"github.com/floodgate/floodgate/memstore"
	"github.com/floodgate/floodgate/throttle"
)

// delayRig is Throttled over real HTTP (httptest), a gate on a manual
// clock whose limit "slow" delays requests under /slow/ at one an hour
// per X-User (a bucket of one: the first passes, the next waits an hour,
// the one after two; up to 10 hours), on a memstore the test reads. The
// handler holds /held until release is closed.
type delayRig struct {
	th      *throttle.Throttler
	clk     *clock.Manual
	url     string
	peek    func(user string) floodgate.Decision // the user's bucket, from the store
	release func()
	base    context.Context // every request's: ends when the test does
	mu      sync.Mutex
	served  []string // the paths the handler saw, with their X-User
}

func newDelayRig(t *testing.T, tc throttle.Config) *delayRig {
	t.Helper()
	st, err := memstore.New(memstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	clk := clock.NewManual(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	pol := floodgate.MustPolicy("slow", floodgate.Rule{Algorithm: floodgate.TokenBucket, Limit: 1, Period: time.Hour})
	mw, err := httplimit.New(httplimit.Options{Config: gate.Config{Store: st, Clock: clk, Limits: []gate.Limit{{
		Name: "slow", Policy: pol, Key: []gate.Part{gate.Header("X-User")},
		Match: gate.Match{PathPrefix: "/slow/"}, Action: gate.Delay, MaxDelay: 10 * time.Hour,
	}}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(mw.Close)
	r := &delayRig{th: throttle.New(tc), clk: clk}
	hold := make(chan struct{})
	var once sync.Once
	r.release = func() { once.Do(func() { close(hold) }) }
	srv := httptest.NewServer(mw.Throttled(r.th, throttle.MiddlewareOptions{})(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.served = append(r.served, req.URL.Path+" "+req.Header.Get("X-User"))
		r.mu.Unlock()
		if req.URL.Path == "/held" {
			<-hold
		}
		io.WriteString(w, "ok") //nolint:errcheck
	})))
	t.Cleanup(srv.Close)
	t.Cleanup(r.release) // before srv.Close
	// a failed test's requests leave (their delays on the manual clock
	// would hold srv.Close forever), before srv.Close
	var leave context.CancelFunc
	r.base, leave = context.WithCancel(context.Background())
	t.Cleanup(leave)
	r.url = srv.URL
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

// reply is one response: its status (-1: none, the request failed) and
// its Retry-After and RateLimit fields.
type reply struct {
	status           int
	retry, rateLimit string
}

// send sends GET path as user, answering on the channel.
func (r *delayRig) send(ctx context.Context, path, user string) chan reply {
	ch := make(chan reply, 1)
	ctx, stop := context.WithCancel(ctx)
	context.AfterFunc(r.base, stop)
	go func() {
		defer stop()
		req, _ := http.NewRequestWithContext(ctx, "GET", r.url+path, nil)
		req.Header.Set("X-User", user)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			ch <- reply{status: -1}
			return
		}
		io.Copy(io.Discard, resp.Body) //nolint:errcheck
		resp.Body.Close()
		ch <- reply{resp.StatusCode, resp.Header.Get("Retry-After"), resp.Header.Get("RateLimit")}
	}()
	return ch
}

func (r *delayRig) get(t *testing.T, path, user string) int {
	t.Helper()
	return (<-r.send(context.Background(), path, user)).status
}

func (r *delayRig) saw(path, user string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, s := range r.served {
		if s == path+" "+user {
			n++
		}
	}
	return n
}

// sleepers waits until the gate's clock has n sleepers (the delays).
func sleepers(t *testing.T, clk *clock.Manual, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := clk.WaitForSleepers(ctx, n); err != nil {
		t.Fatalf("want %d requests in their delay: %d after 10 s", n, clk.Sleepers())
	}
}

// TestThrottledDelayHoldsNoSlot: with the throttler's limit at 1 and no
// queue, 3 requests waiting out the gate's delay (a bucket of one an
// hour: they wait 1, 2 and 3 hours) hold no slot and no queued cost: all
// 3 reach their delay (before the change only the first did: it held the
// one slot and the others were shed at arrival), and a request of
// another route is served at once, 3 times. A client that leaves during
// its delay frees everything and its hour is given back. A delay that
// ends while the slot is held is shed: 503 with Retry-After and no
// RateLimit fields, never reaching the handler, and the hour it reserved
// is given back (read in the store: it spends no quota). A delay that
// ends with the slot free is served, re-admitted, not admitted twice.
func TestThrottledDelayHoldsNoSlot(t *testing.T) {
	r := newDelayRig(t, throttle.Config{Limit: 1})
	if st := r.get(t, "/slow/a", "u"); st != 200 {
		t.Fatalf("the first request: %d, want 200 (the bucket's one)", st)
	}
	ctx, leave := context.WithCancel(context.Background())
	defer leave()
	shed := r.send(context.Background(), "/slow/1", "u")
	sleepers(t, r.clk, 1)
	served := r.send(context.Background(), "/slow/2", "u")
	sleepers(t, r.clk, 2)
	left := r.send(ctx, "/slow/3", "u")
	sleepers(t, r.clk, 3)
	if st := r.th.Stats(); st.InFlight != 0 || st.Queued != 0 || st.QueuedCost != 0 || st.Admitted != 4 || st.Suspended != 3 {
		t.Fatalf("3 requests in their delay: %+v; want nothing in flight or queued, 4 admitted, 3 suspended", st)
	}
	for i := range 3 {
		if st := r.get(t, "/free", "other"); st != 200 {
			t.Fatalf("a request of another route while 3 are delayed, try %d: %d, want 200 at once", i+1, st)
		}
	}
	if d := r.peek("u"); d.ResetAfter != 4*time.Hour {
		t.Fatalf("the bucket with 3 delays reserved: full in %v, want 4h", d.ResetAfter)
	}

	// a client leaves during its delay
	leave()
	if rp := <-left; rp.status != -1 {
		t.Errorf("the client that left read %+v", rp)
	}
	sleepers(t, r.clk, 2)
	// the refund follows the sleep's end
	waitFor(t, func() bool { return r.peek("u").ResetAfter == 3*time.Hour }) // its hour given back
	if st := r.th.Stats(); st.InFlight != 0 || st.Queued != 0 {
		t.Errorf("after a client left its delay: %+v", st)
	}

	// the slot held: the delay that ends is shed, its hour given back
	held := r.send(context.Background(), "/held", "holder")
	waitFor(t, func() bool { return r.th.Stats().InFlight == 1 && r.saw("/held", "holder") == 1 })
	refused := r.th.Stats().Refused[throttle.Critical]
	r.clk.Advance(time.Hour)
	if rp := <-shed; rp.status != 503 || rp.retry != "1" || rp.rateLimit != "" {
		t.Fatalf("a delay ending with the slot held: %+v, want 503, Retry-After 1, no RateLimit", rp)
	}
	if st := r.th.Stats(); st.Refused[throttle.Critical] != refused+1 || st.InFlight != 1 || st.Queued != 0 || st.Readmitted != 0 {
		t.Errorf("after the shed delay: %+v; want one more refused, only the holder in flight", st)
	}
	if r.saw("/slow/1", "u") != 0 {
		t.Error("the handler saw the shed request")
	}
	if d := r.peek("u"); d.ResetAfter != time.Hour {
		t.Errorf("after the shed delay the bucket is full in %v, want 1h (2h: the shed request spent its hour)", d.ResetAfter)
	}
	r.release()
	if rp := <-held; rp.status != 200 {
		t.Fatalf("the held request: %+v", rp)
	}
	waitFor(t, func() bool { return r.th.Stats().InFlight == 0 })

	// the next delay ends with the slot free: served
	r.clk.Advance(time.Hour)
	if rp := <-served; rp.status != 200 {
		t.Fatalf("a delay ending with the slot free: %+v, want 200", rp)
	}
	if r.saw("/slow/2", "u") != 1 {
		t.Error("the handler did not see the delayed request served")
	}
	waitFor(t, func() bool { return r.th.Stats().InFlight == 0 })
	// admitted: the first, 3 delayed, 3 free, the holder, each once
	if st := r.th.Stats(); st.Admitted != 8 || st.Suspended != 3 || st.Readmitted != 1 || st.Completions != 6 || st.Queued != 0 {
		t.Errorf("at the end: %+v; want 8 admitted, 3 suspended, 1 readmitted, 6 completions, nothing queued", st)
	}
}

// TestThrottledDelayEndsQueuedClientLeaves: a delay that ends while the
// one slot is held waits in the throttler's queue like any arrival
// (holding queued cost only then); its client's leaving there takes it
// out (withdrawn), the hour its delay reserved is given back, and
// nothing stays queued or in flight.
func TestThrottledDelayEndsQueuedClientLeaves(t *testing.T) {
	r := newDelayRig(t, throttle.Config{Limit: 1, MaxQueueCost: time.Hour})
	if st := r.get(t, "/slow/a", "u"); st != 200 {
		t.Fatalf("the first request: %d", st)
	}
	ctx, leave := context.WithCancel(context.Background())
	defer leave()
	left := r.send(ctx, "/slow/1", "u")
	sleepers(t, r.clk, 1)
	if st := r.th.Stats(); st.InFlight != 0 || st.Queued != 0 || st.QueuedCost != 0 {
		t.Fatalf("in its delay: %+v", st)
	}
	held := r.send(context.Background(), "/held", "holder")
	waitFor(t, func() bool { return r.th.Stats().InFlight == 1 && r.saw("/held", "holder") == 1 })
	r.clk.Advance(time.Hour)
	waitFor(t, func() bool { return r.th.Stats().Queued == 1 })
	leave()
	if rp := <-left; rp.status != -1 {
		t.Errorf("the client that left read %+v", rp)
	}
	waitFor(t, func() bool { return r.th.Stats().Queued == 0 })
	// the refund follows the withdrawal: the bucket full, its hour given back
	waitFor(t, func() bool { d := r.peek("u"); return d.ResetAfter == 0 && d.Remaining == 1 })
	r.release()
	<-held
	waitFor(t, func() bool { return r.th.Stats().InFlight == 0 })
	if st := r.th.Stats(); st.Withdrawn[throttle.Critical] != 1 || st.Queued != 0 || st.QueuedCost != 0 || st.Readmitted != 0 {
		t.Errorf("throttler: %+v; want 1 withdrawn, nothing queued", st)
	}
	if r.saw("/slow/1", "u") != 0 {
		t.Error("the handler saw the request whose client left")
	}
}

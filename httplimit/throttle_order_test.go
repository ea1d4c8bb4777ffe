package httplimit_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/gate"
	"github.com/floodgate/floodgate/httplimit"
	"github.com/floodgate/floodgate/throttle"
)

// throttledRig is a Throttled middleware over a per-IP quota of quota a
// minute, whose handler holds each request until release is closed
// (held) or returns at once.
type throttledRig struct {
	th      *throttle.Throttler
	h       http.Handler
	release chan struct{}
	started chan string
	served  atomic.Int64
}

func newThrottledRig(t *testing.T, quota int64, tc throttle.Config) *throttledRig {
	t.Helper()
	perIP := floodgate.MustPolicy("per-ip", floodgate.Rule{Algorithm: floodgate.TokenBucket, Limit: quota, Period: time.Minute})
	mw, err := httplimit.New(httplimit.Options{Config: gate.Config{
		Limits: []gate.Limit{{Name: "per-ip", Policy: perIP, Key: []gate.Part{gate.IP()}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(mw.Close)
	r := &throttledRig{th: throttle.New(tc), release: make(chan struct{}), started: make(chan string, 64)}
	r.h = mw.Throttled(r.th, throttle.MiddlewareOptions{})(http.HandlerFunc(func(_ http.ResponseWriter, req *http.Request) {
		r.served.Add(1)
		if req.URL.Path == "/held" {
			r.started <- req.RemoteAddr
			<-r.release
		}
	}))
	return r
}

func (r *throttledRig) send(ctx context.Context, ip, path, crit string) int {
	req := httptest.NewRequest("GET", path, nil).WithContext(ctx)
	req.RemoteAddr = ip + ":1234"
	if crit != "" {
		req.Header.Set("X-Criticality", crit)
	}
	rec := httptest.NewRecorder()
	r.h.ServeHTTP(rec, req)
	return rec.Code
}

// TestThrottledShedSpendsNoQuota: requests the throttler sheds — at a
// full queue, evicted from it, or whose client left while queued — are
// never decided by the gate, so the client's quota is whole afterwards:
// exactly its 2 a minute pass, and the third is 429. Fails with the gate
// before the throttler (the shed requests spend the 2).
func TestThrottledShedSpendsNoQuota(t *testing.T) {
	// one slot; a queue of one request (1 ms predicted before any completion)
	r := newThrottledRig(t, 2, throttle.Config{Limit: 1, MaxQueueCost: time.Millisecond})
	var wg sync.WaitGroup
	wg.Go(func() { r.send(context.Background(), "192.0.2.1", "/held", "") })
	<-r.started
	const y = "192.0.2.9"
	// queued, then its client leaves
	ctx, cancel := context.WithCancel(context.Background())
	left := make(chan int, 1)
	go func() { left <- r.send(ctx, y, "/x", "SHEDDABLE") }()
	waitFor(t, func() bool { return r.th.Stats().Queued == 1 })
	cancel()
	if c := <-left; c != 503 {
		t.Errorf("left while queued: %d, want 503", c)
	}
	// queued, then evicted by a CRITICAL request of another client
	evicted := make(chan int, 1)
	go func() { evicted <- r.send(context.Background(), y, "/x", "SHEDDABLE") }()
	waitFor(t, func() bool { return r.th.Stats().Queued == 1 })
	critical := make(chan int, 1)
	go func() { critical <- r.send(context.Background(), "192.0.2.2", "/x", "CRITICAL") }()
	if c := <-evicted; c != 503 {
		t.Errorf("evicted: %d, want 503", c)
	}
	// at the full queue, shed at once
	for range 5 {
		if c := r.send(context.Background(), y, "/x", "SHEDDABLE"); c != 503 {
			t.Errorf("at a full queue: %d, want 503", c)
		}
	}
	close(r.release)
	wg.Wait()
	if c := <-critical; c != 200 {
		t.Errorf("the CRITICAL request: %d, want 200", c)
	}
	for i, want := range []int{200, 200, 429, 429} {
		if c := r.send(context.Background(), y, "/x", ""); c != want {
			t.Errorf("after the load, request %d of the shed client: %d, want %d (its quota of 2 untouched by the 7 shed)", i+1, c, want)
		}
	}
	if st := r.th.Stats(); st.InFlight != 0 || st.Queued != 0 {
		t.Errorf("after: %+v", st)
	}
}

// TestThrottledNeverPastQuota: 40 concurrent requests of one client with
// a quota of 5 through a throttler of 4 slots and a deep queue: exactly 5
// reach the handler, the other 35 are 429 (none shed), and the refused
// ones count no completion. Admission first must not let a request past
// its quota because it waited in the queue.
func TestThrottledNeverPastQuota(t *testing.T) {
	r := newThrottledRig(t, 5, throttle.Config{Limit: 4, MaxQueueCost: time.Hour})
	var wg sync.WaitGroup
	codes := make(chan int, 40)
	for range 40 {
		wg.Go(func() { codes <- r.send(context.Background(), "192.0.2.7", "/x", "") })
	}
	wg.Wait()
	close(codes)
	n := map[int]int{}
	for c := range codes {
		n[c]++
	}
	if n[200] != 5 || n[429] != 35 || r.served.Load() != 5 {
		t.Errorf("answers %v, served %d; want 5 × 200 and 35 × 429, 5 served", n, r.served.Load())
	}
	if st := r.th.Stats(); st.InFlight != 0 || st.Queued != 0 || st.Completions != 5 || st.Admitted != 40 {
		t.Errorf("throttler after: %+v; want 40 admitted, 5 completions, nothing in flight", st)
	}
}

// TestThrottledRouteCriticality: a limit's criticality is the ceiling of
// what its requests claim: an untrusted client claiming CRITICAL_PLUS on
// a SHEDDABLE route runs as SHEDDABLE, and on a route with no level as
// CRITICAL (the default); a lower claim is kept; a trusted proxy's claim
// is taken as it is; no claim is the route's level.
func TestThrottledRouteCriticality(t *testing.T) {
	pol := floodgate.MustPolicy("big", floodgate.Rule{Algorithm: floodgate.TokenBucket, Limit: 1000, Period: time.Second})
	mw, err := httplimit.New(httplimit.Options{Config: gate.Config{
		ClientIP: gate.ClientIP{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}},
		Limits: []gate.Limit{
			{Name: "batch", Policy: pol, Match: gate.Match{PathPrefix: "/batch/"}, Criticality: "sheddable"},
			{Name: "rest", Policy: pol},
		},
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer mw.Close()
	th := throttle.New(throttle.Config{Limit: 8})
	var got throttle.Criticality
	h := mw.Throttled(th, throttle.MiddlewareOptions{})(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		got, _ = throttle.FromContext(r.Context())
	}))
	for _, c := range []struct {
		peer, path, claim string
		want              throttle.Criticality
	}{
		{"192.0.2.1", "/batch/x", "CRITICAL_PLUS", throttle.Sheddable},
		{"192.0.2.1", "/batch/x", "", throttle.Sheddable},
		{"192.0.2.1", "/other", "CRITICAL_PLUS", throttle.Critical},
		{"192.0.2.1", "/other", "sheddable_plus", throttle.SheddablePlus},
		{"192.0.2.1", "/other", "nonsense", throttle.Critical},
		{"10.1.2.3", "/batch/x", "CRITICAL_PLUS", throttle.CriticalPlus},
		{"10.1.2.3", "/batch/x", "", throttle.Sheddable},
	} {
		req := httptest.NewRequest("GET", c.path, nil)
		req.RemoteAddr = c.peer + ":1"
		if c.claim != "" {
			req.Header.Set("X-Criticality", c.claim)
		}
		got = 255
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != 200 || got != c.want {
			t.Errorf("%s %s claiming %q: %d, level %v; want %v", c.peer, c.path, c.claim, rec.Code, got, c.want)
		}
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for range 2000 {
		if cond() {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("condition not met in 10 s")
}

// TestThrottledTrustedAndCeiling: MiddlewareOptions.Ceiling is the
// ceiling of a request no limit gives a level (a limit's criticality
// wins where it sets one); MiddlewareOptions.Trusted trusts a source as
// the gate's trusted proxies are trusted; the handler sees the level it
// runs at in its context and in X-Criticality, never the raw claim.
func TestThrottledTrustedAndCeiling(t *testing.T) {
	pol := floodgate.MustPolicy("big", floodgate.Rule{Algorithm: floodgate.TokenBucket, Limit: 1000, Period: time.Second})
	mw, err := httplimit.New(httplimit.Options{Config: gate.Config{
		Limits: []gate.Limit{
			{Name: "batch", Policy: pol, Match: gate.Match{PathPrefix: "/batch/"}, Criticality: "SHEDDABLE"},
			{Name: "rest", Policy: pol},
		},
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer mw.Close()
	th := throttle.New(throttle.Config{Limit: 8})
	var got throttle.Criticality
	var header []string
	h := mw.Throttled(th, throttle.MiddlewareOptions{
		Ceiling: func(*http.Request) throttle.Criticality { return throttle.SheddablePlus },
		Trusted: func(r *http.Request) bool { return strings.HasPrefix(r.RemoteAddr, "198.51.100.") },
	})(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		got, _ = throttle.FromContext(r.Context())
		header = r.Header["X-Criticality"]
	}))
	for _, c := range []struct {
		peer, path, claim string
		want              throttle.Criticality
	}{
		{"192.0.2.1", "/other", "CRITICAL_PLUS", throttle.SheddablePlus},
		{"192.0.2.1", "/other", "CRITICAL", throttle.SheddablePlus},
		{"192.0.2.1", "/other", "", throttle.SheddablePlus},
		{"192.0.2.1", "/other", "junk", throttle.SheddablePlus},
		{"192.0.2.1", "/other", "SHEDDABLE", throttle.Sheddable},
		{"192.0.2.1", "/batch/x", "CRITICAL_PLUS", throttle.Sheddable}, // the limit's level wins
		{"198.51.100.7", "/other", "CRITICAL_PLUS", throttle.CriticalPlus},
		{"198.51.100.7", "/batch/x", "CRITICAL", throttle.Critical},
		{"198.51.100.7", "/other", "", throttle.SheddablePlus},
	} {
		req := httptest.NewRequest("GET", c.path, nil)
		req.RemoteAddr = c.peer + ":1"
		if c.claim != "" {
			req.Header.Set("X-Criticality", c.claim)
		}
		got, header = 255, nil
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != 200 || got != c.want {
			t.Errorf("%s %s claiming %q: %d, level %v; want %v", c.peer, c.path, c.claim, rec.Code, got, c.want)
		}
		if c.claim != "" && (len(header) != 1 || header[0] != c.want.String()) {
			t.Errorf("%s %s claiming %q: the handler saw X-Criticality %q, want %q", c.peer, c.path, c.claim, header, c.want)
		}
		if c.claim != "" && req.Header.Get("X-Criticality") != c.claim {
			t.Errorf("the caller's request was changed: %q", req.Header.Get("X-Criticality"))
		}
	}
}

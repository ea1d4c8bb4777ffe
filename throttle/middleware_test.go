package throttle

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestMiddlewareSheds503(t *testing.T) {
	th := New(Config{Limit: 1, MaxQueueCost: 0}) // no queue: the second request is refused
	release := make(chan struct{})
	started := make(chan struct{})
	h := th.Middleware(MiddlewareOptions{RetryAfter: 1500 * time.Millisecond})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-release
	}))
	var wg sync.WaitGroup
	wg.Go(func() { h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil)) })
	<-started
	for _, accept := range []string{"application/problem+json", "text/html, application/problem+json;q=0.5", "application/problem+json;q=0", ""} {
		req := httptest.NewRequest("GET", "/", nil)
		req.Header.Set("Accept", accept)
		req.Header.Set("X-Criticality", "sheddable")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != 503 || rec.Header().Get("Retry-After") != "2" || rec.Header().Get("Cache-Control") != "no-store" {
			t.Fatalf("Accept %q: %d %v", accept, rec.Code, rec.Header())
		}
		problem := strings.Contains(accept, "problem+json") && !strings.HasSuffix(accept, "q=0")
		if ct := rec.Header().Get("Content-Type"); (ct == "application/problem+json") != problem {
			t.Errorf("Accept %q: Content-Type %q", accept, ct)
		}
		if problem {
			var p struct {
				Status      int
				Reason      string
				Criticality string
				RetryAfter  int `json:"retry_after"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil || p.Status != 503 || p.Reason != "queue_full" || p.Criticality != "SHEDDABLE" || p.RetryAfter != 2 {
				t.Errorf("problem body %q: %+v %v", rec.Body, p, err)
			}
		}
	}
	close(release)
	wg.Wait()
	if st := th.Stats(); st.InFlight != 0 || st.Refused[Sheddable] != 4 {
		t.Errorf("stats %+v", st)
	}
}

// The level read from the header is in the handler's context: an
// untrusted CRITICAL_PLUS capped at the default ceiling, a hostile header
// the default (both put in the context, as the request had the header),
// none nothing; the route pattern keys the cost model.
func TestMiddlewareContextAndKey(t *testing.T) {
	th := New(Config{Limit: 4, MaxQueueCost: time.Second})
	var got []Criticality
	var set []bool
	mux := http.NewServeMux()
	mux.HandleFunc("GET /items/{id}", func(w http.ResponseWriter, r *http.Request) {
		c, ok := FromContext(r.Context())
		got, set = append(got, c), append(set, ok)
	})
	h := th.Middleware(MiddlewareOptions{Mux: mux})(mux)
	for _, v := range []string{"CRITICAL_PLUS", "\x00\xffjunk", ""} {
		req := httptest.NewRequest("GET", "/items/7", nil)
		if v != "" {
			req.Header.Set("X-Criticality", v)
		}
		h.ServeHTTP(httptest.NewRecorder(), req)
	}
	if got[0] != Critical || !set[0] || got[1] != Critical || !set[1] || got[2] != Critical || set[2] {
		t.Errorf("levels %v set %v", got, set)
	}
	th.mu.Lock()
	_, ok := th.model.routes[RouteKey{"GET", "GET /items/{id}"}]
	n := len(th.model.routes)
	th.mu.Unlock()
	if !ok || n != 1 {
		t.Errorf("the route pattern did not key the model (%d routes)", n)
	}
}

// A handler that panics gives its slot back.
func TestMiddlewarePanicReleases(t *testing.T) {
	th := New(Config{Limit: 1})
	h := th.Middleware(MiddlewareOptions{})(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic(http.ErrAbortHandler) }))
	func() {
		defer func() { _ = recover() }()
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
	}()
	if st := th.Stats(); st.InFlight != 0 {
		t.Fatalf("in flight %d after a panic", st.InFlight)
	}
}

// A queued request whose client deadline passes is answered 503 and its
// handler never runs.
func TestMiddlewareQueuedDeadline(t *testing.T) {
	th := New(Config{Limit: 1, MaxQueueCost: time.Second})
	release, started := make(chan struct{}), make(chan struct{}, 1)
	var runs int
	h := th.Middleware(MiddlewareOptions{})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs++
		started <- struct{}{}
		<-release
	}))
	var wg sync.WaitGroup
	wg.Go(func() { h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil)) })
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil).WithContext(ctx))
	close(release)
	wg.Wait()
	if rec.Code != 503 || runs != 1 {
		t.Fatalf("code %d, handler runs %d", rec.Code, runs)
	}
}

// ThreadCPU measures what the handler burns, not how long it waits: a
// handler that sleeps 30 ms is predicted cheap, one that spins 30 ms of
// CPU about 30 ms. (Timing is the subject here; the bounds are loose.)
func TestThreadCPUMeasures(t *testing.T) {
	if !threadCPUSupported {
		t.Skip("no per-thread CPU time on this system")
	}
	th := New(Config{Limit: 8, Cost: CostConfig{Weight: 1}})
	mux := http.NewServeMux()
	mux.HandleFunc("GET /sleep", func(http.ResponseWriter, *http.Request) { time.Sleep(30 * time.Millisecond) })
	mux.HandleFunc("GET /spin", func(http.ResponseWriter, *http.Request) { spin(30 * time.Millisecond) })
	h := th.Middleware(MiddlewareOptions{ThreadCPU: true, Mux: mux})(mux)
	for _, p := range []string{"/sleep", "/spin"} {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", p, nil))
	}
	sleep, spun := th.Predict(RouteKey{"GET", "GET /sleep"}), th.Predict(RouteKey{"GET", "GET /spin"})
	t.Logf("sleep: %v, spin: %v", sleep, spun)
	if sleep > 5*time.Millisecond || spun < 10*time.Millisecond || spun > 100*time.Millisecond {
		t.Errorf("sleep measured %v, spin %v", sleep, spun)
	}
}

// spin burns CPU until its thread has used d (so a busy host stretches
// the wall time, not the work).
func spin(d time.Duration) {
	start, _ := threadCPU()
	for x := 0; ; x++ {
		if x%1000 == 0 {
			if now, _ := threadCPU(); now-start >= d {
				return
			}
		}
	}
}

// Many clients through the middleware at once, with a small queue so
// that requests are admitted, queued, evicted, expired and canceled, on
// pooled tickets (run with -race): every request gets 200 or 503, the
// handler never runs more than the limit at once, and the throttler ends
// empty.
func TestMiddlewareConcurrent(t *testing.T) {
	const limit = 3
	th := New(Config{Limit: limit, MaxQueueCost: 3 * time.Millisecond, MaxWait: 3 * time.Millisecond})
	var running, peak atomic.Int64
	h := th.Middleware(MiddlewareOptions{})(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		n := running.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		time.Sleep(200 * time.Microsecond)
		running.Add(-1)
	}))
	levels := []string{"SHEDDABLE", "SHEDDABLE_PLUS", "CRITICAL", "CRITICAL_PLUS", "junk"}
	var codes [600]atomic.Int64
	var wg sync.WaitGroup
	for g := range 12 {
		wg.Go(func() {
			for i := range 150 {
				req := httptest.NewRequest("GET", "/", nil)
				req.Header.Set("X-Criticality", levels[(g+i)%len(levels)])
				if i%7 == 0 {
					ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
					defer cancel()
					req = req.WithContext(ctx)
				}
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				codes[rec.Code].Add(1)
			}
		})
	}
	wg.Wait()
	if p := peak.Load(); p > limit {
		t.Errorf("%d handlers ran at once, limit %d", p, limit)
	}
	if codes[200].Load()+codes[503].Load() != 12*150 || codes[200].Load() == 0 || codes[503].Load() == 0 {
		t.Errorf("200: %d, 503: %d of %d", codes[200].Load(), codes[503].Load(), 12*150)
	}
	st := th.Stats()
	if st.InFlight != 0 || st.Queued != 0 || st.QueuedCost != 0 {
		t.Errorf("after the load: %+v", st)
	}
	t.Logf("200: %d, 503: %d; refused %v evicted %v expired %v canceled %v", codes[200].Load(), codes[503].Load(), st.Refused, st.Evicted, st.Expired, st.Withdrawn)
}

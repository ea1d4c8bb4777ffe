package throttle

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// sink keeps the work loop from being optimized away.
var sink atomic.Uint64

// burn does units of CPU work (a fixed number of xorshift rounds each).
func burn(units, perUnit int) {
	x := uint64(88172645463325252)
	for range units * perUnit {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
	}
	sink.Add(x)
}

// calibrate returns the rounds of burn that take about 1 ms of CPU here
// now (a busy host makes them fewer; the test's capacity is measured in
// the same units, so it does not matter).
func calibrate() int {
	const n = 2_000_000
	start := time.Now()
	burn(1, n)
	return max(1000, int(float64(n)*float64(time.Millisecond)/float64(time.Since(start))))
}

// overloadServer is a real HTTP server on loopback: GET /cheap does 10
// units of CPU work (about 1 ms each), GET /dear 50; it counts the units it completed.
type overloadServer struct {
	srv     *httptest.Server
	perUnit int
	units   atomic.Int64

	mu      sync.Mutex
	latency []time.Duration // server-side, of the requests answered 200, while recording
	service []time.Duration // the handlers' own time, while recording
	record  atomic.Bool
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(s int) { w.status = s; w.ResponseWriter.WriteHeader(s) }

func newOverloadServer(t *testing.T, wrap func(http.Handler) http.Handler) *overloadServer {
	s := &overloadServer{perUnit: calibrate()}
	mux := http.NewServeMux()
	for path, units := range map[string]int{"GET /cheap": 10, "GET /dear": 50} {
		mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
			start := time.Now()
			defer func() {
				if s.record.Load() {
					s.mu.Lock()
					s.service = append(s.service, time.Since(start))
					s.mu.Unlock()
				}
			}()
			burn(units, s.perUnit)
			s.units.Add(int64(units))
			io.WriteString(w, "ok") //nolint:errcheck
		})
	}
	inner := wrap(mux)
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w, status: 200}
		inner.ServeHTTP(sw, r)
		if sw.status == 200 && s.record.Load() {
			s.mu.Lock()
			s.latency = append(s.latency, time.Since(start))
			s.mu.Unlock()
		}
	}))
	return s
}

type result struct {
	crit    bool
	ok      bool
	status  int
	latency time.Duration
}

// load sends one request of the mix: 20% dear, and critical or not as
// told; it returns what happened.
func (s *overloadServer) send(client *http.Client, i int, critical bool) result {
	path := "/cheap"
	if (i/5)%5 == 0 { // 20% dear, independent of the level (i%5)
		path = "/dear"
	}
	req, _ := http.NewRequest("GET", s.srv.URL+path, nil)
	level := "SHEDDABLE"
	if critical {
		level = "CRITICAL"
	}
	req.Header.Set("X-Criticality", level)
	start := time.Now()
	resp, err := client.Do(req)
	r := result{crit: critical, latency: time.Since(start)}
	if err != nil {
		return r
	}
	io.Copy(io.Discard, resp.Body) //nolint:errcheck
	resp.Body.Close()
	r.status, r.ok = resp.StatusCode, resp.StatusCode == 200
	return r
}

// capacity drives the server closed-loop with 8 clients for d and
// returns the work units it completes per second and the p99 latency.
func (s *overloadServer) capacity(client *http.Client, d time.Duration) (float64, time.Duration) {
	before := s.units.Load()
	start := time.Now()
	var mu sync.Mutex
	var lat []time.Duration
	var wg sync.WaitGroup
	for c := range 8 {
		wg.Go(func() {
			for i := c; time.Since(start) < d; i += 8 {
				r := s.send(client, i, true)
				mu.Lock()
				lat = append(lat, r.latency)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	rate := float64(s.units.Load()-before) / time.Since(start).Seconds()
	slices.Sort(lat)
	return rate, lat[len(lat)*99/100]
}

// TestOverload drives a real HTTP server doing CPU work at 3× its
// measured capacity with 20% CRITICAL and 80% SHEDDABLE requests on a
// cheap and a dear route, behind the adaptive throttler.
//
// The host is shared (seven engineers' tests on two cores) and the CPU
// it gives this process swings by 2× within seconds. So capacity is
// measured as work per CPU-second of the process (closed loop, 8
// clients, no throttler), the offered load is re-derived every 100 ms
// as 3× that times the CPU the process got over the last 500 ms, and
// goodput is work per CPU-second of the process under load.
func TestOverload(t *testing.T) {
	if raceEnabled || testing.Short() {
		t.Skip("a load test: its numbers mean nothing under the race detector")
	}
	if processCPU() < 0 {
		t.Skip("needs the process's CPU time")
	}
	base := runtime.NumGoroutine()
	const maxWait = time.Second
	th := New(Config{Limit: 2 * runtime.GOMAXPROCS(0), Adaptive: &AdaptiveConfig{}, MaxQueueCost: 400 * time.Millisecond, MaxWait: maxWait})
	var throttled atomic.Bool
	s := newOverloadServer(t, func(h http.Handler) http.Handler {
		withT := th.Middleware(MiddlewareOptions{Mux: h.(*http.ServeMux)})(h)
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if throttled.Load() {
				withT.ServeHTTP(w, r)
			} else {
				h.ServeHTTP(w, r)
			}
		})
	})
	// A pool of connections opened before the load and never more: an
	// open-loop client dialing afresh overflows the listen backlog, and
	// a dropped SYN costs a second, which is the host's latency, not the
	// throttler's.
	const conns = 256
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: conns, MaxConnsPerHost: conns}, Timeout: 10 * time.Second}
	var warmup sync.WaitGroup
	for range conns {
		warmup.Go(func() {
			if resp, err := client.Get(s.srv.URL + "/nothing"); err == nil {
				io.Copy(io.Discard, resp.Body) //nolint:errcheck
				resp.Body.Close()
			}
		})
	}
	warmup.Wait()

	const meanUnits = 0.8*10 + 0.2*50
	cpu0, units0 := processCPU(), s.units.Load()
	capRate, capP99 := s.capacity(client, 2*time.Second)
	perCPU := float64(s.units.Load()-units0) / (processCPU() - cpu0).Seconds() // work per CPU-second
	t.Logf("capacity %.0f units/s (%.0f requests/s of the mix), %.0f units per CPU-second; p99 %v at capacity", capRate, capRate/meanUnits, perCPU, capP99)

	throttled.Store(true)
	const warm = time.Second
	ph := s.overload(client, 3*capRate/meanUnits, perCPU/meanUnits, 6*time.Second, warm)
	results, goodUnits, goodCPU, goodWall := ph.results, ph.units, ph.cpu, ph.wall
	slices.Sort(ph.offered)
	t.Logf("offered %.0f requests/s (median; from %.0f to %.0f)", ph.offered[len(ph.offered)/2], ph.offered[0], ph.offered[len(ph.offered)-1])

	var crit, critOK, ok int
	var lat []time.Duration
	for _, r := range results {
		if r.crit {
			crit++
			if r.ok {
				critOK++
			}
		}
		if r.ok {
			ok++
			lat = append(lat, r.latency)
		}
	}
	slices.Sort(lat)
	slices.Sort(s.latency)
	p99 := s.latency[len(s.latency)*99/100]
	goodput := goodUnits / goodCPU.Seconds()
	st := th.Stats()
	t.Logf("goodput %.0f units/s, %.0f per CPU-second = %.1f%% of capacity; CRITICAL %d/%d = %.2f%%; admitted p99 %v (server side), %v (client side); %d requests, %d ok; limit %d; refused %v evicted %v expired %v; predicted cheap %v dear %v",
		goodUnits/goodWall.Seconds(), goodput, 100*goodput/perCPU, critOK, crit, 100*float64(critOK)/float64(crit), p99, lat[len(lat)*99/100], len(results), ok,
		st.Limit, st.Refused, st.Evicted, st.Expired, th.Predict(RouteKey{"GET", "GET /cheap"}), th.Predict(RouteKey{"GET", "GET /dear"}))
	if float64(critOK) < 0.995*float64(crit) {
		t.Errorf("CRITICAL success %.2f%% < 99.5%%", 100*float64(critOK)/float64(crit))
	}
	if goodput < 0.9*perCPU {
		t.Errorf("goodput %.1f%% of capacity < 90%%", 100*goodput/perCPU)
	}
	// What the throttler adds to an admitted request is its wait in the
	// queue, at most MaxWait; the handler's own time is the host's (which
	// gives this process a varying share of two busy cores).
	slices.Sort(s.service)
	bound := maxWait + s.service[len(s.service)*99/100]
	t.Logf("the queue's bound for the admitted: %v (MaxWait %v + the handlers' p99)", bound, maxWait)
	if p99 > bound {
		t.Errorf("admitted p99 %v (server side) > the queue's bound %v (MaxWait + the handlers' p99)", p99, bound)
	}

	client.CloseIdleConnections()
	s.srv.Close()
	checkNoLeak(t, base)
	if st := th.Stats(); st.InFlight != 0 || st.Queued != 0 || st.QueuedCost != 0 {
		t.Errorf("throttler not empty after the load: %+v", st)
	}
}

// phase is what an overload phase measured after its warm-up.
type phase struct {
	results   []result
	units     float64       // work completed
	cpu, wall time.Duration // the process's CPU time, and the time
	offered   []float64     // requests/s offered, every 100 ms
}

// overload offers open-loop load for d, from rps requests/s at first,
// then every 100 ms 3× perCPU (requests per CPU-second at capacity) times
// the CPU the process got over the last 500 ms; it measures after warm.
func (s *overloadServer) overload(client *http.Client, rps, perCPU float64, d, warm time.Duration) phase {
	var ph phase
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	var unitsAtWarm int64
	var cpuAtWarm time.Duration
	type point struct{ at, cpu time.Duration }
	hist := []point{{0, processCPU()}}
	due, sent, last := 0.0, 0, time.Duration(0)
	for el := time.Since(start); el < d; el = time.Since(start) {
		if unitsAtWarm == 0 && el >= warm {
			unitsAtWarm, cpuAtWarm = s.units.Load(), processCPU()
			s.record.Store(true)
		}
		if h := hist[len(hist)-1]; el-h.at >= 100*time.Millisecond {
			now := processCPU()
			hist = append(hist, point{el, now})
			old := hist[max(0, len(hist)-6)]
			rps = 3 * perCPU * (now - old.cpu).Seconds() / (el - old.at).Seconds()
			ph.offered = append(ph.offered, rps)
		}
		due += rps * (el - last).Seconds()
		last = el
		for ; float64(sent) < due; sent++ {
			i := sent
			wg.Go(func() {
				r := s.send(client, i, i%5 == 1)
				if time.Since(start) >= warm {
					mu.Lock()
					ph.results = append(ph.results, r)
					mu.Unlock()
				}
			})
		}
		time.Sleep(time.Millisecond)
	}
	ph.units, ph.cpu = float64(s.units.Load()-unitsAtWarm), processCPU()-cpuAtWarm
	ph.wall = time.Since(start) - warm
	s.record.Store(false)
	wg.Wait()
	return ph
}

// checkNoLeak waits up to 5 s for the goroutines to fall back to base
// (+2: the runtime's own may come and go).
func checkNoLeak(t *testing.T, base int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for runtime.NumGoroutine() > base+2 && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > base+2 {
		buf := make([]byte, 1<<16)
		t.Errorf("%d goroutines after the load, %d before:\n%s", n, base, buf[:runtime.Stack(buf, true)])
	}
}

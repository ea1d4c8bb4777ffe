package throttle

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate/floodgate/internal/testproc"
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

// TestOverload drives a real HTTP server doing CPU work at 3× its
// measured capacity with 20% CRITICAL and 80% SHEDDABLE requests on a
// cheap and a dear route, behind the adaptive throttler. The load comes
// from another process (this test binary as TestOverloadClient), so
// that the CPU it spends is not the server's.
//
// The host is shared (seven engineers' tests on two cores) and the CPU
// it gives the server swings by 2× within seconds. So capacity is
// measured as work per CPU-second of the server process (closed loop, 8
// clients, no throttler; the mean of 2 s before the load and 1.5 s
// after), the offered load is re-derived every 100 ms as 3× that times
// the CPU the server got over the last second, and goodput is work per
// CPU-second of the server under load.
func TestOverload(t *testing.T) {
	if raceEnabled || testing.Short() {
		t.Skip("a load test: its numbers mean nothing under the race detector")
	}
	if processCPU() < 0 {
		t.Skip("needs the process's CPU time")
	}
	base := runtime.NumGoroutine()
	const maxWait = 2 * time.Second
	th := New(Config{Limit: 2 * runtime.GOMAXPROCS(0), Adaptive: &AdaptiveConfig{}, MaxQueueCost: maxWait * time.Duration(runtime.GOMAXPROCS(0)), MaxWait: maxWait})
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
	c := startLoadClient(t, s.srv.URL)

	const meanUnits = 0.8*10 + 0.2*50
	measure := func(d time.Duration) (rate, perCPU float64) {
		cpu0, units0, start := processCPU(), s.units.Load(), time.Now()
		c.do("cap %d", d.Milliseconds())
		units := float64(s.units.Load() - units0)
		return units / time.Since(start).Seconds(), units / (processCPU() - cpu0).Seconds()
	}
	capRate, perCPU := measure(2 * time.Second)
	t.Logf("capacity %.0f units/s (%.0f requests/s of the mix), %.0f units per server CPU-second", capRate, capRate/meanUnits, perCPU)

	throttled.Store(true)
	ph := s.overload(c, 3*capRate/meanUnits, perCPU/meanUnits, 6*time.Second, time.Second)
	throttled.Store(false)
	_, after := measure(1500 * time.Millisecond)
	t.Logf("capacity after the load: %.0f units per server CPU-second", after)
	perCPU = (perCPU + after) / 2
	c.quit()

	slices.Sort(ph.offered)
	slices.Sort(s.latency)
	slices.Sort(s.service)
	p99 := s.latency[len(s.latency)*99/100]
	bound := maxWait + s.service[len(s.service)*99/100]
	goodput := ph.units / ph.cpu.Seconds()
	st := th.Stats()
	t.Logf("offered %.0f requests/s (median; from %.0f to %.0f); goodput %.0f units/s, %.0f per server CPU-second = %.1f%% of capacity",
		ph.offered[len(ph.offered)/2], ph.offered[0], ph.offered[len(ph.offered)-1], ph.units/ph.wall.Seconds(), goodput, 100*goodput/perCPU)
	t.Logf("CRITICAL %d/%d = %.2f%%; %d requests, %d ok; admitted p99 %v (server side; bound %v = MaxWait + the handlers' p99), %v (client side); limit %d; refused %v evicted %v expired %v; predicted cheap %v dear %v",
		ph.critOK, ph.crit, 100*float64(ph.critOK)/float64(ph.crit), ph.n, ph.ok, p99, bound, ph.clientP99, st.Limit, st.Refused, st.Evicted, st.Expired,
		th.Predict(RouteKey{"GET", "GET /cheap"}), th.Predict(RouteKey{"GET", "GET /dear"}))
	if ph.crit == 0 || float64(ph.critOK) < 0.995*float64(ph.crit) {
		t.Errorf("CRITICAL success %d/%d < 99.5%%", ph.critOK, ph.crit)
	}
	if goodput < 0.9*perCPU {
		t.Errorf("goodput %.1f%% of capacity < 90%%", 100*goodput/perCPU)
	}
	// What the throttler adds to an admitted request is its wait in the
	// queue, at most MaxWait; the handler's own time is the host's.
	if p99 > bound {
		t.Errorf("admitted p99 %v (server side) > the queue's bound %v (MaxWait + the handlers' p99)", p99, bound)
	}
	s.srv.Close()
	checkNoLeak(t, base)
	if st := th.Stats(); st.InFlight != 0 || st.Queued != 0 || st.QueuedCost != 0 {
		t.Errorf("throttler not empty after the load: %+v", st)
	}
}

// phase is what an overload phase measured after its warm-up.
type phase struct {
	units               float64       // work completed
	cpu, wall           time.Duration // the server's CPU time, and the time
	offered             []float64     // requests/s offered, every 100 ms
	n, ok, crit, critOK int
	clientP99           time.Duration
}

// overload has the client offer open-loop load for d, from rps requests/s
// at first, then every 100 ms 3× perCPU (requests per CPU-second at
// capacity) times the CPU the server got over the last second; it
// measures after warm.
func (s *overloadServer) overload(c *loadClient, rps, perCPU float64, d, warm time.Duration) phase {
	var ph phase
	start := time.Now()
	type point struct{ at, cpu time.Duration }
	hist := []point{{0, processCPU()}}
	c.send("rate %f", rps)
	c.send("load")
	var unitsAtWarm int64
	var cpuAtWarm time.Duration
	for el := time.Duration(0); el < d; el = time.Since(start) {
		if unitsAtWarm == 0 && el >= warm {
			unitsAtWarm, cpuAtWarm = s.units.Load(), processCPU()
			s.record.Store(true)
			c.send("warm")
		}
		time.Sleep(100 * time.Millisecond)
		now, el := processCPU(), time.Since(start)
		hist = append(hist, point{el, now})
		old := hist[max(0, len(hist)-11)]
		rps = 3 * perCPU * (now - old.cpu).Seconds() / (el - old.at).Seconds()
		ph.offered = append(ph.offered, rps)
		c.send("rate %f", rps)
	}
	ph.units, ph.cpu = float64(s.units.Load()-unitsAtWarm), processCPU()-cpuAtWarm
	ph.wall = time.Since(start) - warm
	s.record.Store(false)
	var p99 int64
	fmt.Sscanf(c.do("stop"), "%d %d %d %d %d", &ph.n, &ph.ok, &ph.crit, &ph.critOK, &p99) //nolint:errcheck // checked by the test's counts
	ph.clientP99 = time.Duration(p99)
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

// loadClient is the load generator process, driven line by line.
type loadClient struct {
	t    *testing.T
	in   io.WriteCloser
	out  *bufio.Scanner
	proc *testproc.Proc
}

func startLoadClient(t *testing.T, url string) *loadClient {
	cmd := exec.Command(os.Args[0], "-test.run=^TestOverloadClient$", "-test.count=1")
	cmd.Env = append(os.Environ(), "FLOODGATE_OVERLOAD_URL="+url)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p, err := testproc.Start(cmd)
	if err != nil {
		t.Fatal(err)
	}
	c := &loadClient{t: t, in: in, out: bufio.NewScanner(out), proc: p}
	t.Cleanup(func() { in.Close(); p.Wait() }) //nolint:errcheck
	c.do("hello")
	return c
}

func (c *loadClient) send(format string, args ...any) {
	if _, err := fmt.Fprintf(c.in, format+"\n", args...); err != nil {
		c.t.Fatalf("load client: %v", err)
	}
}

// do sends a command and returns the client's answer.
func (c *loadClient) do(format string, args ...any) string {
	c.send(format, args...)
	for c.out.Scan() {
		if line, ok := strings.CutPrefix(c.out.Text(), "ANSWER "); ok {
			return line
		}
	}
	c.t.Fatalf("load client gone: %v", c.out.Err())
	return ""
}

func (c *loadClient) quit() {
	c.send("quit")
	c.in.Close()
}

package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/alibaba/sentinel-golang/api"
	"github.com/alibaba/sentinel-golang/core/base"
	sconfig "github.com/alibaba/sentinel-golang/core/config"
	"github.com/alibaba/sentinel-golang/core/system"
	"github.com/go-kratos/aegis/ratelimit"
	"github.com/go-kratos/aegis/ratelimit/bbr"
	"github.com/platinummonkey/go-concurrency-limits/core"
	"github.com/platinummonkey/go-concurrency-limits/limit"
	"github.com/platinummonkey/go-concurrency-limits/limiter"
	"github.com/platinummonkey/go-concurrency-limits/strategy"
	"github.com/zeromicro/go-zero/core/load"
	"github.com/zeromicro/go-zero/core/logx"

	"github.com/floodgate/floodgate/throttle"
)

// peers are the server-side admission controllers compared, in the
// order each round runs them.
var peers = []string{"floodgate", "go-zero", "kratos-bbr", "go-concurrency-limits", "sentinel"}

// bypass marks the harness's own requests (capacity runs, stats): they
// skip the admission controller.
const bypass = "X-Bench-Bypass"

var sink atomic.Uint64

// marked is set by GET /mark, when the client's measured window starts.
var marked atomic.Bool

// burn does units of CPU work, each about 1 ms of one core.
func burn(units, perUnit int) {
	x := uint64(88172645463325252)
	for range units * perUnit {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
	}
	sink.Add(x)
}

// calibrate returns the rounds of burn that take about 1 ms here now,
// the fastest of five tries (the host is shared).
func calibrate() int {
	best := 0
	for range 5 {
		best = max(best, calibrateOnce())
	}
	return best
}

func calibrateOnce() int {
	const n = 2_000_000
	start := time.Now()
	burn(1, n)
	return max(1000, int(float64(n)*float64(time.Millisecond)/float64(time.Since(start))))
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return -1
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// guard is one peer's admission: ok false means shed (503); done ends an
// admitted request.
type guard func(r *http.Request, critical bool) (done func(), ok bool)

// unitsHeader carries the units of work a 200 answer did, and
// countedHeader those of them done after /mark (the measured window).
const (
	unitsHeader   = "X-Units"
	countedHeader = "X-Units-Counted"
)

// serve runs the workload's HTTP server behind peer's admission control
// and prints its address; it exits when stdin closes (writing the CPU
// profile first, if asked).
func serve(peer string, perUnit int, profile string) error {
	var units, counted atomic.Int64
	mux := http.NewServeMux()
	for path, n := range map[string]int{"GET /cheap": 10, "GET /dear": 50} {
		hdr := []string{strconv.Itoa(n)}
		mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
			c := 0
			for range n { // unit by unit: work done after /mark is the window's
				burn(1, perUnit)
				if marked.Load() {
					c++
				}
			}
			units.Add(int64(n))
			counted.Add(int64(c))
			w.Header()[unitsHeader] = hdr
			w.Header().Set(countedHeader, strconv.Itoa(c))
			io.WriteString(w, "ok") //nolint:errcheck
		})
	}
	var limits limitSampler
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%d %d %d", units.Load(), processCPU().Microseconds(), counted.Load())
	})
	mux.HandleFunc("GET /mark", func(w http.ResponseWriter, r *http.Request) {
		idleAtMark = readIdle()
		marked.Store(true)
	})
	mux.HandleFunc("GET /endmark", func(w http.ResponseWriter, r *http.Request) { idleAtEnd = readIdle() })
	mux.HandleFunc("GET /meter", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s %s", meterLine(), idleLine(), limits.line())
	})
	limited, th, err := wrap(peer, mux)
	if err != nil {
		return err
	}
	if th != nil {
		go limits.run(th)
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Header.Get(bypass) != "":
			mux.ServeHTTP(w, r)
		case r.Header.Get(meterHeader) != "":
			metered(limited, w, r)
		default:
			limited.ServeHTTP(w, r)
		}
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	if profile != "" {
		f, err := os.Create(profile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(ln) //nolint:errcheck
	fmt.Printf("ADDR %s GOMAXPROCS=%d\n", ln.Addr(), runtime.GOMAXPROCS(0))
	io.Copy(io.Discard, bufio.NewReader(os.Stdin)) //nolint:errcheck
	if th != nil && os.Getenv("THROTTLECMP_STATS") != "" {
		st := th.Stats()
		fmt.Fprintf(os.Stderr, "%s: refused %v evicted %v expired %v withdrawn %v (by level, SHEDDABLE first)\n",
			peer, st.Refused, st.Evicted, st.Expired, st.Withdrawn)
	}
	return nil
}

// limitSampler samples a Floodgate throttler's limit and in-flight count
// every 10 ms once the window is marked.
type limitSampler struct {
	mu               sync.Mutex
	limits, inflight []int
}

func (s *limitSampler) run(th *throttle.Throttler) {
	for range time.Tick(10 * time.Millisecond) {
		if !marked.Load() {
			continue
		}
		st := th.Stats()
		s.mu.Lock()
		s.limits = append(s.limits, st.Limit)
		s.inflight = append(s.inflight, st.InFlight)
		s.mu.Unlock()
	}
}

// line is "limit p10 p50 p90 inflight p10 p50 p90" ("- ..." for a peer
// that is not Floodgate).
func (s *limitSampler) line() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := func(v []int) string {
		if len(v) == 0 {
			return "- - -"
		}
		v = slices.Clone(v)
		slices.Sort(v)
		return fmt.Sprintf("%d %d %d", v[len(v)/10], v[len(v)/2], v[len(v)*9/10])
	}
	return q(s.limits) + " " + q(s.inflight)
}

// wrap puts peer's admission control in front of mux; for Floodgate it
// also returns the throttler.
func wrap(peer string, mux *http.ServeMux) (http.Handler, *throttle.Throttler, error) {
	if peer == "floodgate" || peer == "floodgate-limit20" || peer == "floodgate-wide" || strings.HasPrefix(peer, "floodgate-wait=") {
		maxWait := 2 * time.Second
		if w, ok := strings.CutPrefix(peer, "floodgate-wait="); ok { // a shorter or longer queue (-peers only)
			d, err := time.ParseDuration(w)
			if err != nil || d <= 0 {
				return nil, nil, fmt.Errorf("peer %q: the wait is not a positive duration", peer)
			}
			maxWait = d
		}
		procs := runtime.GOMAXPROCS(0)
		c := throttle.Config{Limit: 2 * procs, Adaptive: &throttle.AdaptiveConfig{},
			MaxQueueCost: maxWait * time.Duration(procs), MaxWait: maxWait}
		switch peer {
		case "floodgate-limit20": // a fixed limit of 20 in flight, go-concurrency-limits' floor (-peers only)
			c.Limit, c.Adaptive = 20, nil
		case "floodgate-wide": // Vegas with 4× the default α and β: the limit settles near CPUs + 8..16 (-peers only)
			c.Adaptive.Alpha, c.Adaptive.Beta = 8, 16
		}
		th := throttle.New(c)
		// The load client is ours and its X-Criticality (CRITICAL or
		// SHEDDABLE) is the workload's mix: trust it as sent. (The
		// middleware's default trusts no one and caps a claim at
		// CRITICAL, which would leave this mix as it is today but would
		// silently flatten a CRITICAL_PLUS share if one is ever added.)
		return th.Middleware(throttle.MiddlewareOptions{Mux: mux, Trusted: func(*http.Request) bool { return true }})(mux), th, nil
	}
	g, err := newGuard(peer)
	if err != nil {
		return nil, nil, err
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		done, ok := g(r, r.Header.Get("X-Criticality") == "CRITICAL")
		if !ok {
			w.Header().Set("Retry-After", "1")
			http.Error(w, "overloaded", http.StatusServiceUnavailable)
			return
		}
		defer done()
		mux.ServeHTTP(w, r)
	}), nil, nil
}

func newGuard(peer string) (guard, error) {
	switch peer {
	case "go-zero":
		return goZero(), nil
	case "kratos-bbr":
		l := bbr.NewLimiter() // CPU threshold 800‰, its default
		return func(*http.Request, bool) (func(), bool) {
			done, err := l.Allow()
			if err != nil {
				return nil, false
			}
			return func() { done(ratelimit.DoneInfo{}) }, true
		}, nil
	case "go-concurrency-limits":
		return concurrencyLimits()
	case "sentinel":
		return sentinel()
	}
	return nil, fmt.Errorf("unknown peer %q", peer)
}

// goZero is go-zero's rest engine's shedding: its default CPU threshold
// (900‰), and a second shedder for priority routes at (900+1000)/2, here
// the CRITICAL requests (its two levels).
func goZero() guard {
	logx.Disable()
	load.DisableLog()
	normal := load.NewAdaptiveShedder(load.WithCpuThreshold(900))
	priority := load.NewAdaptiveShedder(load.WithCpuThreshold(950))
	return func(_ *http.Request, critical bool) (func(), bool) {
		s := normal
		if critical {
			s = priority
		}
		p, err := s.Allow()
		if err != nil {
			return nil, false
		}
		return p.Pass, true
	}
}

type critKey struct{}

// concurrencyLimits is the Go port of Netflix's concurrency-limits as
// its server examples set it up: Gradient2 (its defaults: from 20,
// between 20 and 200), the default limiter (refuse past the limit), the
// limit partitioned by criticality (CRITICAL 50 %, SHEDDABLE 50 %).
func concurrencyLimits() (guard, error) {
	reg := core.EmptyMetricRegistryInstance
	parts := []*strategy.PredicatePartition{
		strategy.NewPredicatePartitionWithMetricRegistry("critical", 0.5,
			func(ctx context.Context) bool { return ctx.Value(critKey{}) == true }, reg),
		strategy.NewPredicatePartitionWithMetricRegistry("sheddable", 0.5,
			func(ctx context.Context) bool { return ctx.Value(critKey{}) != true }, reg),
	}
	st, err := strategy.NewPredicatePartitionStrategyWithMetricRegistry(parts, 20, reg)
	if err != nil {
		return nil, err
	}
	lim := limit.NewDefaultGradient2Limit("throttlecmp", limit.NoopLimitLogger{}, reg)
	l, err := limiter.NewDefaultLimiter(lim, 1e9, 1e9, 1e5, 100, st, limit.NoopLimitLogger{}, reg)
	if err != nil {
		return nil, err
	}
	critCtx := context.WithValue(context.Background(), critKey{}, true)
	return func(_ *http.Request, critical bool) (func(), bool) {
		ctx := context.Background()
		if critical {
			ctx = critCtx
		}
		ln, ok := l.Acquire(ctx)
		if !ok {
			return nil, false
		}
		return ln.OnSuccess, true
	}, nil
}

// sentinel is sentinel-golang's system adaptive rule: BBR past a CPU
// usage of 0.8, on all inbound traffic. (v1.0.4 accepts a CpuUsage
// trigger only in [0, 1] but measures gopsutil's process percent, 0 to
// 100 × CPUs, so the BBR check is on whenever the process runs: here it
// is sentinel's BBR concurrency check alone.)
func sentinel() (guard, error) {
	conf := sconfig.NewDefaultConfig()
	conf.Sentinel.Log.Dir = os.TempDir() + "/throttlecmp-sentinel-logs"
	if err := api.InitWithConfig(conf); err != nil {
		return nil, err
	}
	if ok, err := system.LoadRules([]*system.Rule{{MetricType: system.CpuUsage, TriggerCount: 0.8, Strategy: system.BBR}}); err != nil || !ok {
		return nil, fmt.Errorf("sentinel refused the system rule: %v", err)
	}
	return func(*http.Request, bool) (func(), bool) {
		e, b := api.Entry("throttlecmp", api.WithTrafficType(base.Inbound))
		if b != nil {
			return nil, false
		}
		return func() { e.Exit() }, true
	}, nil
}

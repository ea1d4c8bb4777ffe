package bench

import (
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	glhttplimit "github.com/sethvargo/go-limiter/httplimit"
	"github.com/sethvargo/go-limiter/memorystore"
	ulule "github.com/ulule/limiter/v3"
	ululestdlib "github.com/ulule/limiter/v3/drivers/middleware/stdlib"
	ululemem "github.com/ulule/limiter/v3/drivers/store/memory"
	"golang.org/x/time/rate"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/gate"
	"github.com/floodgate/floodgate/httplimit"
)

// BenchmarkMiddleware compares the per-request cost of net/http rate-limit
// middleware, in process, each limiting per client IP:
//
//	floodgate    Floodgate's httplimit (a gate with one per-IP token bucket
//	             on its own memstore; RateLimit-Policy and RateLimit
//	             headers, a text refusal body)
//	go-limiter   github.com/sethvargo/go-limiter/httplimit over memorystore
//	             (X-RateLimit-* headers; http.Error on refusal)
//	ulule        github.com/ulule/limiter/v3's stdlib middleware over its
//	             memory store (X-RateLimit-* headers; http.Error on refusal)
//	x-time-rate  a hand-written baseline: a sync.Map of *rate.Limiter per
//	             IP (net.SplitHostPort of RemoteAddr), no headers, a bare
//	             429 on refusal: about the cheapest reasonable middleware
//
// under two limits:
//
//	allowed  a limit no client reaches: a burst of 1e9 per IP, refilled
//	         at one a second (1e9 per 1e9 s): every request passes
//	denied   1 an hour per IP, every key spent before timing starts:
//	         every measured request is refused
//
// The requests come from 1,000 client addresses (RemoteAddr 10.0.x.y:1234),
// built once and cycled through in order; the handler only calls
// WriteHeader(200), and the ResponseWriter keeps one header map, cleared
// per request, so B/op and allocs/op are the middleware's own. Every
// response's status is checked (200 when allowed, 429 when denied); one
// wrong status fails the benchmark.
//
// The loop is b.RunParallel: under -cpu 1 one goroutine (a serial loop),
// under -cpu 2 two goroutines on different addresses at once, so the
// middleware's locks are shared. ns/op is wall time over all requests.
func BenchmarkMiddleware(b *testing.B) {
	reqs := mwRequests(mwClients)
	for _, impl := range mwImpls {
		b.Run(impl.name, func(b *testing.B) {
			for _, c := range mwCases {
				b.Run(c.name, func(b *testing.B) {
					h, closeFn := impl.build(b, c, http.HandlerFunc(okHandler))
					defer closeFn()
					runMiddleware(b, h, reqs, c.status)
				})
			}
		})
	}
}

// mwClients is the number of distinct client addresses.
const mwClients = 1000

// An mwCase is a limit for every implementation: limit requests per
// period per IP, with a burst (bucket capacity) of limit.
type mwCase struct {
	name   string
	limit  int64
	period time.Duration
	status int // every measured response's status
}

var mwCases = []mwCase{
	// Not 1e9 a second: go-limiter's memorystore refills interval/tokens
	// tokens per elapsed interval (sethvargo/go-limiter#29), so with 1e9
	// tokens a second its buckets hold one token after the first second
	// and it refuses most requests. 1e9 per 1e9 s (32 years) never
	// reaches an interval's end, so every implementation passes every
	// request and decides on an existing key.
	{"allowed", 1_000_000_000, 1_000_000_000 * time.Second, http.StatusOK},
	{"denied", 1, time.Hour, http.StatusTooManyRequests},
}

var mwImpls = []struct {
	name  string
	build func(b *testing.B, c mwCase, next http.Handler) (http.Handler, func())
}{
	{"floodgate", mwFloodgate},
	{"go-limiter", mwGoLimiter},
	{"ulule", mwUlule},
	{"x-time-rate", mwRate},
}

func okHandler(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }

func mwFloodgate(b *testing.B, c mwCase, next http.Handler) (http.Handler, func()) {
	p := floodgate.MustPolicy("per-ip", floodgate.Rule{Algorithm: floodgate.TokenBucket, Limit: c.limit, Period: c.period})
	mw, err := httplimit.New(httplimit.Options{Config: gate.Config{Limits: []gate.Limit{
		{Name: "per-ip", Policy: p, Key: []gate.Part{gate.IP()}},
	}}})
	if err != nil {
		b.Fatal(err)
	}
	return mw.Handler(next), mw.Close
}

func mwGoLimiter(b *testing.B, c mwCase, next http.Handler) (http.Handler, func()) {
	s, err := memorystore.New(&memorystore.Config{Tokens: uint64(c.limit), Interval: c.period})
	if err != nil {
		b.Fatal(err)
	}
	mw, err := glhttplimit.NewMiddleware(s, glhttplimit.IPKeyFunc())
	if err != nil {
		b.Fatal(err)
	}
	return mw.Handle(next), func() { s.Close(ctx) }
}

func mwUlule(_ *testing.B, c mwCase, next http.Handler) (http.Handler, func()) {
	l := ulule.New(ululemem.NewStore(), ulule.Rate{Period: c.period, Limit: c.limit})
	return ululestdlib.NewMiddleware(l).Handler(next), func() {}
}

func mwRate(_ *testing.B, c mwCase, next http.Handler) (http.Handler, func()) {
	per := rate.Limit(float64(c.limit) / c.period.Seconds())
	return &rateMiddleware{limit: per, burst: int(c.limit), next: next}, func() {}
}

// rateMiddleware is the baseline: one golang.org/x/time/rate Limiter per
// client IP in a sync.Map; no headers, no body.
type rateMiddleware struct {
	limiters sync.Map // IP string → *rate.Limiter
	limit    rate.Limit
	burst    int
	next     http.Handler
}

func (m *rateMiddleware) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ip, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	l, ok := m.limiters.Load(ip)
	if !ok {
		l, _ = m.limiters.LoadOrStore(strings.Clone(ip), rate.NewLimiter(m.limit, m.burst))
	}
	if !l.(*rate.Limiter).Allow() {
		w.WriteHeader(http.StatusTooManyRequests)
		return
	}
	m.next.ServeHTTP(w, r)
}

// mwRequests builds one GET per client address, RemoteAddr 10.0.x.y:1234.
func mwRequests(n int) []*http.Request {
	reqs := make([]*http.Request, n)
	for i := range reqs {
		r, err := http.NewRequest("GET", "http://example.com/", nil)
		if err != nil {
			panic(err)
		}
		r.RemoteAddr = "10.0." + strconv.Itoa(i/256%256) + "." + strconv.Itoa(i%256) + ":1234"
		reqs[i] = r
	}
	return reqs
}

// mwWriter is a ResponseWriter that keeps one header map, cleared per
// request (by the loop), and remembers the status.
type mwWriter struct {
	h      http.Header
	status int
}

func (w *mwWriter) Header() http.Header         { return w.h }
func (w *mwWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *mwWriter) WriteHeader(s int)           { w.status = s }

// runMiddleware sends every address one request (creating its key, and
// spending it under the denied limit), checks that a second round gets
// want for every address, then times requests cycling through the
// addresses, each goroutine from its own offset, and checks every status.
func runMiddleware(b *testing.B, h http.Handler, reqs []*http.Request, want int) {
	w := &mwWriter{h: http.Header{}}
	for round := range 2 {
		for _, r := range reqs {
			clear(w.h)
			w.status = 0
			h.ServeHTTP(w, r)
			if round == 1 && w.status != want {
				b.Fatalf("warm-up: %s got status %d, want %d", r.RemoteAddr, w.status, want)
			}
		}
	}
	var goroutine, wrong, served atomic.Int64
	var firstWrong atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		w := &mwWriter{h: http.Header{}}
		n := len(reqs)
		i := int(goroutine.Add(1)-1) * 397 % n
		bad, count := int64(0), int64(0)
		for pb.Next() {
			clear(w.h)
			w.status = 0
			h.ServeHTTP(w, reqs[i])
			if w.status != want {
				if bad == 0 {
					firstWrong.CompareAndSwap(0, int64(w.status)+1)
				}
				bad++
			}
			count++
			if i++; i == n {
				i = 0
			}
		}
		wrong.Add(bad)
		served.Add(count)
	})
	b.StopTimer()
	if bad := wrong.Load(); bad > 0 {
		b.Fatalf("%d of %d responses had the wrong status (first: %d, want %d)", bad, served.Load(), firstWrong.Load()-1, want)
	}
	if served.Load() != int64(b.N) {
		b.Fatalf("served %d requests, want %d", served.Load(), b.N)
	}
}

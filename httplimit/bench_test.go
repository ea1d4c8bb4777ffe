package httplimit_test

import (
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/gate"
	"github.com/floodgate/floodgate/httplimit"
	"github.com/floodgate/floodgate/throttle"
)

// discard is a ResponseWriter that keeps one header map, cleared per
// request, so the benchmark counts the middleware's allocations only.
type discard struct {
	h      http.Header
	status int
}

func (d *discard) Header() http.Header         { return d.h }
func (d *discard) Write(b []byte) (int, error) { return len(b), nil }
func (d *discard) WriteHeader(s int)           { d.status = s }

func benchMiddleware(b *testing.B, limit int64, keys int) {
	p := mustPolicy(b, "per-ip", floodgate.Rule{Algorithm: floodgate.TokenBucket, Limit: limit, Period: time.Second})
	mw, err := httplimit.New(httplimit.Options{Config: gate.Config{Limits: []gate.Limit{{Name: "per-ip", Policy: p, Key: []gate.Part{gate.IP()}}}}})
	if err != nil {
		b.Fatal(err)
	}
	defer mw.Close()
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(200) }))
	reqs := make([]*http.Request, keys)
	for i := range reqs {
		reqs[i], _ = http.NewRequest("GET", "http://example.com/", nil)
		reqs[i].RemoteAddr = "10.0." + strconv.Itoa(i/256%256) + "." + strconv.Itoa(i%256) + ":1234"
	}
	w := &discard{h: http.Header{}}
	for i := range reqs { // warm the keys
		h.ServeHTTP(w, reqs[i])
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		clear(w.h)
		h.ServeHTTP(w, reqs[i%keys])
	}
	b.StopTimer()
	if (limit > 1e6) != (w.status == 200) {
		b.Fatalf("status %d", w.status)
	}
}

// BenchmarkAllowed: a per-IP token bucket that admits, 1,000 clients.
func BenchmarkAllowed(b *testing.B) { benchMiddleware(b, 1e9, 1000) }

// BenchmarkDenied: the same limit, exhausted: every request refused.
func BenchmarkDenied(b *testing.B) { benchMiddleware(b, 1, 1000) }

// BenchmarkBare is the handler alone, for reference.
func BenchmarkBare(b *testing.B) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(200) })
	r, _ := http.NewRequest("GET", "http://example.com/", nil)
	w := &discard{h: http.Header{}}
	b.ReportAllocs()
	for b.Loop() {
		h.ServeHTTP(w, r)
	}
}

// BenchmarkThrottled: the gate alone (a per-IP token bucket that admits,
// 1,000 clients) against the same gate behind Throttled, in one run: the
// difference is admission before the quota (Classify, Enter, Done).
func BenchmarkThrottled(b *testing.B) {
	p := mustPolicy(b, "per-ip", floodgate.Rule{Algorithm: floodgate.TokenBucket, Limit: 1e9, Period: time.Second})
	mw, err := httplimit.New(httplimit.Options{Config: gate.Config{Limits: []gate.Limit{{Name: "per-ip", Policy: p, Key: []gate.Part{gate.IP()}}}}})
	if err != nil {
		b.Fatal(err)
	}
	defer mw.Close()
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(200) })
	th := throttle.New(throttle.Config{Limit: 1 << 20})
	for _, c := range []struct {
		name string
		h    http.Handler
	}{{"gate", mw.Handler(ok)}, {"throttled", mw.Throttled(th, throttle.MiddlewareOptions{})(ok)}} {
		b.Run(c.name, func(b *testing.B) {
			reqs := make([]*http.Request, 1000)
			for i := range reqs {
				reqs[i], _ = http.NewRequest("GET", "http://example.com/", nil)
				reqs[i].RemoteAddr = "10.0." + strconv.Itoa(i/256%256) + "." + strconv.Itoa(i%256) + ":1234"
			}
			w := &discard{h: http.Header{}}
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				clear(w.h)
				c.h.ServeHTTP(w, reqs[i%len(reqs)])
			}
		})
	}
}

package httplimit_test

import (
	"net/http"
	"strconv"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/gate"
	"github.com/floodgate/floodgate/httplimit"
)

// BenchmarkTracing is BenchmarkAllowed with tracing off (no
// TracerProvider: BenchmarkAllowed's figures), on but sampled out (the
// span is started and dropped), and on with every request recorded by the
// SDK (no exporter: the instrumentation's own cost).
//
//	go test -run '^$' -bench 'Allowed|Tracing' -benchmem ./httplimit
func BenchmarkTracing(b *testing.B) {
	for _, c := range []struct {
		name string
		tp   trace.TracerProvider
	}{
		{"off", nil},
		{"unsampled", sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()))},
		{"sampled", sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))},
	} {
		b.Run(c.name, func(b *testing.B) {
			p := mustPolicy(b, "per-ip", floodgate.Rule{Algorithm: floodgate.TokenBucket, Limit: 1e9, Period: time.Second})
			mw, err := httplimit.New(httplimit.Options{Config: gate.Config{TracerProvider: c.tp, Limits: []gate.Limit{{Name: "per-ip", Policy: p, Key: []gate.Part{gate.IP()}}}}})
			if err != nil {
				b.Fatal(err)
			}
			defer mw.Close()
			h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(200) }))
			reqs := make([]*http.Request, 1000)
			for i := range reqs {
				reqs[i], _ = http.NewRequest("GET", "http://example.com/", nil)
				reqs[i].RemoteAddr = "10.0." + strconv.Itoa(i/256%256) + "." + strconv.Itoa(i%256) + ":1234"
			}
			w := &discard{h: http.Header{}}
			for i := range reqs {
				h.ServeHTTP(w, reqs[i])
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				clear(w.h)
				h.ServeHTTP(w, reqs[i%len(reqs)])
			}
		})
	}
}

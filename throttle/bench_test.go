package throttle

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// The admission path on an unloaded server: Enter (admitted at once) and
// Done (the cost model, the adaptive controller, the books), on the
// precise clock.
func BenchmarkAdmit(b *testing.B) {
	for _, adaptive := range []bool{false, true} {
		name := "fixed"
		c := Config{Limit: 1 << 20}
		if adaptive {
			name, c.Adaptive = "adaptive", &AdaptiveConfig{}
		}
		b.Run(name, func(b *testing.B) {
			th := New(c)
			k := RouteKey{"GET", "GET /items/{id}"}
			b.ReportAllocs()
			for b.Loop() {
				tk, _ := th.Enter(k, Critical, 0)
				tk.Done()
			}
		})
		b.Run(name+"/parallel", func(b *testing.B) {
			th := New(c)
			k := RouteKey{"GET", "GET /items/{id}"}
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					tk, _ := th.Enter(k, Critical, 0)
					tk.Done()
				}
			})
		})
	}
}

// The middleware around an empty handler, against the bare handler in
// the same run: the difference is the admission path as net/http sees it
// (the header read, the route key, Enter, Done).
func BenchmarkMiddleware(b *testing.B) {
	empty := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	th := New(Config{Limit: 1 << 20, Adaptive: &AdaptiveConfig{}})
	for _, c := range []struct {
		name string
		h    http.Handler
	}{
		{"bare", empty},
		{"throttled", th.Middleware(MiddlewareOptions{})(empty)},
		{"throttled/sheddable", th.Middleware(MiddlewareOptions{})(empty)},
	} {
		b.Run(c.name, func(b *testing.B) {
			req := httptest.NewRequest("GET", "/items/7", nil)
			req.Pattern = "GET /items/{id}"
			if c.name == "throttled/sheddable" {
				req.Header.Set("X-Criticality", "SHEDDABLE") // a level other than the default: into the context
			}
			w := httptest.NewRecorder()
			b.ReportAllocs()
			for b.Loop() {
				c.h.ServeHTTP(w, req)
			}
		})
	}
}

package httplimit_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/gate"
	"github.com/floodgate/floodgate/httplimit"
)

// Limit every client address to 2 requests a minute, and each API key to
// 100 an hour, in front of any router.
func Example() {
	perIP := floodgate.MustPolicy("per-ip", floodgate.Rule{Algorithm: floodgate.TokenBucket, Limit: 2, Period: time.Minute})
	perKey := floodgate.MustPolicy("per-key", floodgate.Rule{Algorithm: floodgate.SlidingWindow, Limit: 100, Period: time.Hour})
	mw, err := httplimit.New(httplimit.Options{Config: gate.Config{
		// Believe X-Forwarded-For only from the load balancer.
		ClientIP: gate.ClientIP{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}},
		Limits: []gate.Limit{
			{Name: "per-ip", Policy: perIP, Key: []gate.Part{gate.IP()}},
			{Name: "per-key", Policy: perKey, Key: []gate.Part{gate.Header("X-API-Key").Or(gate.MissingSkip)}},
		},
	}})
	if err != nil {
		panic(err)
	}
	defer mw.Close()

	mux := http.NewServeMux()
	mux.HandleFunc("GET /hello", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "hello") })
	handler := mw.Handler(mux) // http.ListenAndServe(":8080", handler)

	for i := 0; i < 3; i++ {
		req := httptest.NewRequest("GET", "/hello", nil)
		req.RemoteAddr = "192.0.2.1:4711"
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, req)
		fmt.Println(rec.Code, rec.Header().Get("RateLimit-Policy"))
	}
	// Output:
	// 200 "per-ip";q=2;w=60
	// 200 "per-ip";q=2;w=60
	// 429 "per-ip";q=2;w=60
}

package throttle_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"time"

	"github.com/floodgate/floodgate/throttle"
)

// A handler that calls another service passes its request's criticality
// on: the Transport sets the header from the context.
func ExampleTransport() {
	client := &http.Client{Transport: &throttle.Transport{}}
	ctx := throttle.WithCriticality(context.Background(), throttle.SheddablePlus)
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://backend.internal/x", nil)
	_ = req // client.Do(req) sends X-Criticality: SHEDDABLE_PLUS
	_ = client
	c, _ := throttle.FromContext(ctx)
	fmt.Println(c)
	// Output: SHEDDABLE_PLUS
}

func ExampleParseCriticality() {
	for _, v := range []string{"critical_plus", "prefetch"} {
		c, ok := throttle.ParseCriticality(v)
		fmt.Println(c, ok)
	}
	// Output:
	// CRITICAL_PLUS true
	// CRITICAL false
}

// Put the throttler in front of a mux: at most 2×GOMAXPROCS requests at
// once at first, the limit then learned from latency, and a queue
// holding up to 200 ms of predicted CPU work, none of it waiting more
// than half a second. A shed request gets 503 with Retry-After.
func ExampleThrottler_Middleware() {
	th := throttle.New(throttle.Config{
		Adaptive:     &throttle.AdaptiveConfig{},
		MaxQueueCost: 200 * time.Millisecond,
		MaxWait:      500 * time.Millisecond,
	})
	mux := http.NewServeMux()
	mux.HandleFunc("GET /report/{id}", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "report") })
	handler := th.Middleware(throttle.MiddlewareOptions{Mux: mux})(mux) // http.ListenAndServe(":8080", handler)

	req := httptest.NewRequest("GET", "/report/7", nil)
	req.Header.Set("X-Criticality", "SHEDDABLE")
	rec := httptest.NewRecorder()
	handler.ServeHTTP(rec, req)
	fmt.Print(rec.Code, " ", rec.Body.String())
	// Output: 200 report
}

// The throttler without HTTP: Enter, Wait if queued, run, Done.
func ExampleThrottler_Enter() {
	th := throttle.New(throttle.Config{Limit: 1, MaxQueueCost: 50 * time.Millisecond})
	k := throttle.RouteKey{Method: "RPC", Route: "/inventory.Stock/Get"}
	tk, err := th.Enter(k, throttle.Critical, 0)
	if err != nil {
		fmt.Println("shed:", err)
		return
	}
	if err := tk.Wait(context.Background()); err != nil {
		fmt.Println("shed:", err)
		return
	}
	// ... do the work ...
	tk.DoneCost(3 * time.Millisecond) // or tk.Done() to let the throttler estimate it
	fmt.Println(th.Predict(k))
	// Output: 3ms
}

// Take the level a request claims as it is only from your own front
// proxy (here by peer address; r.TLS.VerifiedChains for an mTLS
// identity). Anyone else may lower its level but never raise it above
// the ceiling, DefaultCriticality (CRITICAL) unless Ceiling says
// otherwise: a public client's CRITICAL_PLUS runs as CRITICAL, and the
// handler (and a Transport it calls through) sees CRITICAL.
func ExampleMiddlewareOptions_trusted() {
	th := throttle.New(throttle.Config{Adaptive: &throttle.AdaptiveConfig{}, MaxQueueCost: 200 * time.Millisecond})
	front := netip.MustParsePrefix("10.0.0.0/8")
	handler := th.Middleware(throttle.MiddlewareOptions{
		Trusted: func(r *http.Request) bool {
			ap, err := netip.ParseAddrPort(r.RemoteAddr)
			return err == nil && front.Contains(ap.Addr())
		},
	})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, _ := throttle.FromContext(r.Context())
		fmt.Println(r.RemoteAddr, "runs at", c, "header", r.Header.Get("X-Criticality"))
	}))
	for _, from := range []string{"203.0.113.9:4711", "10.1.2.3:4711"} {
		req := httptest.NewRequest("GET", "/", nil)
		req.RemoteAddr = from
		req.Header.Set("X-Criticality", "CRITICAL_PLUS")
		handler.ServeHTTP(httptest.NewRecorder(), req)
	}
	// Output:
	// 203.0.113.9:4711 runs at CRITICAL header CRITICAL
	// 10.1.2.3:4711 runs at CRITICAL_PLUS header CRITICAL_PLUS
}

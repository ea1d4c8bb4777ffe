package httplimit_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/gate"
	"github.com/floodgate/floodgate/httplimit"
)

// Limit each signed-in user rather than each address: the authentication
// middleware, running first, names the user with gate.WithUser, and
// gate.User keys the limit by it. Render writes the refusal's body.
func Example_perUser() {
	clk := clock.NewManual(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	perUser := floodgate.MustPolicy("per-user", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 2, Period: time.Hour})
	mw, err := httplimit.New(httplimit.Options{
		Config: gate.Config{Clock: clk, Limits: []gate.Limit{
			{Name: "per-user", Policy: perUser, Key: []gate.Part{gate.User()}},
		}},
		Render: func(w http.ResponseWriter, r *http.Request, v *gate.Verdict) {
			w.WriteHeader(http.StatusTooManyRequests)
			fmt.Fprintf(w, "slow down, %s: try again in %s", r.Header.Get("X-User"), v.Deciding.Decision.RetryAfter)
		},
	})
	if err != nil {
		panic(err)
	}
	defer mw.Close()

	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") })
	auth := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			user := r.Header.Get("X-User") // a real service checks a session or token here
			next.ServeHTTP(w, r.WithContext(gate.WithUser(r.Context(), user)))
		})
	}
	handler := auth(mw.Handler(app))

	for _, user := range []string{"alice", "alice", "bob", "alice"} {
		req := httptest.NewRequest("GET", "/orders", nil)
		req.Header.Set("X-User", user)
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, req)
		fmt.Println(user, rec.Code, rec.Body.String())
	}
	// Output:
	// alice 200 ok
	// alice 200 ok
	// bob 200 ok
	// alice 429 slow down, alice: try again in 1h0m0s
}

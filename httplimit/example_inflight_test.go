package httplimit_test

import (
	"net/http"

	"github.com/floodgate/floodgate/httplimit"
	"github.com/floodgate/floodgate/inflight"
)

// At most 4 requests in flight per API key; more get 429 with Retry-After.
func ExampleNewInFlight() {
	slots, _ := inflight.NewMemory(inflight.MemoryOptions{Limit: 4})
	capped, err := httplimit.NewInFlight(httplimit.InFlightOptions{
		Limiter: slots,
		Key: func(r *http.Request) (string, bool) {
			k := r.Header.Get("X-Api-Key")
			return k, k != ""
		},
	})
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/report", func(w http.ResponseWriter, r *http.Request) { /* slow work */ })
	_ = http.Handler(capped.Handler(mux)) // http.ListenAndServe(addr, capped.Handler(mux))
}

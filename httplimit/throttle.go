package httplimit

import (
	"net/http"

	"github.com/floodgate/floodgate/throttle"
)

// Throttled returns middleware that puts the gate's limits in front of
// t's admission control: a request over its quota is refused by the gate
// (429, or the limit's status) before it can take a place in the
// admission queue or a slot; one within its quota is admitted by t, or
// shed with 503 and Retry-After when the server has no room
// (throttle.Throttler.Middleware). A quota refusal therefore stays 429 and
// overload is 503, so clients and dashboards can tell them apart.
func (m *Middleware) Throttled(t *throttle.Throttler, o throttle.MiddlewareOptions) func(http.Handler) http.Handler {
	admit := t.Middleware(o)
	return func(next http.Handler) http.Handler { return m.Handler(admit(next)) }
}

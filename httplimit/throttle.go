package httplimit

import (
	"net/http"

	"github.com/floodgate/floodgate/gate"
	"github.com/floodgate/floodgate/throttle"
)

// Throttled returns middleware that puts t's admission control in front
// of the gate's limits: a request is admitted by t first — at once, after
// a wait in the admission queue, or shed with 503 and Retry-After when
// the server has no room — and only an admitted request is decided by
// the gate, so a shed request never spends quota. One the gate refuses
// (429, or the limit's status) gives its slot back at once
// (throttle.Ticket.Release: no completion counted); one it allows runs
// and holds its slot until next returns. One it delays (gate.Delay)
// holds no slot and no queued cost while it waits: it gives its slot
// back when the delay starts and is admitted again, as any arrival, when
// the delay ends (throttle.DelayClock, which New gives the gate); shed
// then, it is answered 503 with Retry-After and the gate gives back what
// the delay reserved, so it spends no quota. A client that leaves during
// the delay, or while it waits its turn after it, frees everything. A
// quota refusal is therefore 429 and overload is 503, so clients and
// dashboards can tell them apart; a request over its quota while the
// server is full is shed (503) or waits in the queue like any other, and
// is refused 429 at its turn.
//
// A request's level: o.Criticality's if set; else the criticality of
// its route (gate.Limit.Criticality, the first matching limit that sets
// one; else o.Ceiling's, if set; else throttle.DefaultCriticality) is its
// ceiling, and the level it claims in o.Header may lower it, never raise
// it, unless the request comes from one of the gate's trusted proxies
// (ClientIP.TrustedProxies) or o.Trusted trusts it, whose claim is taken
// as it is (throttle.Claim). The handler sees the level it runs at, in
// its context and in o.Header if the request had one (throttle.Stamp),
// so throttle.Transport propagates that level, never the raw claim. The
// cost model's route key is o.Key's, else the method and the route
// pattern (o.Mux's), else the first matching limit's name.
func (m *Middleware) Throttled(t *throttle.Throttler, o throttle.MiddlewareOptions) func(http.Handler) http.Handler {
	if o.Header == "" {
		o.Header = throttle.DefaultHeader
	}
	o.Header = http.CanonicalHeaderKey(o.Header)
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if m.polls != nil && m.servePoll(w, r) {
				return
			}
			key, crit := m.throttleClass(r, &o)
			var deadline int64
			if d, ok := r.Context().Deadline(); ok {
				deadline = d.UnixMicro()
			}
			tk, err := t.Admit(r.Context(), key, crit, deadline)
			if err != nil {
				throttle.WriteShed(w, r, crit, err, o.RetryAfter)
				return
			}
			v := verdicts.Get().(*gate.Verdict)
			// a delay gives the slot back while it lasts and takes one
			// again when it ends, or is shed then (throttle.DelayClock)
			m.check(r, tk.Context(r.Context()), v)
			shed := throttle.IsShed(v.Err)
			if !shed {
				m.respond(w, r, v)
			}
			if m.observe != nil {
				m.observe(r, v)
			}
			if shed {
				// shed when its delay ended: the gate gave back what the
				// delay reserved, so it spends no quota
				err := v.Err
				verdicts.Put(v)
				tk.Recycle()
				throttle.WriteShed(w, r, crit, err, o.RetryAfter)
				return
			}
			allowed := v.Allowed
			verdicts.Put(v)
			if !allowed {
				tk.Release()
				tk.Recycle()
				return
			}
			defer tk.Recycle() // after Serve, even if next panics
			tk.Serve(w, throttle.Stamp(r, o.Header, crit), next, o.ThreadCPU)
		})
	}
}

// throttleClass returns r's key in the cost model and its level (see
// Throttled).
func (m *Middleware) throttleClass(r *http.Request, o *throttle.MiddlewareOptions) (throttle.RouteKey, throttle.Criticality) {
	var c gate.Class
	if o.Key == nil || o.Criticality == nil {
		c = m.gate.Classify(&gate.Request{HTTP: r, Peer: r.RemoteAddr})
	}
	key := throttle.RouteKey{Method: r.Method, Route: r.Pattern}
	switch {
	case o.Key != nil:
		key = o.Key(r)
	case key.Route == "" && o.Mux != nil:
		_, key.Route = o.Mux.Handler(r)
	case key.Route == "":
		key.Route = c.Route
	}
	if o.Criticality != nil {
		return key, o.Criticality(r)
	}
	ceiling := throttle.DefaultCriticality
	switch {
	case c.Criticality != "":
		ceiling, _ = throttle.ParseCriticality(c.Criticality)
	case o.Ceiling != nil:
		ceiling = o.Ceiling(r) // Claim takes an invalid one as the default
	}
	vals := r.Header[o.Header]
	trusted := len(vals) > 0 && (m.gate.TrustedPeer(r.RemoteAddr) || o.Trusted != nil && o.Trusted(r))
	return key, throttle.Claim(vals, ceiling, trusted)
}

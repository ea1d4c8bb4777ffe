package throttle

import (
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// MiddlewareOptions configures Middleware.
type MiddlewareOptions struct {
	// Header is the request header criticality is read from;
	// DefaultHeader if empty.
	Header string
	// Criticality, if set, decides a request's level instead of the
	// header (by route, by authenticated client, ...), overriding
	// Ceiling and Trusted; it may call FromHeader or Claim itself.
	Criticality func(*http.Request) Criticality
	// Ceiling, if set, is the highest level a request may claim in
	// Header (by route, by client); DefaultCriticality (CRITICAL) if nil
	// or if it returns an invalid level. A request that claims no level,
	// or one that names none of the four, runs at its ceiling; one that
	// claims a lower level runs at that level; one that claims a higher
	// level runs at the ceiling, unless Trusted says its source is
	// trusted (Claim). A fixed ceiling:
	//
	//	Ceiling: func(*http.Request) throttle.Criticality { return throttle.SheddablePlus }
	Ceiling func(*http.Request) Criticality
	// Trusted, if set, reports whether a request comes from a source
	// whose claimed level is taken as it is, above the ceiling too: a
	// front proxy or a service of yours, recognized by its peer address
	// (r.RemoteAddr) or its mTLS identity (r.TLS.VerifiedChains). It
	// is asked only for a request that has the header. nil trusts no
	// one: by default any client can lower its own level but never raise
	// it above the ceiling, so a public client cannot send CRITICAL_PLUS
	// to jump the queue or escape shedding.
	Trusted func(*http.Request) bool
	// Key, if set, keys the cost model instead of the default, the
	// method and the route pattern (http.Request.Pattern: set when the
	// middleware wraps a handler registered on a ServeMux; when it wraps
	// the mux itself, set Mux so the pattern can be looked up).
	Key func(*http.Request) RouteKey
	// Mux, if set, is asked for the pattern of requests whose Pattern is
	// empty.
	Mux *http.ServeMux
	// RetryAfter is the Retry-After of a shed request, rounded up to
	// whole seconds; 1 s if 0.
	RetryAfter time.Duration
	// ThreadCPU measures each request's cost as its handler's CPU time,
	// read from the thread it ran on (Linux: getrusage(RUSAGE_THREAD),
	// with the goroutine locked to its thread while the handler runs; CPU
	// spent in goroutines the handler starts is not counted). Elsewhere,
	// and when false, the cost is the handler's wall time scaled by the
	// share of the processors it had (Ticket.Done).
	ThreadCPU bool
}

// Middleware returns net/http middleware that admits each request
// through t: at once, after a wait in the queue, or not at all. A shed
// request (queue full, evicted, dropped at its deadline) is answered 503
// Service Unavailable with Retry-After and Cache-Control: no-store, and
// a problem-details body (RFC 9457) when the client accepts
// application/problem+json, else a line of text.
//
// A request's level is o.Criticality's if set; otherwise what it claims
// in o.Header, capped at o.Ceiling (DefaultCriticality by default)
// unless o.Trusted trusts its source (see MiddlewareOptions.Ceiling and
// Claim): an untrusted client may lower its level, never raise it. The
// level it runs at is put in its context (when other than
// DefaultCriticality, or when the request had the header), so a
// Transport propagates that level, never the raw claim; and when the
// header said anything other than that level (a claim capped or
// unreadable), the handler sees the header rewritten to it (on a copy
// of the request), so that a handler forwarding the request's headers
// (httputil.ReverseProxy) does not pass the raw claim on either.
func (t *Throttler) Middleware(o MiddlewareOptions) func(http.Handler) http.Handler {
	if o.Header == "" {
		o.Header = DefaultHeader
	}
	o.Header = http.CanonicalHeaderKey(o.Header)
	secs := max(1, int64((o.RetryAfter+time.Second-1)/time.Second))
	retry := []string{strconv.FormatInt(secs, 10)}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			t.serve(w, r, next, &o, retry)
		})
	}
}

func (t *Throttler) serve(w http.ResponseWriter, r *http.Request, next http.Handler, o *MiddlewareOptions, retry []string) {
	crit := o.level(r)
	key := routeKey(r, o)
	var deadline int64
	if d, ok := r.Context().Deadline(); ok {
		deadline = d.UnixMicro()
	}
	tk := ticketPool.Get().(*Ticket)
	// A pooled ticket goes back only when nothing refers to it: refused,
	// out of the queue (admitted, evicted, expired, withdrawn) and done.
	defer ticketPool.Put(tk)
	*tk = Ticket{}
	_, err := t.enter(tk, key, crit, deadline)
	if err == nil {
		err = tk.Wait(r.Context())
	}
	if err != nil {
		writeShed(w, r, crit, err, retry)
		return
	}
	r = Stamp(r, o.Header, crit)
	if o.ThreadCPU && threadCPUSupported {
		runThreadCPU(tk, w, r, next)
		return
	}
	defer tk.Done()
	next.ServeHTTP(w, r)
}

// level is r's criticality under o (see Middleware).
func (o *MiddlewareOptions) level(r *http.Request) Criticality {
	var crit Criticality
	if o.Criticality != nil {
		crit = o.Criticality(r)
	} else {
		ceiling := DefaultCriticality
		if o.Ceiling != nil {
			ceiling = o.Ceiling(r) // Claim takes an invalid one as the default
		}
		vals := r.Header[o.Header]
		crit = Claim(vals, ceiling, len(vals) > 0 && o.Trusted != nil && o.Trusted(r))
	}
	if !crit.Valid() {
		crit = DefaultCriticality
	}
	return crit
}

// Stamp returns r as a handler admitted at level crit sees it, so that
// what it passes on is crit, never what the client claimed: its context
// carries crit (WithCriticality) when crit is not DefaultCriticality or
// r has the header name (DefaultHeader if empty); and when that header
// says anything other than crit (a claim capped at its ceiling, an
// unreadable value, several values), it is replaced by crit's name, on a
// copy of r and of its header (r is not changed). A request with no such
// header and the default level is returned as it is, without allocating.
func Stamp(r *http.Request, name string, crit Criticality) *http.Request {
	if !crit.Valid() {
		crit = DefaultCriticality
	}
	if name == "" {
		name = DefaultHeader
	}
	name = http.CanonicalHeaderKey(name)
	vals, had := r.Header[name]
	if !had && crit == DefaultCriticality {
		return r
	}
	r = r.WithContext(WithCriticality(r.Context(), crit))
	if had && (len(vals) != 1 || vals[0] != crit.String()) {
		r.Header = r.Header.Clone()
		r.Header[name] = []string{crit.String()}
	}
	return r
}

func routeKey(r *http.Request, o *MiddlewareOptions) RouteKey {
	if o.Key != nil {
		return o.Key(r)
	}
	p := r.Pattern
	if p == "" && o.Mux != nil {
		_, p = o.Mux.Handler(r)
	}
	return RouteKey{Method: r.Method, Route: p}
}

var (
	problemType = []string{"application/problem+json"}
	textType    = []string{"text/plain; charset=utf-8"}
	noStore     = []string{"no-store"}
)

// writeShed answers a shed request: 503, never 429 (a quota refusal is
// 429; this says the server, not the client's quota, is out of room).
func writeShed(w http.ResponseWriter, r *http.Request, crit Criticality, err error, retry []string) {
	h := w.Header()
	h["Retry-After"] = retry
	h["Cache-Control"] = noStore
	reason := "queue_full"
	switch err {
	case ErrEvicted:
		reason = "evicted"
	case ErrExpired:
		reason = "deadline"
	case ErrQueueFull:
	default:
		reason = "canceled"
	}
	if wantsProblem(r.Header["Accept"]) {
		h["Content-Type"] = problemType
		w.WriteHeader(http.StatusServiceUnavailable)
		b := make([]byte, 0, 192)
		b = append(b, `{"type":"about:blank","title":"Service Unavailable","status":503,"detail":"the server is overloaded and shed this request","reason":"`...)
		b = append(b, reason...)
		b = append(b, `","criticality":"`...)
		b = append(b, crit.String()...)
		b = append(b, `","retry_after":`...)
		b = append(b, retry[0]...)
		w.Write(append(b, "}\n"...)) //nolint:errcheck // the client may be gone
		return
	}
	h["Content-Type"] = textType
	w.WriteHeader(http.StatusServiceUnavailable)
	w.Write([]byte("server overloaded (" + reason + "); retry in " + retry[0] + " s\n")) //nolint:errcheck // the client may be gone
}

// wantsProblem reports whether an Accept header line names
// application/problem+json with a q other than 0.
func wantsProblem(accept []string) bool {
	for _, a := range accept {
		for part := range strings.SplitSeq(a, ",") {
			t, params, _ := strings.Cut(part, ";")
			if strings.EqualFold(strings.TrimSpace(t), "application/problem+json") && !zeroQ(params) {
				return true
			}
		}
	}
	return false
}

// zeroQ reports whether media-type parameters carry q=0 (refused).
func zeroQ(params string) bool {
	for p := range strings.SplitSeq(params, ";") {
		k, v, _ := strings.Cut(strings.TrimSpace(p), "=")
		if strings.EqualFold(k, "q") {
			q, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return err == nil && q <= 0
		}
	}
	return false
}

var ticketPool = sync.Pool{New: func() any { return new(Ticket) }}

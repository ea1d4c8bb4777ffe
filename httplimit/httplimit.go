// Package httplimit is Floodgate's net/http middleware: it limits the
// requests a handler sees, by client address, header, cookie, path, route,
// method, query parameter, region or user, alone or combined, with the
// limits and actions of package gate. It works with any router:
//
//	mw, err := httplimit.New(httplimit.Options{Config: gate.Config{
//		Limits: []gate.Limit{{Name: "per-ip", Policy: perIP, Key: []gate.Part{gate.IP()}}},
//	}})
//	...
//	http.ListenAndServe(addr, mw.Handler(mux))
//
// A response to a request a limit applies to carries RateLimit-Policy and
// RateLimit (draft-ietf-httpapi-ratelimit-headers-11) so clients can pace
// themselves; a refused request gets 429 (or the limit's status) with
// Retry-After and a short body in JSON or text, as the client's Accept
// header prefers, or whatever Options.Render writes. When the store could
// not be asked, the fields claim no count it did not make (see
// gate.Headers): a request refused for that gets 503 Service Unavailable,
// Retry-After: 1 and a body saying the rate limiter is unavailable; one a
// failure mode let through gets RateLimit-Policy without RateLimit.
package httplimit

import (
	"context"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/floodgate/floodgate/gate"
	"github.com/floodgate/floodgate/throttle"
)

// Options configure the middleware.
type Options struct {
	gate.Config
	// Legacy adds X-RateLimit-Limit, -Remaining and -Reset.
	Legacy bool
	// Render, when set, writes the body and status of a refused request
	// (the rate-limit headers are already set). v.Deciding says which
	// limit refused it and when to retry; v.StoreUnavailable, that it was
	// refused because the store could not be asked (the default answer is
	// then 503).
	Render func(w http.ResponseWriter, r *http.Request, v *gate.Verdict)
	// Observe, when set, sees every verdict (for metrics and logs); it
	// must not keep v, which is recycled. For a request Throttled sheds
	// as its delay ends, v.Err is the throttler's (throttle.IsShed).
	Observe func(r *http.Request, v *gate.Verdict)
	// Defer holds the queue of each limit with action gate.Defer, by
	// limit name (a *deferq.Queue, whose Interval should be the limit's
	// DeferInterval); New fails if one is missing. A request over such a
	// limit is queued and answered 202 Accepted with a Location under
	// DeferPollPrefix, which Handler answers on the same listener
	// before any limit applies. Workers delivering the queue
	// (deferq.Queue.Run with deferq.ToHandler(next) or ToUpstream) are the
	// caller's to run.
	Defer map[string]Deferrer
}

// Middleware limits requests. It is safe for concurrent use.
type Middleware struct {
	gate    *gate.Gate
	legacy  bool
	render  func(w http.ResponseWriter, r *http.Request, v *gate.Verdict)
	observe func(r *http.Request, v *gate.Verdict)
	defers  map[string]Deferrer // by limit name
	polls   map[string]Deferrer // by queue name
}

// New builds the middleware.
func New(opts Options) (*Middleware, error) {
	// A request Throttled admitted gives its slot back while the gate
	// delays it (throttle.DelayClock); others sleep on Clock as they are.
	opts.Config.Clock = throttle.DelayClock(opts.Config.Clock)
	g, err := gate.New(opts.Config)
	if err != nil {
		return nil, err
	}
	polls, err := checkDefer(g, opts.Defer)
	if err != nil {
		g.Close()
		return nil, err
	}
	return &Middleware{gate: g, legacy: opts.Legacy, render: opts.Render, observe: opts.Observe, defers: opts.Defer, polls: polls}, nil
}

// Gate returns the middleware's gate (to lift bans, say).
func (m *Middleware) Gate() *gate.Gate { return m.gate }

// Close releases the store the middleware made for itself, if any.
func (m *Middleware) Close() { m.gate.Close() }

// Handler wraps next: the middleware's func(http.Handler) http.Handler.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { m.ServeNext(w, r, next) })
}

// ServeNext limits one request to next: next serves it if it passes, else
// the refusal is written. Handler(next) is ServeNext bound to next.
func (m *Middleware) ServeNext(w http.ResponseWriter, r *http.Request, next http.Handler) {
	if m.polls != nil && m.servePoll(w, r) {
		return
	}
	v := verdicts.Get().(*gate.Verdict)
	m.Serve(w, r, v)
	if m.observe != nil {
		m.observe(r, v)
	}
	allowed := v.Allowed
	verdicts.Put(v)
	if allowed {
		next.ServeHTTP(w, r)
	}
}

// Verdicts are large (a few outcomes inline, so that a request allocates
// none): recycle them.
var verdicts = sync.Pool{New: func() any { return new(gate.Verdict) }}

// Serve decides r into v and, when it is refused, writes the response;
// when v.Allowed the caller serves the request. The rate-limit headers are
// set on w either way.
func (m *Middleware) Serve(w http.ResponseWriter, r *http.Request, v *gate.Verdict) {
	m.check(r, nil, v)
	m.respond(w, r, v)
}

// check decides r into v, with ctx as the gate's context (r's if nil).
func (m *Middleware) check(r *http.Request, ctx context.Context, v *gate.Verdict) {
	req := gate.Request{HTTP: r, Peer: r.RemoteAddr, Ctx: ctx}
	m.gate.Check(&req, v)
}

// respond sets the rate-limit headers of v on w and, when v is refused,
// writes the refusal (Serve).
func (m *Middleware) respond(w http.ResponseWriter, r *http.Request, v *gate.Verdict) {
	h := w.Header()
	gate.Headers(v, m.legacy, func(k string, vals []string) { h[k] = vals })
	if v.Allowed {
		return
	}
	if v.Err != nil && v.Deciding == nil {
		// The client went away while it waited.
		return
	}
	o := v.Deciding
	if o != nil && o.Limit.Action == gate.Redirect && !v.StoreUnavailable() {
		http.Redirect(w, r, o.Limit.Redirect, o.Limit.RedirectStatus)
		return
	}
	if o != nil && o.Limit.Action == gate.Defer && !v.StoreUnavailable() {
		if q := m.defers[o.Limit.Name]; q != nil {
			q.Accept(w, r)
			return
		}
	}
	if m.render != nil {
		m.render(w, r, v)
		return
	}
	WriteRefusal(w, r, v)
}

// WriteRefusal writes the default refusal: the limit's status (429 by
// default) and a short body, JSON when the client accepts JSON, else
// text. A request refused because the store could not be asked
// (v.StoreUnavailable) gets 503 Service Unavailable and a body saying the
// rate limiter is unavailable: {"error":"rate_limiter_unavailable",...},
// or "rate limiter unavailable (NAME); retry in 1 s".
func WriteRefusal(w http.ResponseWriter, r *http.Request, v *gate.Verdict) {
	status, json, body := appendRefusal(nil, wantsJSON(r.Header["Accept"]), v)
	h := w.Header()
	h["Cache-Control"] = noStore
	if json {
		h["Content-Type"] = jsonType
	} else {
		h["Content-Type"] = textType
	}
	w.WriteHeader(status)
	w.Write(body) //nolint:errcheck // the client may be gone
}

// Refusal is WriteRefusal for another HTTP server (fasthttp, say): the
// status, Content-Type and body of the default refusal of v, the body
// appended to dst, for a client whose Accept header lines are accept.
// The response also carries Cache-Control: no-store and the fields of
// gate.Headers.
func Refusal(dst []byte, accept []string, v *gate.Verdict) (status int, contentType string, body []byte) {
	status, json, body := appendRefusal(dst, wantsJSON(accept), v)
	if json {
		return status, jsonType[0], body
	}
	return status, textType[0], body
}

func appendRefusal(dst []byte, json bool, v *gate.Verdict) (status int, isJSON bool, body []byte) {
	status, name, retry := http.StatusTooManyRequests, "", int64(1)
	if o := v.Deciding; o != nil {
		status, name = o.Limit.Status, o.Limit.Name
		retry = max(1, (int64(o.Decision.RetryAfter)+999_999_999)/1_000_000_000)
	}
	unavailable := v.StoreUnavailable()
	if unavailable {
		status = http.StatusServiceUnavailable
	}
	if json {
		dst = slices.Grow(dst, 64+len(name)) // one allocation, mostly
		if unavailable {
			dst = append(dst, `{"error":"rate_limiter_unavailable","limit":`...)
		} else {
			dst = append(dst, `{"error":"rate_limited","limit":`...)
		}
		dst = strconv.AppendQuote(dst, name)
		dst = append(dst, `,"retry_after":`...)
		dst = strconv.AppendInt(dst, retry, 10)
		return status, true, append(dst, "}\n"...)
	}
	dst = slices.Grow(dst, 44+len(name))
	if unavailable {
		dst = append(dst, "rate limiter unavailable ("...)
	} else {
		dst = append(dst, "rate limit exceeded ("...)
	}
	dst = append(dst, name...)
	dst = append(dst, "); retry in "...)
	dst = strconv.AppendInt(dst, retry, 10)
	return status, false, append(dst, " s\n"...)
}

var (
	noStore  = []string{"no-store"}
	jsonType = []string{"application/json"}
	textType = []string{"text/plain; charset=utf-8"}
)

// wantsJSON reports whether the Accept header lines prefer JSON to text.
func wantsJSON(accept []string) bool {
	for _, a := range accept {
		for a != "" {
			var t string
			if i := strings.IndexByte(a, ','); i >= 0 {
				t, a = a[:i], a[i+1:]
			} else {
				t, a = a, ""
			}
			t, _, _ = strings.Cut(t, ";")
			t = strings.TrimSpace(t)
			switch {
			case strings.EqualFold(t, "application/json"), strings.EqualFold(t, "application/problem+json"):
				return true
			case strings.EqualFold(t, "text/plain"), strings.EqualFold(t, "text/html"), strings.EqualFold(t, "text/*"):
				return false
			}
		}
	}
	return false
}

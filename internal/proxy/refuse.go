package proxy

import (
	"net/http"
	"net/url"

	"github.com/valyala/fasthttp"

	"github.com/floodgate/floodgate/gate"
	"github.com/floodgate/floodgate/httplimit"
)

// setRateLimit writes the verdict's RateLimit fields over whatever the
// response has under their names. A verdict a failure mode made without
// the store has no RateLimit (nobody counted what remains): the
// upstream's, if it sent one, is dropped too, as a client would take it
// for the proxy's.
func (p *Proxy) setRateLimit(h *fasthttp.ResponseHeader, v *gate.Verdict) {
	if v.Degraded() {
		h.Del(gate.HeaderRateLimit)
		h.Del(gate.HeaderPolicy)
		if p.legacy {
			h.Del(gate.HeaderLimit)
			h.Del(gate.HeaderRemaining)
			h.Del(gate.HeaderReset)
		}
	}
	gate.Headers(v, p.legacy, func(k string, vals []string) {
		for i, val := range vals {
			if i == 0 {
				h.SetCanonical(s2b(k), s2b(val))
			} else {
				h.AddBytesKV(s2b(k), s2b(val))
			}
		}
	})
}

var (
	hdrCacheControl = []byte("Cache-Control")
	hdrNoStore      = []byte("no-store")
)

// refuse writes the refusal httplimit would: the limit's status, its
// fields, and a short body in JSON or text; or its redirect; or, refused
// because the store could not be asked, 503 (httplimit.Refusal). skipped:
// the request's body was left unread (headerReceived).
func (p *Proxy) refuse(ctx *fasthttp.RequestCtx, v *gate.Verdict, skipped bool) {
	// A body the client is still sending would be read as the next
	// request: close the connection after the refusal instead.
	if skipped || ctx.Request.IsBodyStream() && ctx.Request.Header.ContentLength() != 0 && !bodyPrefetched(&ctx.Request) {
		ctx.SetConnectionClose()
	}
	resp := &ctx.Response
	p.setRateLimit(&resp.Header, v)
	if v.Err != nil && v.Deciding == nil {
		// The client went away while it waited (net/http's version wrote
		// nothing).
		ctx.SetConnectionClose()
		return
	}
	if o := v.Deciding; o != nil && o.Limit.Action == gate.Redirect && !v.StoreUnavailable() {
		p.redirect(ctx, o.Limit.Redirect, o.Limit.RedirectStatus)
		return
	}
	var accept []string
	var one [1]string
	if vals := ctx.Request.Header.PeekAll("Accept"); len(vals) == 1 {
		one[0] = b2s(vals[0])
		accept = one[:]
	} else {
		for _, a := range vals {
			accept = append(accept, string(a))
		}
	}
	var buf [128]byte
	status, ctype, body := httplimit.Refusal(buf[:0], accept, v)
	resp.SetStatusCode(status)
	resp.Header.SetCanonical(hdrCacheControl, hdrNoStore)
	resp.Header.SetContentType(ctype)
	resp.SetBody(body)
}

// bodyPrefetched reports whether the server read the request's whole body
// with its headers.
func bodyPrefetched(r *fasthttp.Request) bool {
	n := r.Header.ContentLength()
	return n >= 0 && n <= prefetchedBody
}

// redirect answers as net/http's http.Redirect does.
func (p *Proxy) redirect(ctx *fasthttp.RequestCtx, to string, code int) {
	w := &headerRecorder{h: http.Header{}}
	r := &http.Request{Method: string(ctx.Method()), URL: &url.URL{Path: string(ctx.Path())}, Header: http.Header{}}
	http.Redirect(w, r, to, code)
	for k, vals := range w.h {
		for i, val := range vals {
			if i == 0 {
				ctx.Response.Header.Set(k, val)
			} else {
				ctx.Response.Header.Add(k, val)
			}
		}
	}
	ctx.Response.SetStatusCode(w.code)
	ctx.Response.SetBody(w.body)
}

// headerRecorder is an http.ResponseWriter that keeps what it is given.
type headerRecorder struct {
	h    http.Header
	code int
	body []byte
}

func (w *headerRecorder) Header() http.Header { return w.h }
func (w *headerRecorder) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
}
func (w *headerRecorder) Write(b []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	w.body = append(w.body, b...)
	return len(b), nil
}

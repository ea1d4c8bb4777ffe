package proxy

import (
	"net"
	"sync"
	"unsafe"

	"github.com/valyala/fasthttp"

	"github.com/floodgate/floodgate/gate"
)

// reqView is the gate's view of a fasthttp request, recycled: Raw's
// strings alias the request's bytes for the length of Check.
type reqView struct {
	ctx *fasthttp.RequestCtx
	raw gate.RawHTTP
}

var reqViews = sync.Pool{New: func() any {
	rv := new(reqView)
	rv.raw.Header = rv.header
	return rv
}}

// header returns a header's values, copied (the gate may keep them).
func (rv *reqView) header(name string) []string {
	vals := rv.ctx.Request.Header.PeekAll(name)
	if len(vals) == 0 {
		return nil
	}
	out := make([]string, len(vals))
	for i, v := range vals {
		out[i] = string(v)
	}
	return out
}

var verdicts = sync.Pool{New: func() any { return new(gate.Verdict) }}

func b2s(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }
func s2b(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }

// serve limits one request and forwards it, or refuses it. The gate has
// usually decided already, on the request's header (headerReceived).
func (p *Proxy) serve(ctx *fasthttp.RequestCtx) {
	pc := peerOf(ctx)
	pend := pc.pend
	pc.pend = pendingVerdict{}
	if !pend.set {
		pend.v, pend.noHost = p.decide(ctx, pc)
	}
	if pend.noHost {
		ctx.Response.SetStatusCode(fasthttp.StatusBadRequest)
		ctx.Response.Header.SetContentType("text/plain; charset=utf-8")
		ctx.Response.SetBodyString("floodgate proxy: an HTTP/1.1 request needs one Host header\n")
		ctx.SetConnectionClose()
		return
	}
	v := pend.v
	ambiguous := ambiguousFraming(&ctx.Request.Header)
	if v.Allowed {
		p.forward(ctx, pc, v)
	} else {
		p.refuse(ctx, v, pend.skipped)
	}
	if ambiguous {
		ctx.SetConnectionClose() // after forward, whose upstream response replaced ours
	}
	verdicts.Put(v)
}

// hostLines counts the Host lines of a request's raw header.
func hostLines(raw []byte) int {
	n := 0
	for len(raw) > 0 {
		line := raw
		if i := indexByte(raw, '\n'); i >= 0 {
			line, raw = raw[:i], raw[i+1:]
		} else {
			raw = nil
		}
		if len(line) >= 5 && line[4] == ':' && eqFold(line[:4], "Host") {
			n++
		}
	}
	return n
}

// ambiguousFraming reports whether a chunked request also had a
// Content-Length, or came as HTTP/1.0: fasthttp reads the chunked body
// (and sends only that on), but a server in front of the proxy may have
// framed it by its Content-Length, and what it took for the next request
// is then part of this one's body. RFC 9112 (6.1, 6.3) wants the
// connection closed after the answer, so nothing is read past a framing
// two servers may disagree on.
func ambiguousFraming(h *fasthttp.RequestHeader) bool {
	if h.ContentLength() != -1 {
		return false
	}
	if !h.IsHTTP11() {
		return true
	}
	found := false
	h.VisitAllInOrder(func(key, _ []byte) {
		found = found || eqFold(key, "Content-Length")
	})
	return found
}

// decide runs the gate on a request's header (waiting out a delay
// action) and counts its verdict; noHost (and no verdict) for an HTTP/1.1
// request without a Host, or any request with two.
func (p *Proxy) decide(ctx *fasthttp.RequestCtx, pc *peerConn) (v *gate.Verdict, noHost bool) {
	if hostLines(ctx.Request.Header.RawHeaders()) > 1 {
		// two Hosts (RFC 9112, 3.2: 400): fasthttp keeps the last, a
		// server in front of the proxy may have routed by the first
		return nil, true
	}
	if len(ctx.Request.Header.Host()) == 0 {
		// HTTP/1.1 requires a Host (RFC 9112, 3.2): a request without
		// one is the client's error, not the upstream's. HTTP/1.0 may
		// leave it out; it goes on with the upstream's own, as nginx
		// sends it.
		if ctx.Request.Header.IsHTTP11() {
			return nil, true
		}
		ctx.Request.Header.SetHost(p.up.Host)
	}
	rv := reqViews.Get().(*reqView)
	rv.ctx = ctx
	rv.raw.Method = b2s(ctx.Method())
	rv.raw.Host = b2s(ctx.Host())
	rv.raw.Path = b2s(ctx.Path())
	rv.raw.RawQuery = b2s(ctx.URI().QueryString())
	req := gate.Request{Raw: &rv.raw, Peer: pc.addr, Ctx: &pc.gctx}
	v = verdicts.Get().(*gate.Verdict)
	p.gate.Load().Check(&req, v)
	rv.ctx, rv.raw.Method, rv.raw.Host, rv.raw.Path, rv.raw.RawQuery = nil, "", "", "", ""
	reqViews.Put(rv)
	p.observe(v)
	if v.Err == errClientGone {
		p.clientErrs[reasonGoneWhileDelayed].Inc()
	}
	return v, false
}

// headerReceived is the server's HeaderReceived hook: it runs the gate as
// soon as a request's header is read, before fasthttp reads the first
// 8 KiB of its body (StreamRequestBody) or answers its
// "Expect: 100-continue". A refused request is made bodiless for fasthttp
// (no Content-Length, Transfer-Encoding or Expect), so that the handler
// runs at once and answers it without a 100 Continue, the connection
// closing after the refusal since its body is still on the wire. An
// allowed request's body is read under --client-body-timeout from here
// on (a 100 Continue follows the gate's delay, if any).
//
// fasthttp's ContinueHandler cannot do this: it sees only the header, and
// refusing there answers 417 Expectation Failed, not the limit's status.
func (p *Proxy) headerReceived(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
	ctx := ctxOfHeader(h)
	pc, ok := ctx.Conn().(*peerConn)
	if !ok {
		return fasthttp.RequestConfig{} // the handler decides
	}
	v, noHost := p.decide(ctx, pc)
	pc.pend = pendingVerdict{set: true, v: v, noHost: noHost}
	hasBody := h.ContentLength() > 0 || h.ContentLength() == -1 // -1: chunked
	if noHost || !v.Allowed {
		if hasBody {
			h.SetContentLength(0) // and no Transfer-Encoding
			pc.pend.skipped = true
		}
		h.Del("Expect")
		return fasthttp.RequestConfig{}
	}
	if hasBody {
		pc.setReadDeadlineNow(p.timeouts.body)
	}
	return fasthttp.RequestConfig{}
}

// requestError is the server's ErrorHandler: fasthttp's own answers (431,
// 408, 400) to a request it could not read; a request the gate had
// decided on its header failed in its body, the client's doing, and is
// counted so.
func (p *Proxy) requestError(ctx *fasthttp.RequestCtx, err error) {
	if pc, ok := ctx.Conn().(*peerConn); ok && pc.pend.set {
		if pc.pend.v != nil {
			verdicts.Put(pc.pend.v)
		}
		pc.pend = pendingVerdict{}
		reason := bodyErrReason(err)
		p.clientErrs[reason].Inc()
		if reason == reasonBodyTimeout {
			ctx.Error("Request timeout", fasthttp.StatusRequestTimeout)
			return
		}
	}
	// as fasthttp's defaultErrorHandler
	if _, ok := err.(*fasthttp.ErrSmallBuffer); ok {
		ctx.Error("Too big request header", fasthttp.StatusRequestHeaderFieldsTooLarge)
	} else if netErr, ok := err.(*net.OpError); ok && netErr.Timeout() {
		ctx.Error("Request timeout", fasthttp.StatusRequestTimeout)
	} else {
		ctx.Error("Error when parsing request", fasthttp.StatusBadRequest)
	}
}

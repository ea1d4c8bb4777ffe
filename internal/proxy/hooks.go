package proxy

import (
	"errors"
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
	if p.isPoll(ctx) {
		if bad := checkRequest(&ctx.Request.Header, pc); bad != nil {
			bad.answer(ctx)
		} else {
			p.servePoll(ctx, pc)
		}
		if ambiguousFraming(&ctx.Request.Header) {
			ctx.SetConnectionClose()
		}
		pc.awaitHeader()
		return
	}
	if !pend.set {
		pend = p.decide(ctx, pc)
	}
	if pend.bad != nil {
		pend.bad.answer(ctx)
		return
	}
	if pend.shed != nil {
		p.shed(ctx, pend.shed, pend.skipped)
		pc.awaitHeader()
		return
	}
	v := pend.v
	ambiguous := ambiguousFraming(&ctx.Request.Header)
	switch q := p.deferQueue(v); {
	case v.Allowed:
		p.forwardAdmitted(ctx, pc, v, pend.tk)
	case q != nil && !pend.skipped:
		p.deferRequest(ctx, pc, v, q)
	default:
		p.refuse(ctx, v, pend.skipped)
	}
	if ambiguous {
		ctx.SetConnectionClose() // after forward, whose upstream response replaced ours
	}
	verdicts.Put(v)
	if !ctx.Hijacked() {
		pc.awaitHeader() // the body has been read: what comes next is a header
	}
}

// decide admits a request through the throttler, if there is one
// (admitFirst), then runs the gate on its header (waiting out a delay
// action) and counts its verdict; or, for a request the proxy must not
// forward (checkRequest), says why, with no verdict. A request the
// throttler shed (pend.shed) never reaches the gate: it spends no quota.
// One the gate refuses gives its throttler slot back at once; one it
// allows holds it in pend.tk until it has been forwarded. One the gate
// delays holds no slot while it waits: it is admitted again when its
// delay ends, or shed then (pend.shed, what the gate reserved given
// back), see admission.
func (p *Proxy) decide(ctx *fasthttp.RequestCtx, pc *peerConn) (pend pendingVerdict) {
	pend.set = true
	if pend.bad = checkRequest(&ctx.Request.Header, pc); pend.bad != nil {
		return pend
	}
	if len(ctx.Request.Header.Host()) == 0 {
		// HTTP/1.0 may leave the Host out; the request goes on with the
		// upstream's own, as nginx sends it.
		ctx.Request.Header.SetHost(p.up.Host)
	}
	rv := reqViews.Get().(*reqView)
	rv.ctx = ctx
	rv.raw.Method = b2s(ctx.Method())
	rv.raw.Host = b2s(ctx.Host())
	rv.raw.Path = b2s(ctx.Path())
	rv.raw.RawQuery = b2s(ctx.URI().QueryString())
	req := gate.Request{Raw: &rv.raw, Peer: pc.addr, Ctx: &pc.gctx}
	g := p.gate.Load()
	if p.th != nil && !isUpgrade(&ctx.Request.Header) {
		pend.tk, pend.shed = p.admitFirst(ctx, pc, g, &req)
	}
	if pend.shed == nil {
		pend.v = verdicts.Get().(*gate.Verdict)
		g.Check(&req, pend.v)
		// a delay action gave the slot back while it slept and took
		// another (or was shed) when it ended: watchingClock
		pend.tk, pend.shed = pc.adm.tk, pc.adm.shed
		pc.adm = admission{}
		if pend.shed != nil {
			verdicts.Put(pend.v) // the gate gave back what it reserved
			pend.v = nil
		}
	}
	rv.ctx, rv.raw.Method, rv.raw.Host, rv.raw.Path, rv.raw.RawQuery = nil, "", "", "", ""
	reqViews.Put(rv)
	if pend.v == nil {
		return pend
	}
	if !pend.v.Allowed && pend.tk != nil {
		pend.tk.Release() // refused: the slot goes to the next in the queue, no completion counted
		pend.tk = nil
	}
	p.observe(pend.v)
	if pend.v.Err == errClientGone {
		p.clientErrs[reasonGoneWhileDelayed].Inc()
	}
	return pend
}

// headerReceived is the server's HeaderReceived hook: it runs the
// throttler's admission and the gate as soon as a request's header is
// read, before fasthttp reads the first
// 8 KiB of its body (StreamRequestBody) or answers its
// "Expect: 100-continue". A refused or shed request is made bodiless for fasthttp
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
	if pc.header != headerUnchecked {
		pc.header = headerRead // what Read reads now is the body's
	}
	if p.isPoll(ctx) {
		return fasthttp.RequestConfig{} // serve answers it, with no limit
	}
	pc.pend = p.decide(ctx, pc)
	v, bad := pc.pend.v, pc.pend.bad
	hasBody := h.ContentLength() > 0 || h.ContentLength() == -1 // -1: chunked
	if bad != nil || pc.pend.shed != nil || !v.Allowed && p.deferQueue(v) == nil {
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
	pc, _ := ctx.Conn().(*peerConn)
	if pc != nil {
		defer pc.awaitHeader()
	}
	if bad, ok := errors.AsType[*badRequest](err); ok {
		bad.answer(ctx) // a bare LF (peerConn.Read)
		return
	}
	if pc != nil && pc.pend.set {
		if pc.pend.v != nil {
			verdicts.Put(pc.pend.v)
		}
		if pc.pend.tk != nil {
			pc.pend.tk.Release() // its body failed: it was never forwarded
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

package proxy

import (
	"context"
	"errors"

	"github.com/valyala/fasthttp"

	"github.com/floodgate/floodgate/gate"
	"github.com/floodgate/floodgate/throttle"
)

// forwardAdmitted forwards a request the gate allowed, through the
// throttler when there is one (Config.Throttle): it runs at once, after a
// wait in the admission queue, or is shed (503, shed). The ticket is Done
// once the upstream's response header (and a body of at most
// maxBufferedBody) is back. A protocol switch (WebSocket) is not
// throttled: it would hold a slot for as long as it stays open.
func (p *Proxy) forwardAdmitted(ctx *fasthttp.RequestCtx, pc *peerConn, v *gate.Verdict) {
	if p.th == nil || isUpgrade(&ctx.Request.Header) {
		p.forward(ctx, pc, v)
		return
	}
	tk, err := p.admit(ctx, pc, v)
	if err != nil {
		p.shed(ctx, err)
		return
	}
	defer tk.Done()
	p.forward(ctx, pc, v)
}

// admit enters the request into the throttler and, if it is queued, waits
// for its turn, watching the connection meanwhile: a client that leaves
// leaves the queue.
func (p *Proxy) admit(ctx *fasthttp.RequestCtx, pc *peerConn, v *gate.Verdict) (*throttle.Ticket, error) {
	tk, err := p.th.Enter(p.routeKey(ctx, v), p.criticality(ctx), 0)
	if err != nil || tk.Admitted() {
		return tk, err
	}
	wctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop := pc.watch(cancel)
	err = tk.Wait(wctx)
	stop()
	return tk, err
}

// routeKey keys the throttler's cost model: the request's method and the
// name of the first http route that matched it ("" for none), so that the
// model's table is bounded by the rules, not by the paths clients send.
func (p *Proxy) routeKey(ctx *fasthttp.RequestCtx, v *gate.Verdict) throttle.RouteKey {
	k := throttle.RouteKey{Method: internMethod(ctx.Method())}
	if len(v.Outcomes) > 0 && v.Outcomes[0].Limit != nil {
		k.Route = v.Outcomes[0].Limit.Name
	}
	return k
}

// internMethod returns the standard method m names as a constant string,
// or "OTHER" (the key must not alias the request's bytes, and clients
// must not grow the table with made-up methods).
func internMethod(m []byte) string {
	for _, s := range [...]string{"GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"} {
		if string(m) == s {
			return s
		}
	}
	return "OTHER"
}

// criticality reads the request's level from Config.CriticalityHeader
// (the first four values; throttle.DefaultCriticality if none is a
// level).
func (p *Proxy) criticality(ctx *fasthttp.RequestCtx) throttle.Criticality {
	vals := ctx.Request.Header.PeekAll(p.critHeader)
	var buf [4]string
	n := min(len(vals), len(buf))
	for i := range n {
		buf[i] = b2s(vals[i])
	}
	return throttle.FromValues(buf[:n], throttle.DefaultCriticality)
}

var shedBody = []byte("the service is overloaded: request shed, retry later\n")

// shed answers a request the throttler refused: 503 with Retry-After (a
// quota refusal is 429: this one says the server is out of room). A body
// the client is still sending would be read as the next request: the
// connection closes after the answer instead.
func (p *Proxy) shed(ctx *fasthttp.RequestCtx, err error) {
	if ctx.Request.IsBodyStream() && ctx.Request.Header.ContentLength() != 0 && !bodyPrefetched(&ctx.Request) {
		ctx.SetConnectionClose()
	}
	if errors.Is(err, context.Canceled) {
		ctx.SetConnectionClose() // the client left while queued
	}
	resp := &ctx.Response
	resp.SetStatusCode(fasthttp.StatusServiceUnavailable)
	resp.Header.Set("Retry-After", "1")
	resp.Header.SetCanonical(hdrCacheControl, hdrNoStore)
	resp.Header.SetContentType("text/plain; charset=utf-8")
	resp.SetBody(shedBody)
}

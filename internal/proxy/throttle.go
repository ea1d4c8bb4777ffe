package proxy

import (
	"context"
	"errors"

	"github.com/valyala/fasthttp"

	"github.com/floodgate/floodgate/gate"
	"github.com/floodgate/floodgate/throttle"
)

// forwardAdmitted forwards a request the gate allowed. tk is its
// admission by the throttler (nil: no throttler, or a protocol switch,
// which would hold a slot for as long as it stays open): it is Done once
// the upstream's response header (and a body of at most maxBufferedBody)
// is back.
func (p *Proxy) forwardAdmitted(ctx *fasthttp.RequestCtx, pc *peerConn, v *gate.Verdict, tk *throttle.Ticket) {
	if tk != nil {
		defer tk.Done()
	}
	p.forward(ctx, pc, v)
}

// admitFirst enters the request into the throttler before the gate is
// asked, so that a request the throttler sheds spends no quota, and
// waits for its turn if it is queued, watching the connection meanwhile:
// a client that leaves leaves the queue. Its route and level come from
// the gate's Classify (admitClass). It returns the admitted ticket, or
// why the request was shed; an admitted one is also pc.adm's, for a
// delay action to give back while it sleeps (admission).
func (p *Proxy) admitFirst(ctx *fasthttp.RequestCtx, pc *peerConn, g *gate.Gate, req *gate.Request) (*throttle.Ticket, error) {
	key, crit := p.admitClass(ctx, pc, g, req)
	tk, err := admit(p.th, pc, key, crit)
	if err == nil {
		pc.adm = admission{tk: tk}
	}
	return tk, err
}

// admit enters a request of route key and level crit into th and waits
// for its turn if it is queued, watching pc meanwhile: a client that
// leaves leaves the queue (context.Canceled). It returns the admitted
// ticket, or why the request was shed.
func admit(th *throttle.Throttler, pc *peerConn, key throttle.RouteKey, crit throttle.Criticality) (*throttle.Ticket, error) {
	tk, err := th.Enter(key, crit, 0)
	if err != nil || tk.Admitted() {
		return tk, err
	}
	wctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop := pc.watch(cancel)
	err = tk.Wait(wctx)
	stop()
	if err != nil {
		return nil, err
	}
	return tk, nil
}

// admission is the throttler's admission of the request the gate is
// deciding on a connection (peerConn.adm), set by admitFirst. A delay
// action (watchingClock.Sleep) gives tk's slot back for the length of
// its sleep (delayStarts: throttle.Ticket.Suspend), so that requests
// waiting out a delay hold neither a slot nor queued cost, and enters
// the request again, as a new arrival of the same route and level, when
// it ends (delayEnds: Ticket.Resume, counted as a readmission, so that
// floodgate_throttle_admitted_total counts each request once).
type admission struct {
	tk *throttle.Ticket // nil: none (no throttler, or shed when its delay ended)
	// shed is why the throttler shed the request when its delay ended:
	// the gate gave back what it had reserved, and the request is
	// answered as one shed on arrival (503).
	shed error
}

// delayStarts gives the slot back for the delay: reports whether one was
// held (and must be taken again when the delay ends).
func (a *admission) delayStarts() bool {
	return a.tk != nil && a.tk.Suspend() // no completion: it has not run
}

// delayEnds enters the request into the throttler again and waits for
// its turn, watching pc. It returns errClientGone if the client left
// meanwhile, or the throttler's reason for shedding it (also kept in
// a.shed); either makes the gate give back what the delay reserved.
func (a *admission) delayEnds(pc *peerConn) error {
	err := a.tk.Resume()
	if err == nil && !a.tk.Admitted() {
		wctx, cancel := context.WithCancel(context.Background())
		stop := pc.watch(cancel)
		err = a.tk.Wait(wctx)
		stop()
		cancel()
	}
	switch {
	case errors.Is(err, context.Canceled):
		a.tk = nil
		return errClientGone
	case err != nil:
		a.tk, a.shed = nil, err
		return err
	}
	return nil
}

// admitClass returns the request's key in the throttler's cost model and
// its level. The key is its method and the name of the first http route
// whose match it meets ("" for none), so that the model's table is
// bounded by the rules, not by the paths clients send. Its level is
// Config.CriticalityHeader's (its first four values), capped at the
// route's criticality (throttle.DefaultCriticality when the route sets
// none): a client may lower its level, never raise it, unless it is one
// of the trusted proxies, whose header is taken as it is.
func (p *Proxy) admitClass(ctx *fasthttp.RequestCtx, pc *peerConn, g *gate.Gate, req *gate.Request) (throttle.RouteKey, throttle.Criticality) {
	c := g.Classify(req)
	key := throttle.RouteKey{Method: internMethod(ctx.Method()), Route: c.Route}
	ceiling := throttle.DefaultCriticality
	if c.Criticality != "" {
		ceiling, _ = throttle.ParseCriticality(c.Criticality)
	}
	vals := ctx.Request.Header.PeekAll(p.critHeader)
	var buf [4]string
	n := min(len(vals), len(buf))
	for i := range n {
		buf[i] = b2s(vals[i])
	}
	return key, throttle.Claim(buf[:n], ceiling, n > 0 && trustedPeer(p.trusted, pc.ip))
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

var shedBody = []byte("the service is overloaded: request shed, retry later\n")

// shed answers a request the throttler refused: 503 with Retry-After (a
// quota refusal is 429: this one says the server is out of room). It was
// shed on its header (headerReceived): its body, if any, was never read
// (skipped) and would be read as the next request, so the connection
// closes after the answer.
func (p *Proxy) shed(ctx *fasthttp.RequestCtx, err error, skipped bool) {
	if skipped || ctx.Request.IsBodyStream() && ctx.Request.Header.ContentLength() != 0 && !bodyPrefetched(&ctx.Request) {
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

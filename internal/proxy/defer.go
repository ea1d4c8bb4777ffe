package proxy

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/valyala/fasthttp"

	"github.com/floodgate/floodgate/deferq"
	"github.com/floodgate/floodgate/gate"
)

// deferSet is the queues of the defer limits: by limit name, and by
// queue name for the poll path.
type deferSet struct {
	byLimit, byName map[string]*deferq.Queue
}

// SetDefer sets the queues of the gate's defer limits, by limit name (nil
// or empty: none). A request over such a limit is queued and answered 202
// with a Location under deferq.PollPrefix, which the proxy answers before
// any limit applies.
func (p *Proxy) SetDefer(queues map[string]*deferq.Queue) {
	if len(queues) == 0 {
		p.defers.Store(nil)
		return
	}
	ds := &deferSet{byLimit: queues, byName: map[string]*deferq.Queue{}}
	for _, q := range queues {
		ds.byName[q.Name()] = q
	}
	p.defers.Store(ds)
}

// deferQueue returns the queue of the limit that refused v, if it defers.
func (p *Proxy) deferQueue(v *gate.Verdict) *deferq.Queue {
	ds := p.defers.Load()
	if ds == nil || v == nil || v.Allowed || v.StoreUnavailable() {
		return nil
	}
	if o := v.Deciding; o != nil && o.Limit.Action == gate.Defer {
		return ds.byLimit[o.Limit.Name]
	}
	return nil
}

// isPoll reports whether the request's target is under deferq.PollPrefix
// while the proxy has queues. It reads the raw request-target: parsing
// the URI (ctx.Path) before decide has set a missing Host would keep the
// URI without it.
func (p *Proxy) isPoll(ctx *fasthttp.RequestCtx) bool {
	return p.defers.Load() != nil && bytes.HasPrefix(ctx.Request.Header.RequestURI(), s2b(deferq.PollPrefix))
}

// servePoll answers a poll of a deferred request: 202 pending, the
// stored response, 404 unknown or expired, 503 Redis unavailable (or
// too many polls under way), 429 for a client polling faster than the
// queue's PollRate (deferq.Queue.PollStatus: neither asks Redis).
func (p *Proxy) servePoll(ctx *fasthttp.RequestCtx, pc *peerConn) {
	ds := p.defers.Load()
	// The raw target had the prefix; the normalized path ("/../" taken
	// out) may not.
	restb, ok := bytes.CutPrefix(ctx.Path(), s2b(deferq.PollPrefix))
	rest := string(restb)
	i := strings.LastIndexByte(rest, '/')
	var q *deferq.Queue
	if ds != nil && ok && i > 0 && (ctx.IsGet() || ctx.IsHead()) {
		q = ds.byName[rest[:i]]
	}
	resp := &ctx.Response
	resp.Header.SetCanonical(hdrCacheControl, hdrNoStore)
	if q == nil {
		resp.SetStatusCode(http.StatusNotFound)
		resp.SetBodyString("no such deferred request\n")
		return
	}
	client := pc.host // a trusted proxy's polls carry many clients: PollConcurrency bounds them
	if trustedPeer(p.trusted, pc.ip) {
		client = ""
	}
	st, res, err := q.PollStatus(ctx, client, rest[i+1:])
	switch {
	case errors.Is(err, deferq.ErrPollRate):
		resp.Header.Set("Retry-After", "1")
		resp.SetStatusCode(http.StatusTooManyRequests)
		resp.SetBodyString("too many polls; retry later\n")
	case err != nil:
		resp.Header.Set("Retry-After", "1")
		resp.SetStatusCode(http.StatusServiceUnavailable)
		resp.SetBodyString("deferred queue unavailable; retry later\n")
	case st == deferq.Pending:
		resp.Header.Set("Retry-After", "1")
		resp.SetStatusCode(http.StatusAccepted)
		resp.SetBodyString("pending\n")
	case st == deferq.Done:
		for k, vals := range res.Header {
			for _, v := range vals {
				resp.Header.Add(k, v)
			}
		}
		resp.SetStatusCode(res.Status)
		resp.SetBody(res.Body)
	default:
		resp.SetStatusCode(http.StatusNotFound)
		resp.SetBodyString("no such deferred request (or its result expired)\n")
	}
}

// deferRequest queues the request for q: 202 and its Location, 503 when
// the queue is full (or Redis down), 413 for a body over its bound.
func (p *Proxy) deferRequest(ctx *fasthttp.RequestCtx, pc *peerConn, v *gate.Verdict, q *deferq.Queue) {
	r := &http.Request{Method: string(ctx.Method()), RequestURI: string(ctx.RequestURI()), Host: string(ctx.Host()),
		Header: http.Header{}, RemoteAddr: pc.addr}
	u, err := url.ParseRequestURI(r.RequestURI)
	if err != nil {
		ctx.SetConnectionClose()
		ctx.Response.SetStatusCode(http.StatusBadRequest)
		ctx.Response.SetBodyString("bad request URI\n")
		return
	}
	r.URL = u
	// as a forwarded request: the client's address in X-Forwarded-For (a
	// client's own forwarding headers dropped unless it is a trusted proxy)
	p.setForwarded(&ctx.Request.Header, pc, append([]byte(nil), ctx.Host()...))
	for k, val := range ctx.Request.Header.All() {
		r.Header.Add(string(k), string(val))
	}
	var body io.Reader = bytes.NewReader(ctx.Request.Body())
	if ctx.Request.IsBodyStream() {
		body = ctx.RequestBodyStream()
	}
	r.Body = io.NopCloser(body)
	id, err := q.Enqueue(ctx, r)
	resp := &ctx.Response
	p.setRateLimit(&resp.Header, v)
	resp.Header.SetCanonical(hdrCacheControl, hdrNoStore)
	switch {
	case err == nil:
		resp.Header.Set("Location", q.Location(id))
		resp.Header.Set("Retry-After", "1")
		resp.SetStatusCode(http.StatusAccepted)
		resp.SetBodyString("accepted for later delivery; poll " + q.Location(id) + "\n")
	case errors.Is(err, deferq.ErrTooLarge):
		ctx.SetConnectionClose() // the rest of the body is still on the wire
		resp.SetStatusCode(http.StatusRequestEntityTooLarge)
		resp.SetBodyString("request body too large to queue\n")
	default:
		resp.Header.Set("Retry-After", "1")
		resp.SetStatusCode(http.StatusServiceUnavailable)
		resp.SetBodyString("deferred queue unavailable or full; retry later\n")
	}
}

package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/floodgate/floodgate/gate"
	"github.com/floodgate/floodgate/httplimit"
)

// fastProxy is the proxy's data path: a fasthttp server whose handler
// limits each request with the gate and forwards it with a
// fasthttp.HostClient on keep-alive HTTP/1.1 connections to the upstream.
// Request and response bodies stream; upgraded connections (WebSocket) are
// hijacked and piped to a connection of their own.
type fastProxy struct {
	gate    atomic.Pointer[gate.Gate] // rebuilt on every rules reload
	legacy  bool
	trusted []netip.Prefix

	up       *url.URL
	upName   string // up.Redacted(), for errors
	upAddr   string // host:port
	upTLS    *tls.Config
	rewrite  bool   // the upstream URL has a path or query to join
	upPath   string // its escaped path
	upQuery  string
	dialer   *net.Dialer
	hc       *fasthttp.HostClient
	log      *slog.Logger
	pm       *proxyMetrics
	passed   prometheus.Counter
	refused  prometheus.Counter
	delayed  prometheus.Counter
	errored  prometheus.Counter
	upstream prometheus.Counter
}

// Header and body sizes. Request headers must fit the server's read buffer,
// which each connection holds (nginx's default is 4 × 8 KiB); bodies are
// unlimited since they stream. A response of known length up to
// maxBufferedBody is read whole before it is sent on; a longer one, and
// any chunked one, streams.
const (
	maxHeaderBytes  = 64 << 10
	maxBufferedBody = 1 << 20
	// Requests whose whole body came with their headers (the server reads
	// up to 8 KiB ahead) are sent from memory, so that a failed attempt
	// on a stale connection can be retried.
	prefetchedBody = 8 << 10
)

func newFastProxy(up *url.URL, trusted []netip.Prefix, legacy bool, log *slog.Logger, pm *proxyMetrics) *fastProxy {
	p := &fastProxy{
		legacy: legacy, trusted: trusted, up: up, upName: up.Redacted(), log: log, pm: pm,
		dialer:   &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second},
		passed:   pm.requests.WithLabelValues("passed"),
		refused:  pm.requests.WithLabelValues("refused"),
		delayed:  pm.requests.WithLabelValues("delayed"),
		errored:  pm.requests.WithLabelValues("error"),
		upstream: pm.upstream,
	}
	p.upAddr = up.Host
	if up.Port() == "" {
		port := "80"
		if up.Scheme == "https" {
			port = "443"
		}
		p.upAddr = net.JoinHostPort(up.Hostname(), port)
	}
	if up.Scheme == "https" {
		p.upTLS = &tls.Config{ServerName: up.Hostname(), MinVersion: tls.VersionTLS12}
	}
	if ep := up.EscapedPath(); (ep != "" && ep != "/") || up.RawQuery != "" {
		p.rewrite, p.upPath, p.upQuery = true, ep, up.RawQuery
	}
	p.hc = &fasthttp.HostClient{
		Addr:  p.upAddr,
		IsTLS: p.upTLS != nil,
		Dial: func(string) (net.Conn, error) {
			c, err := p.dial()
			if err != nil {
				return nil, err
			}
			return &upConn{Conn: c, redial: p.dial, tls: p.upTLS != nil, used: time.Now()}, nil
		},
		MaxConns:                      1 << 16, // as net/http: no limit to speak of
		MaxIdleConnDuration:           60 * time.Second,
		MaxIdemponentCallAttempts:     2,
		ReadBufferSize:                maxHeaderBytes,
		WriteBufferSize:               16 << 10,
		MaxResponseBodySize:           maxBufferedBody,
		StreamResponseBody:            true,
		DisablePathNormalizing:        true, // pass the path as the client sent it
		NoDefaultUserAgentHeader:      true,
		DisableHeaderNamesNormalizing: false,
	}
	return p
}

// dial opens a connection to the upstream (TLS for https).
func (p *fastProxy) dial() (net.Conn, error) {
	c, err := p.dialer.Dial("tcp", p.upAddr)
	if err != nil || p.upTLS == nil {
		return c, err
	}
	tc := tls.Client(c, p.upTLS)
	ctx, cancel := context.WithTimeout(context.Background(), p.dialer.Timeout)
	defer cancel()
	if err := tc.HandshakeContext(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return tc, nil
}

// server returns the proxy's fasthttp server.
func (p *fastProxy) server() *fasthttp.Server {
	return &fasthttp.Server{
		Handler:                      p.serve,
		NoDefaultServerHeader:        true,
		NoDefaultContentType:         true,
		StreamRequestBody:            true,
		DisablePreParseMultipartForm: true,
		ReadBufferSize:               maxHeaderBytes,
		WriteBufferSize:              16 << 10,
		// ReadTimeout bounds reading a request's headers (a request's
		// body is read without a deadline, see forward); IdleTimeout a
		// keep-alive connection's wait for its next request. nginx's
		// client_header_timeout is 60 s too. The two are the same so that
		// peerConn can skip fasthttp's second deadline of each request.
		ReadTimeout:     60 * time.Second,
		IdleTimeout:     60 * time.Second,
		CloseOnShutdown: true,
		Logger:          fastLogger{p.log},
	}
}

// fastLogger passes fasthttp's messages (mostly clients that went away) to
// the debug log.
type fastLogger struct{ log *slog.Logger }

func (l fastLogger) Printf(format string, args ...any) {
	if l.log.Enabled(context.Background(), slog.LevelDebug) {
		l.log.Debug("proxy server: " + fmt.Sprintf(format, args...))
	}
}

// peerListener remembers each connection's remote address as a string,
// once per connection, for the gate's Request.Peer.
type peerListener struct{ net.Listener }

type peerConn struct {
	net.Conn
	addr string     // "ip:port"
	host string     // "ip"
	ip   netip.Addr // unmapped
	rd   time.Time  // the read deadline set
}

// SetReadDeadline skips a deadline less than a second after the one set:
// fasthttp sets one or two per request, each a timer update.
func (c *peerConn) SetReadDeadline(t time.Time) error {
	if !t.IsZero() && !c.rd.IsZero() {
		if d := t.Sub(c.rd); d >= 0 && d < time.Second {
			return nil
		}
	}
	c.rd = t
	return c.Conn.SetReadDeadline(t)
}

// SetDeadline is SetReadDeadline's companion.
func (c *peerConn) SetDeadline(t time.Time) error {
	c.rd = t
	return c.Conn.SetDeadline(t)
}

func (l peerListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return newPeerConn(c), nil
}

func newPeerConn(c net.Conn) *peerConn {
	pc := &peerConn{Conn: c, addr: c.RemoteAddr().String()}
	pc.ip = gate.PeerAddr(pc.addr)
	if h, _, err := net.SplitHostPort(pc.addr); err == nil {
		pc.host = h
	}
	return pc
}

func peerOf(ctx *fasthttp.RequestCtx) *peerConn {
	if pc, ok := ctx.Conn().(*peerConn); ok {
		return pc
	}
	return newPeerConn(ctx.Conn())
}

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

// serve limits one request and forwards it, or refuses it.
func (p *fastProxy) serve(ctx *fasthttp.RequestCtx) {
	if len(ctx.Request.Header.Host()) == 0 {
		// HTTP/1.1 requires a Host (RFC 9112, 3.2): a request without
		// one is the client's error, not the upstream's. HTTP/1.0 may
		// leave it out; it goes on with the upstream's own, as nginx
		// sends it.
		if ctx.Request.Header.IsHTTP11() {
			ctx.Response.SetStatusCode(fasthttp.StatusBadRequest)
			ctx.Response.Header.SetContentType("text/plain; charset=utf-8")
			ctx.Response.SetBodyString("floodgate proxy: an HTTP/1.1 request needs a Host header\n")
			ctx.SetConnectionClose()
			return
		}
		ctx.Request.Header.SetHost(p.up.Host)
	}
	pc := peerOf(ctx)
	rv := reqViews.Get().(*reqView)
	rv.ctx = ctx
	rv.raw.Method = b2s(ctx.Method())
	rv.raw.Host = b2s(ctx.Host())
	rv.raw.Path = b2s(ctx.Path())
	rv.raw.RawQuery = b2s(ctx.URI().QueryString())
	req := gate.Request{Raw: &rv.raw, Peer: pc.addr}
	v := verdicts.Get().(*gate.Verdict)
	p.gate.Load().Check(&req, v)
	rv.ctx, rv.raw.Method, rv.raw.Host, rv.raw.Path, rv.raw.RawQuery = nil, "", "", "", ""
	reqViews.Put(rv)
	p.observe(v)
	if v.Allowed {
		p.forward(ctx, pc, v)
	} else {
		p.refuse(ctx, v)
	}
	verdicts.Put(v)
}

// observe counts a verdict, as httplimit's Observe did.
func (p *fastProxy) observe(v *gate.Verdict) {
	for i := range v.Outcomes {
		o := &v.Outcomes[i]
		outcome := "ok"
		switch {
		case o.Banned:
			outcome = "banned"
		case o.Over:
			outcome = "over_limit"
		case !o.Decision.Allowed:
			outcome = "shadow_over_limit"
		}
		p.pm.limit(o.Limit.Name, outcome).Inc()
	}
	switch {
	case v.Err != nil && v.Deciding == nil:
		p.errored.Inc()
	case !v.Allowed:
		p.refused.Inc()
	case v.Delayed > 0:
		p.delayed.Inc()
	default:
		p.passed.Inc()
	}
}

// setRateLimit writes the verdict's RateLimit fields over whatever the
// response has under their names.
func (p *fastProxy) setRateLimit(h *fasthttp.ResponseHeader, v *gate.Verdict) {
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
// fields, and a short body in JSON or text; or its redirect.
func (p *fastProxy) refuse(ctx *fasthttp.RequestCtx, v *gate.Verdict) {
	// A body the client is still sending would be read as the next
	// request: close the connection after the refusal instead.
	if ctx.Request.IsBodyStream() && ctx.Request.Header.ContentLength() != 0 && !bodyPrefetched(&ctx.Request) {
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
	if o := v.Deciding; o != nil && o.Limit.Action == gate.Redirect {
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
func (p *fastProxy) redirect(ctx *fasthttp.RequestCtx, to string, code int) {
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

// The hop-by-hop headers (RFC 9110, 7.6.1), removed both ways.
var hopHeaders = [][]byte{
	[]byte("Connection"), []byte("Keep-Alive"), []byte("Proxy-Connection"), []byte("Proxy-Authenticate"),
	[]byte("Proxy-Authorization"), []byte("Te"), []byte("Trailer"), []byte("Transfer-Encoding"), []byte("Upgrade"),
}

// headerLike is what removing hop-by-hop headers needs of a request or
// response header.
type headerLike interface {
	PeekAll(key string) [][]byte
	DelBytes(key []byte)
}

// removeHop removes the hop-by-hop headers, and those Connection names.
func removeHop(h headerLike) {
	if conn := h.PeekAll("Connection"); len(conn) > 0 {
		// Copy the names out: deleting headers moves the values.
		var names [8][]byte
		var store [256]byte
		buf, n := store[:0], 0
		for _, line := range conn {
			for len(line) > 0 && n < len(names) {
				var tok []byte
				if i := indexByte(line, ','); i >= 0 {
					tok, line = line[:i], line[i+1:]
				} else {
					tok, line = line, nil
				}
				tok = trimSpace(tok)
				if len(tok) == 0 || eqFold(tok, "close") || eqFold(tok, "keep-alive") {
					continue
				}
				start := len(buf)
				buf = append(buf, tok...)
				names[n] = buf[start:len(buf):len(buf)]
				n++
			}
		}
		for _, name := range names[:n] {
			h.DelBytes(name)
		}
	}
	for _, name := range hopHeaders {
		h.DelBytes(name)
	}
}

func indexByte(b []byte, c byte) int {
	for i := range b {
		if b[i] == c {
			return i
		}
	}
	return -1
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	return b
}

func eqFold(b []byte, s string) bool { return strings.EqualFold(b2s(b), s) }

// isUpgrade reports whether a request asks to switch protocols (its
// Connection header names Upgrade, and it has an Upgrade header).
func isUpgrade(h *fasthttp.RequestHeader) bool {
	if len(h.Peek("Upgrade")) == 0 {
		return false
	}
	for _, line := range h.PeekAll("Connection") {
		for len(line) > 0 {
			var tok []byte
			if i := indexByte(line, ','); i >= 0 {
				tok, line = line[:i], line[i+1:]
			} else {
				tok, line = line, nil
			}
			if eqFold(trimSpace(tok), "upgrade") {
				return true
			}
		}
	}
	return false
}

var (
	hdrXFF       = []byte("X-Forwarded-For")
	hdrXFHost    = []byte("X-Forwarded-Host")
	hdrXFProto   = []byte("X-Forwarded-Proto")
	hdrForwarded = []byte("Forwarded")
	valHTTP      = []byte("http")
	commaSpace   = []byte(", ")
)

// prepare turns the client's request into the upstream's, in place: the
// hop-by-hop headers go, X-Forwarded-* are set as httputil's
// ProxyRequest.SetXForwarded sets them (a client's own X-Forwarded-For
// kept only from a trusted proxy), the path and query join the upstream
// URL's, and the request is HTTP/1.1.
func (p *fastProxy) prepare(ctx *fasthttp.RequestCtx, pc *peerConn) {
	h := &ctx.Request.Header
	removeHop(h)
	h.DelBytes([]byte("Expect")) // the server answered 100-continue itself
	h.SetNoDefaultContentType(true)
	if !h.IsHTTP11() {
		h.SetProtocol("HTTP/1.1")
	}
	h.DelBytes(hdrForwarded)
	if trustedPeer(p.trusted, pc.ip) {
		if prior := h.PeekAll("X-Forwarded-For"); len(prior) > 0 {
			var store [256]byte
			chain := store[:0]
			for i, v := range prior {
				if i > 0 {
					chain = append(chain, commaSpace...)
				}
				chain = append(chain, v...)
			}
			chain = append(chain, commaSpace...)
			chain = append(chain, pc.host...)
			h.DelBytes(hdrXFF)
			h.SetCanonical(hdrXFF, chain)
		} else {
			h.SetCanonical(hdrXFF, s2b(pc.host))
		}
	} else {
		h.DelBytes(hdrXFF)
		if pc.host != "" {
			h.SetCanonical(hdrXFF, s2b(pc.host))
		}
	}
	h.DelBytes(hdrXFHost)
	h.SetCanonical(hdrXFHost, ctx.Host())
	h.DelBytes(hdrXFProto)
	h.SetCanonical(hdrXFProto, valHTTP)
	if p.rewrite {
		p.rewriteURI(ctx)
	}
	if p.upTLS != nil {
		ctx.Request.URI().SetScheme("https")
	}
}

// rewriteURI joins the request's path and query to the upstream URL's, as
// httputil's ProxyRequest.SetURL does.
func (p *fastProxy) rewriteURI(ctx *fasthttp.RequestCtx) {
	uri := ctx.Request.URI()
	path, query := string(uri.PathOriginal()), string(uri.QueryString())
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	switch a, b := strings.HasSuffix(p.upPath, "/"), strings.HasPrefix(path, "/"); {
	case a && b:
		path = p.upPath + path[1:]
	case !a && !b:
		path = p.upPath + "/" + path
	default:
		path = p.upPath + path
	}
	if p.upQuery != "" {
		if query == "" {
			query = p.upQuery
		} else {
			query = p.upQuery + "&" + query
		}
	}
	if query != "" {
		path += "?" + query
	}
	host := string(ctx.Host())
	ctx.Request.SetRequestURI(path)
	ctx.Request.Header.SetHost(host)
}

// forward sends an allowed request to the upstream and its answer back,
// with the verdict's RateLimit fields over the upstream's.
func (p *fastProxy) forward(ctx *fasthttp.RequestCtx, pc *peerConn, v *gate.Verdict) {
	req := &ctx.Request
	if isUpgrade(&req.Header) {
		p.upgrade(ctx, pc, v)
		return
	}
	p.prepare(ctx, pc)
	out, streamed := req, false
	var body *flushingReader
	if req.IsBodyStream() {
		if bodyPrefetched(req) {
			req.Body() // from the stream to memory: it can then be resent
		} else {
			// The body is read as the upstream takes it, for as long as
			// it lasts: lift the header read deadline, and send each
			// read on at once (fasthttp would keep the tail of each in
			// its buffer until the next).
			ctx.Conn().SetReadDeadline(time.Time{})
			streamed = true
			out = fasthttp.AcquireRequest()
			defer fasthttp.ReleaseRequest(out)
			req.Header.CopyTo(&out.Header)
			req.URI().CopyTo(out.URI())
			body = &flushingReader{r: req.BodyStream()}
			out.SetBodyStream(body, req.Header.ContentLength())
		}
	}
	resp := &ctx.Response
	if err := p.hc.Do(out, resp); err != nil {
		if streamed {
			ctx.SetConnectionClose() // what is left of the body is not a request
		}
		if body != nil && body.err != nil {
			// The client's body failed (a broken chunked encoding, say):
			// the client's fault, not the upstream's.
			ctx.Response.Reset()
			ctx.Response.SetStatusCode(fasthttp.StatusBadRequest)
			ctx.Response.Header.SetContentType("text/plain; charset=utf-8")
			ctx.Response.SetBodyString(fmt.Sprintf("floodgate proxy: the request's body could not be read: %v\n", body.err))
			return
		}
		p.badGateway(ctx, err)
		return
	}
	resp.Header.SetNoDefaultContentType(true)
	removeHop(&resp.Header)
	p.setRateLimit(&resp.Header, v)
}

// badGateway answers a request the upstream did not.
func (p *fastProxy) badGateway(ctx *fasthttp.RequestCtx, err error) {
	p.upstream.Inc()
	p.log.Warn("upstream unreachable", "upstream", p.upName, "err", err)
	ctx.Response.Reset()
	ctx.Response.Header.SetNoDefaultContentType(true)
	ctx.Response.SetStatusCode(fasthttp.StatusBadGateway)
	ctx.Response.Header.SetContentType("text/plain; charset=utf-8")
	ctx.Response.SetBodyString(fmt.Sprintf("floodgate proxy: the upstream %s did not answer: %v\n", p.upName, err))
}

// upgrade passes a protocol switch (WebSocket) through: the request goes
// to the upstream on a connection of its own; when it answers 101, the
// client's connection is hijacked and the two are piped together.
func (p *fastProxy) upgrade(ctx *fasthttp.RequestCtx, pc *peerConn, v *gate.Verdict) {
	h := &ctx.Request.Header
	upgrade := append([]byte(nil), h.Peek("Upgrade")...)
	p.prepare(ctx, pc)
	h.Set("Connection", "Upgrade")
	h.SetBytesV("Upgrade", upgrade)
	conn, err := p.dial()
	if err != nil {
		p.badGateway(ctx, err)
		return
	}
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	bw := bufio.NewWriter(conn)
	_, err = bw.Write(h.Header())
	if r := &ctx.Request; err == nil && r.IsBodyStream() {
		_, err = io.Copy(bw, r.BodyStream())
	} else if err == nil {
		_, err = bw.Write(r.Body())
	}
	if err == nil {
		err = bw.Flush()
	}
	br := bufio.NewReader(conn)
	resp := &ctx.Response
	if err == nil {
		err = resp.ReadLimitBody(br, maxBufferedBody)
	}
	if err != nil {
		conn.Close()
		ctx.SetConnectionClose()
		p.badGateway(ctx, err)
		return
	}
	resp.Header.SetNoDefaultContentType(true)
	if resp.StatusCode() != fasthttp.StatusSwitchingProtocols {
		conn.Close()
		removeHop(&resp.Header)
		p.setRateLimit(&resp.Header, v)
		return
	}
	p.setRateLimit(&resp.Header, v)
	head := append([]byte(nil), resp.Header.Header()...)
	rest, _ := br.Peek(br.Buffered())
	head = append(head, rest...)
	conn.SetDeadline(time.Time{})
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(c net.Conn) {
		if _, err := c.Write(head); err != nil {
			conn.Close()
			return
		}
		pipe(c, conn)
	})
}

// pipe copies both ways until either side is done, then closes both.
func pipe(a, b net.Conn) {
	done := make(chan struct{}, 1)
	go func() {
		io.Copy(b, a) //nolint:errcheck // either side may close
		done <- struct{}{}
	}()
	io.Copy(a, b) //nolint:errcheck
	a.Close()
	b.Close()
	<-done
}

// upConn is a connection to the upstream. Before it is used again after a
// pause, it makes sure the upstream has not closed it meanwhile and, if it
// has, dials again in its place: nothing has been written yet, so any
// request (even one whose body streams, which fasthttp would not retry)
// can go on the new connection instead of failing.
type upConn struct {
	net.Conn
	redial func() (net.Conn, error)
	tls    bool
	used   time.Time
	// deadlines are set: fasthttp sets none (no timeouts) but clears
	// both for each request, a timer update each.
	rdSet, wdSet bool
}

// staleAfter is how long a connection may sit unused before it is checked.
const staleAfter = time.Second

// SetWriteDeadline is called by fasthttp before each request it writes.
func (c *upConn) SetWriteDeadline(t time.Time) error {
	now := time.Now()
	if now.Sub(c.used) > staleAfter && !connAlive(c.rawConn()) {
		nc, err := c.redial()
		if err != nil {
			return err
		}
		c.Conn.Close()
		c.Conn, c.rdSet, c.wdSet = nc, false, false
	}
	c.used = now
	if t.IsZero() && !c.wdSet {
		return nil
	}
	c.wdSet = !t.IsZero()
	return c.Conn.SetWriteDeadline(t)
}

// SetReadDeadline is called by fasthttp before each response it reads.
func (c *upConn) SetReadDeadline(t time.Time) error {
	if t.IsZero() && !c.rdSet {
		return nil
	}
	c.rdSet = !t.IsZero()
	return c.Conn.SetReadDeadline(t)
}

// SetDeadline sets both.
func (c *upConn) SetDeadline(t time.Time) error {
	c.rdSet, c.wdSet = !t.IsZero(), !t.IsZero()
	return c.Conn.SetDeadline(t)
}

func (c *upConn) rawConn() net.Conn {
	if tc, ok := c.Conn.(*tls.Conn); ok {
		return tc.NetConn()
	}
	return c.Conn
}

// Handshake tells fasthttp the connection is already TLS when it is (dial
// did the handshake).
func (c *upConn) Handshake() error {
	if tc, ok := c.Conn.(*tls.Conn); ok {
		return tc.Handshake()
	}
	return errors.New("not a TLS connection")
}

// flushingReader copies a body to a buffered writer read by read, flushing
// after each, so that a body of known length streams as it comes.
// Its err is the client's read error, if any, so that a body that breaks
// is answered 400, not 502.
type flushingReader struct {
	r   io.Reader
	err error
}

func (f *flushingReader) Read(p []byte) (int, error) {
	n, err := f.r.Read(p)
	if err != nil && err != io.EOF {
		f.err = err
	}
	return n, err
}

func (f *flushingReader) WriteTo(w io.Writer) (int64, error) {
	fl, _ := w.(interface{ Flush() error })
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	buf := *bp
	var n int64
	for {
		m, err := f.r.Read(buf)
		if m > 0 {
			if _, werr := w.Write(buf[:m]); werr != nil {
				return n, werr
			}
			n += int64(m)
			if fl != nil {
				if ferr := fl.Flush(); ferr != nil {
					return n, ferr
				}
			}
		}
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			f.err = err
			return n, err
		}
	}
}

var copyBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

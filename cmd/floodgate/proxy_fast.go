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
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/gate"
	"github.com/floodgate/floodgate/httplimit"
)

// fastProxy is the proxy's data path: a fasthttp server whose handler
// limits each request with the gate and forwards it with a
// fasthttp.HostClient on keep-alive HTTP/1.1 connections to the upstream.
// Request and response bodies stream; upgraded connections (WebSocket) are
// hijacked and piped to a connection of their own.
//
// The gate decides a request as soon as its header is read
// (headerReceived), before fasthttp reads any of its body or answers its
// "Expect: 100-continue": a refused request's body is never waited for.
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

	timeouts   proxyTimeouts
	upTimeouts prometheus.Counter
	clientErrs [numClientReasons]prometheus.Counter
	// early: the gate runs in the server's HeaderReceived hook
	// (headerCtxWorks); else in the handler, after fasthttp has read the
	// first 8 KiB of a body.
	early bool
}

// proxyTimeouts are the proxy's deadlines on the two sides it waits on.
type proxyTimeouts struct {
	// upstream bounds the wait for the upstream's response header, from
	// the moment the request has been sent (0: none).
	upstream time.Duration
	// body bounds the wait for each read of a request's body (0: none).
	body time.Duration
}

// The reasons of floodgate_proxy_client_errors_total, indexes of
// clientReasons.
const (
	reasonBodyTimeout = iota
	reasonBodyAborted
	reasonBodyInvalid
	reasonGoneWhileDelayed
	numClientReasons
)

// clientReasons are the reason labels of floodgate_proxy_client_errors_total.
var clientReasons = [numClientReasons]string{"body_timeout", "body_aborted", "body_invalid", "gone_while_delayed"}

// bodyErrReason sorts a failure to read a request's body: the client too
// slow, gone, or sending a malformed body.
func bodyErrReason(err error) int {
	switch {
	case isTimeout(err):
		return reasonBodyTimeout
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF), errors.Is(err, net.ErrClosed),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return reasonBodyAborted
	default:
		return reasonBodyInvalid
	}
}

// isTimeout reports whether err is a deadline's.
func isTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &t) && t.Timeout()
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

func newFastProxy(up *url.URL, trusted []netip.Prefix, legacy bool, log *slog.Logger, pm *proxyMetrics, to proxyTimeouts) *fastProxy {
	p := &fastProxy{
		legacy: legacy, trusted: trusted, up: up, upName: up.Redacted(), log: log, pm: pm,
		timeouts: to, upTimeouts: pm.upstreamTimeouts, early: headerCtxWorks(),
		dialer:   &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second},
		passed:   pm.requests.WithLabelValues("passed"),
		refused:  pm.requests.WithLabelValues("refused"),
		delayed:  pm.requests.WithLabelValues("delayed"),
		errored:  pm.requests.WithLabelValues("error"),
		upstream: pm.upstream,
	}
	for i, r := range clientReasons {
		p.clientErrs[i] = pm.clients.WithLabelValues(r) // listed at 0 from the start
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
			return &upConn{Conn: c, redial: p.dial, tls: p.upTLS != nil, used: time.Now(), headerTimeout: p.timeouts.upstream}, nil
		},
		// As fasthttp's default (GET, HEAD and PUT are tried again on a
		// fresh connection), but an upstream that let --upstream-timeout
		// pass is not asked again: that would double the wait.
		RetryIfErr: func(req *fasthttp.Request, _ int, err error) (bool, bool) {
			if isHeaderTimeout(err) {
				return false, false
			}
			return false, req.Header.IsGet() || req.Header.IsHead() || req.Header.IsPut()
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
	var early func(*fasthttp.RequestHeader) fasthttp.RequestConfig
	if p.early {
		early = p.headerReceived
	}
	return &fasthttp.Server{
		Handler:                      p.serve,
		HeaderReceived:               early,
		ErrorHandler:                 p.requestError,
		NoDefaultServerHeader:        true,
		NoDefaultContentType:         true,
		StreamRequestBody:            true,
		DisablePreParseMultipartForm: true,
		ReadBufferSize:               maxHeaderBytes,
		WriteBufferSize:              16 << 10,
		// ReadTimeout bounds reading a request's headers (a request's
		// body is read under --client-body-timeout, see headerReceived
		// and forward); IdleTimeout a
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
	// stash is what watch read while the gate delayed the request, for
	// Read to hand fasthttp before reading on.
	stash []byte
	// pend is the gate's decision on the request being read, made in
	// headerReceived, for serve.
	pend pendingVerdict
	// gctx is the gate's context for the connection's requests: it leads
	// watchingClock here.
	gctx connContext
	// readErr is the last error a read of the connection returned.
	readErr error
}

// pendingVerdict is what headerReceived decided of a connection's current
// request, for the handler (serve) or, if its body fails first, the error
// handler (requestError).
type pendingVerdict struct {
	set    bool
	v      *gate.Verdict // nil with noHost
	noHost bool          // refused before the gate: HTTP/1.1 without a Host
	// skipped: a refused request's body was left unread (fasthttp was
	// told it has none): the connection closes after the answer.
	skipped bool
}

// Read hands out what watch read ahead first.
func (c *peerConn) Read(b []byte) (int, error) {
	if len(c.stash) > 0 {
		n := copy(b, c.stash)
		c.stash = c.stash[n:]
		if len(c.stash) == 0 {
			c.stash = nil
		}
		return n, nil
	}
	n, err := c.Conn.Read(b)
	if err != nil {
		c.readErr = err
	}
	return n, err
}

// setReadDeadlineNow sets a read deadline of d from now (0: none), without
// SetReadDeadline's skipping.
func (c *peerConn) setReadDeadlineNow(d time.Duration) {
	c.rd = time.Time{}
	if d > 0 {
		c.rd = time.Now().Add(d)
	}
	c.Conn.SetReadDeadline(c.rd) //nolint:errcheck // a broken connection fails its next read
}

// maxStash bounds what watch reads ahead of fasthttp: past it, a client's
// leaving goes unnoticed until the delay ends.
const maxStash = 64 << 10

// aLongTimeAgo is a deadline that has passed: it ends a blocked read.
var aLongTimeAgo = time.Unix(1, 0)

// watch reads the connection in the background, as net/http's server does
// while a handler runs, and calls gone if the client closes it (EOF or a
// reset). What it reads (a pipelined request, the body) is kept for Read.
// stop ends the watch and restores the read deadline; it must be called
// before the connection is read or watched again.
//
// fasthttp has no other way to learn that a client left: its RequestCtx's
// Done is only the server's shutdown, and nothing reads the connection
// while a handler (or the HeaderReceived hook) runs.
func (c *peerConn) watch(gone func()) (stop func()) {
	if len(c.stash) >= maxStash {
		return func() {}
	}
	c.Conn.SetReadDeadline(time.Time{}) //nolint:errcheck // only stop ends the read
	buf := c.stash
	done := make(chan struct{})
	go func() {
		defer close(done)
		for len(buf) < maxStash {
			if cap(buf)-len(buf) < 512 {
				nb := make([]byte, len(buf), min(max(2*cap(buf), 4<<10), maxStash+512))
				copy(nb, buf)
				buf = nb
			}
			n, err := c.Conn.Read(buf[len(buf):cap(buf)])
			buf = buf[:len(buf)+n]
			if err != nil {
				if !isTimeout(err) { // stop's deadline is not the client's doing
					gone()
				}
				return
			}
		}
	}()
	return func() {
		c.Conn.SetReadDeadline(aLongTimeAgo) //nolint:errcheck
		<-done
		c.stash = buf
		c.Conn.SetReadDeadline(c.rd) //nolint:errcheck
	}
}

// connContext is the context the gate is given for a connection's
// requests: never done, its value for peerConnKey the connection.
type connContext struct{ pc *peerConn }

// peerConnKey is connContext's one value's key.
type peerConnKey struct{}

// Deadline implements context.Context: none.
func (connContext) Deadline() (time.Time, bool) { return time.Time{}, false }

// Done implements context.Context: never done.
func (connContext) Done() <-chan struct{} { return nil }

// Err implements context.Context: never an error.
func (connContext) Err() error { return nil }

// Value implements context.Context: the connection, for peerConnKey.
func (c *connContext) Value(key any) any {
	if _, ok := key.(peerConnKey); ok {
		return c.pc
	}
	return nil
}

// errClientGone ends a delay whose client closed its connection.
var errClientGone = errors.New("floodgate proxy: the client closed its connection while its request was delayed")

// watchingClock is the gate's clock in the proxy: base's time, and base's
// sleep (a delay action's wait) while the request's connection is
// watched, so that the sleep ends with errClientGone when the client goes
// away; the gate then gives the reserved slots back and the request is
// not forwarded, as httplimit's request context does under net/http.
type watchingClock struct{ base floodgate.Clock }

// NowMicro is base's.
func (c watchingClock) NowMicro() int64 { return c.base.NowMicro() }

// Sleep sleeps on base, watching the request's connection (the value of
// ctx for peerConnKey) meanwhile.
func (c watchingClock) Sleep(ctx context.Context, d time.Duration) error {
	pc, _ := ctx.Value(peerConnKey{}).(*peerConn)
	if pc == nil || d <= 0 {
		return c.base.Sleep(ctx, d)
	}
	wctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := pc.watch(func() { cancel(errClientGone) })
	err := c.base.Sleep(wctx, d)
	stop()
	if err != nil && context.Cause(wctx) == errClientGone {
		return errClientGone
	}
	return err
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
	pc.gctx.pc = pc
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

// serve limits one request and forwards it, or refuses it. The gate has
// usually decided already, on the request's header (headerReceived).
func (p *fastProxy) serve(ctx *fasthttp.RequestCtx) {
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
func (p *fastProxy) decide(ctx *fasthttp.RequestCtx, pc *peerConn) (v *gate.Verdict, noHost bool) {
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
func (p *fastProxy) headerReceived(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
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
func (p *fastProxy) requestError(ctx *fasthttp.RequestCtx, err error) {
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

// headerCtxOffset is where a RequestCtx holds its request's header.
var headerCtxOffset = unsafe.Offsetof((*fasthttp.RequestCtx)(nil).Request) + unsafe.Offsetof((*fasthttp.Request)(nil).Header)

// ctxOfHeader returns the RequestCtx whose request's header h is: the
// server's HeaderReceived hook is given &ctx.Request.Header, and the gate
// needs the rest of ctx (the connection, the URI). Only for the hook, and
// only where headerCtxWorks.
func ctxOfHeader(h *fasthttp.RequestHeader) *fasthttp.RequestCtx {
	return (*fasthttp.RequestCtx)(unsafe.Add(unsafe.Pointer(h), -int(headerCtxOffset)))
}

// headerCtxOnce runs headerCtxWorks's check once; headerCtxOK is its
// answer.
var (
	headerCtxOnce sync.Once
	headerCtxOK   bool
)

// headerCtxWorks reports whether this fasthttp gives HeaderReceived the
// header of the RequestCtx its handler then gets (as fasthttp 1.58's
// serveConn does), checked once on a request served over net.Pipe by
// comparing addresses, never dereferencing a guess. Where it does not,
// the gate runs in the handler, after fasthttp has read up to 8 KiB of a
// body.
func headerCtxWorks() bool {
	headerCtxOnce.Do(func() {
		var guess uintptr
		same := make(chan bool, 1)
		s := &fasthttp.Server{
			HeaderReceived: func(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
				guess = uintptr(unsafe.Pointer(h)) - headerCtxOffset
				return fasthttp.RequestConfig{}
			},
			Handler: func(ctx *fasthttp.RequestCtx) {
				select {
				case same <- guess == uintptr(unsafe.Pointer(ctx)):
				default:
				}
			},
			Logger: fastLogger{slog.New(slog.DiscardHandler)},
		}
		client, server := net.Pipe()
		done := make(chan struct{})
		go func() {
			defer close(done)
			s.ServeConn(server) //nolint:errcheck // ends when client closes
		}()
		go io.WriteString(client, "GET / HTTP/1.1\r\nHost: probe\r\n\r\n") //nolint:errcheck
		select {
		case headerCtxOK = <-same:
		case <-time.After(5 * time.Second):
		}
		client.Close()
		server.Close()
		<-done
	})
	return headerCtxOK
}

// observe counts a verdict, as httplimit's Observe did.
func (p *fastProxy) observe(v *gate.Verdict) {
	for i := range v.Outcomes {
		o := &v.Outcomes[i]
		outcome := "ok"
		switch {
		case o.Banned:
			outcome = "banned"
		case o.Decision.Degraded && o.Decision.Reason == floodgate.ReasonStoreUnavailable:
			outcome = "store_unavailable" // refused, the store not asked
		case o.Decision.Degraded:
			outcome = "degraded" // a failure mode admitted it, or its local share refused it
		case o.Over:
			outcome = "over_limit"
		case !o.Decided():
			outcome = "not_limited" // an exempt value, or an unlimited limit
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
// response has under their names. A verdict a failure mode made without
// the store has no RateLimit (nobody counted what remains): the
// upstream's, if it sent one, is dropped too, as a client would take it
// for the proxy's.
func (p *fastProxy) setRateLimit(h *fasthttp.ResponseHeader, v *gate.Verdict) {
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
func (p *fastProxy) refuse(ctx *fasthttp.RequestCtx, v *gate.Verdict, skipped bool) {
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
	VisitAll(f func(key, value []byte))
	DelBytes(key []byte)
}

// removeHop removes the hop-by-hop headers, and every header a Connection
// line names, however many. Each Connection line is visited:
// PeekAll("Connection") gives fasthttp's "close" alone when one line says
// close, hiding the others ("Connection: X-Secret" then "Connection:
// close" passed X-Secret on). A request's lines are read as received
// (VisitAllInOrder): its VisitAll would parse the Cookie header into
// fasthttp's cookies, and send them on re-serialized.
func removeHop(h headerLike) {
	sc := hopScratches.Get().(*hopScratch)
	sc.buf, sc.names = sc.store[:0], sc.names[:0]
	if rh, ok := h.(*fasthttp.RequestHeader); ok {
		rh.VisitAllInOrder(sc.visit)
	} else {
		h.VisitAll(sc.visit)
	}
	for _, name := range sc.names {
		h.DelBytes(name)
	}
	clear(sc.names)
	hopScratches.Put(sc)
	for _, name := range hopHeaders {
		h.DelBytes(name)
	}
}

// hopScratch is removeHop's working memory, pooled: the names a
// Connection line lists, copied out (deleting headers moves the values),
// and visit, the header visitor, made once, so that a request allocates
// none of it.
type hopScratch struct {
	store [256]byte
	buf   []byte
	names [][]byte
	visit func(key, line []byte)
}

var hopScratches = sync.Pool{New: func() any {
	sc := &hopScratch{}
	sc.visit = sc.connectionNames
	return sc
}}

// connectionNames collects the names a Connection line lists (but close
// and keep-alive); other headers are passed over.
func (sc *hopScratch) connectionNames(key, line []byte) {
	if !eqFold(key, "Connection") {
		return
	}
	for len(line) > 0 {
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
		start := len(sc.buf)
		sc.buf = append(sc.buf, tok...)
		sc.names = append(sc.names, sc.buf[start:len(sc.buf):len(sc.buf)])
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
	hdrXRealIP   = []byte("X-Real-IP")
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
		// A client's own forwarding headers name whatever it likes: the
		// upstream gets the proxy's X-Forwarded-For alone (Forwarded is
		// dropped above), and no X-Real-IP, which nginx-style upstreams
		// believe from their proxy.
		h.DelBytes(hdrXRealIP)
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
			// it lasts, each read within --client-body-timeout of the
			// last (flushingReader), and each read is sent on at once
			// (fasthttp would keep the tail of each in its buffer until
			// the next).
			pc.setReadDeadlineNow(p.timeouts.body)
			streamed = true
			out = fasthttp.AcquireRequest()
			defer fasthttp.ReleaseRequest(out)
			req.Header.CopyTo(&out.Header)
			req.URI().CopyTo(out.URI())
			pc.readErr = nil // see flushingReader.read
			body = &flushingReader{r: req.BodyStream(), pc: pc, timeout: p.timeouts.body, want: int64(req.Header.ContentLength())}
			out.SetBodyStream(body, req.Header.ContentLength())
		}
	}
	resp := &ctx.Response
	if err := p.hc.Do(out, resp); err != nil {
		if streamed {
			ctx.SetConnectionClose() // what is left of the body is not a request
		}
		switch {
		case body != nil && body.err != nil:
			// The client's body failed: it stalled, the client left, or
			// it is malformed (a broken chunked encoding, say). The
			// client's fault, not the upstream's.
			p.clientBodyFailed(ctx, body.err)
		case isHeaderTimeout(err):
			p.gatewayTimeout(ctx)
		default:
			p.badGateway(ctx, err)
		}
		return
	}
	resp.Header.SetNoDefaultContentType(true)
	removeHop(&resp.Header)
	p.setRateLimit(&resp.Header, v)
}

// clientBodyFailed answers a request whose body could not be read (408 if
// it stalled, else 400; the client may not be there to read it) and
// counts it as the client's error.
func (p *fastProxy) clientBodyFailed(ctx *fasthttp.RequestCtx, err error) {
	reason := bodyErrReason(err)
	p.clientErrs[reason].Inc()
	p.log.Debug("the client's request body failed", "reason", clientReasons[reason], "peer", ctx.RemoteAddr().String(), "err", err)
	ctx.Response.Reset()
	ctx.SetConnectionClose()
	ctx.Response.Header.SetContentType("text/plain; charset=utf-8")
	if reason == reasonBodyTimeout {
		ctx.Response.SetStatusCode(fasthttp.StatusRequestTimeout)
		ctx.Response.SetBodyString(fmt.Sprintf("floodgate proxy: the request's body stalled for %v\n", p.timeouts.body))
		return
	}
	ctx.Response.SetStatusCode(fasthttp.StatusBadRequest)
	ctx.Response.SetBodyString(fmt.Sprintf("floodgate proxy: the request's body could not be read: %v\n", err))
}

// gatewayTimeout answers a request whose upstream sent no response header
// within --upstream-timeout.
func (p *fastProxy) gatewayTimeout(ctx *fasthttp.RequestCtx) {
	p.upstream.Inc()
	p.upTimeouts.Inc()
	p.log.Warn("upstream timeout: no response header in time", "upstream", p.upName, "timeout", p.timeouts.upstream)
	ctx.Response.Reset()
	ctx.Response.Header.SetNoDefaultContentType(true)
	ctx.Response.SetStatusCode(fasthttp.StatusGatewayTimeout)
	ctx.Response.Header.SetContentType("text/plain; charset=utf-8")
	ctx.Response.SetBodyString(fmt.Sprintf("floodgate proxy: the upstream %s sent no response header within %v\n", p.upName, p.timeouts.upstream))
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
//
// With a headerTimeout, the wait for each response's header is bounded,
// and only that: fasthttp's own ReadTimeout would bound the whole
// response, body included, and cut a long stream. fasthttp clears the read
// deadline after it has written a request and before it reads the
// response: there the header's deadline is set instead, and Read lifts it
// as soon as the header's blank line has come (after a 100 Continue,
// fasthttp's one interim response, the next header's).
type upConn struct {
	net.Conn
	redial func() (net.Conn, error)
	tls    bool
	used   time.Time
	// deadlines are set: fasthttp sets none (no timeouts) but clears
	// both for each request, a timer update each.
	rdSet, wdSet bool

	headerTimeout time.Duration
	awaiting      bool    // a response's header is awaited under headerTimeout
	lineLen       int     // bytes (CR aside) of the header line being read
	blockLen      int     // bytes of the header read so far
	status        [3]byte // its status code
}

// upstreamHeaderTimeout is Read's error when the upstream's header did not
// come within headerTimeout (fasthttp reports it as ErrTimeout when no
// byte of the header came).
type upstreamHeaderTimeout struct{ d time.Duration }

// Error names the timeout.
func (e upstreamHeaderTimeout) Error() string {
	return fmt.Sprintf("no response header within %v", e.d)
}

// Timeout marks it a timeout.
func (upstreamHeaderTimeout) Timeout() bool { return true }

// isHeaderTimeout reports whether a HostClient's error is the upstream's
// header timeout: the only read deadline its connections have (writes have
// none).
func isHeaderTimeout(err error) bool {
	var ht upstreamHeaderTimeout
	return errors.Is(err, fasthttp.ErrTimeout) || errors.As(err, &ht)
}

// Read reads, and while a header is awaited, watches for its end.
func (c *upConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if !c.awaiting {
		return n, err
	}
	for i := 0; i < n && c.awaiting; i++ {
		switch ch := b[i]; ch {
		case '\r':
		case '\n':
			if c.lineLen == 0 && c.blockLen > 0 {
				// The blank line: the header is whole. A 100 Continue's
				// is followed by the real one, awaited in turn.
				if c.status != [3]byte{'1', '0', '0'} {
					c.awaiting, c.rdSet = false, false
					if derr := c.Conn.SetReadDeadline(time.Time{}); derr != nil && err == nil {
						err = derr
					}
				}
				c.blockLen, c.status = 0, [3]byte{}
				continue
			}
			c.lineLen = 0
		default:
			// "HTTP/1.1 200": the status code is the block's 10th to
			// 12th bytes.
			if k := c.blockLen - 9; k >= 0 && k < 3 {
				c.status[k] = ch
			}
			c.lineLen++
			c.blockLen++
		}
	}
	if err != nil && c.awaiting && isTimeout(err) {
		err = upstreamHeaderTimeout{c.headerTimeout}
	}
	return n, err
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

// SetReadDeadline is called by fasthttp before each response it reads,
// with no deadline: the header's is set instead.
func (c *upConn) SetReadDeadline(t time.Time) error {
	if t.IsZero() && c.headerTimeout > 0 {
		c.awaiting, c.lineLen, c.blockLen, c.status = true, 0, 0, [3]byte{}
		c.rdSet = true
		return c.Conn.SetReadDeadline(time.Now().Add(c.headerTimeout))
	}
	c.awaiting = false
	if t.IsZero() && !c.rdSet {
		return nil
	}
	c.rdSet = !t.IsZero()
	return c.Conn.SetReadDeadline(t)
}

// SetDeadline sets both.
func (c *upConn) SetDeadline(t time.Time) error {
	c.awaiting = false
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
// after each, so that a body of known length streams as it comes. Each
// read must come within timeout (--client-body-timeout) of the one before.
// Its err is the client's read error, if any (a stall, a body cut short,
// a broken chunked encoding), so that it is answered and counted as the
// client's failure, not the upstream's.
type flushingReader struct {
	r       io.Reader
	pc      *peerConn     // the client's connection, for the deadlines
	timeout time.Duration // 0: none
	want    int64         // the body's length; -1: chunked
	n       int64         // read so far
	err     error
}

// read reads once, under the deadline. A body that ends early is
// io.ErrUnexpectedEOF where fasthttp's stream says io.EOF: one of known
// length, and a chunked one cut between two chunks (fasthttp reads the
// connection's EOF where the next chunk's size should be as the body's
// end); a chunked body's true end comes without the connection failing.
func (f *flushingReader) read(p []byte) (int, error) {
	if f.timeout > 0 {
		f.pc.setReadDeadlineNow(f.timeout)
	}
	n, err := f.r.Read(p)
	f.n += int64(n)
	if err == io.EOF && (f.want >= 0 && f.n < f.want || f.want < 0 && f.pc.readErr != nil) {
		err = io.ErrUnexpectedEOF
	}
	if err != nil && err != io.EOF {
		f.err = err
	}
	return n, err
}

// Read is read, for fasthttp's chunked writer.
func (f *flushingReader) Read(p []byte) (int, error) { return f.read(p) }

// WriteTo copies the body to w, flushing after each read, for fasthttp's
// writer of a body of known length.
func (f *flushingReader) WriteTo(w io.Writer) (int64, error) {
	fl, _ := w.(interface{ Flush() error })
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	buf := *bp
	var n int64
	for {
		m, err := f.read(buf)
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
			return n, err
		}
	}
}

var copyBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

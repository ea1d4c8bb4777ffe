// Package proxy is the data path of `floodgate proxy`: a fasthttp server
// that limits each request with a [gate.Gate] and forwards it to one
// upstream, streaming bodies both ways and passing protocol switches
// (WebSocket) through. The command builds the gate, the store and the
// admin API; this package holds the rest.
//
// Files: proxy.go (New, the server), hooks.go (the server's handler and
// hooks: the gate's decision, what is refused before it), headerctx.go
// (the one unsafe access into fasthttp), forward.go (the request to the
// upstream and its answer back), upstream.go (the upstream's
// connections), upgrade.go (protocol switches), hop.go (hop-by-hop
// headers), refuse.go (refusals), conn.go (the client's connection),
// wait.go (a delay that ends when its client leaves, holding no
// throttler slot), throttle.go (the server throttler's admission before
// the gate, given back for a delay), metrics.go.
package proxy

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/floodgate/floodgate/gate"
	"github.com/floodgate/floodgate/throttle"
)

// Config is what a Proxy is built from.
type Config struct {
	// Upstream is the service behind the proxy: http:// or https://, a
	// host, and optionally a path and query the request's are joined to.
	Upstream *url.URL
	// TrustedProxies are the load balancers in front of the proxy whose
	// X-Forwarded-For is kept and extended.
	TrustedProxies []netip.Prefix
	// XRateLimit adds the X-RateLimit-* headers.
	XRateLimit bool
	// UpstreamTimeout bounds the wait for the upstream's response header,
	// from the moment the request has been sent (0: none).
	UpstreamTimeout time.Duration
	// BodyTimeout bounds the wait for each read of a request's body (0:
	// none).
	BodyTimeout time.Duration
	// Logger receives the proxy's messages; Metrics counts its requests.
	Logger  *slog.Logger
	Metrics *Metrics
	// MaxConnsPerIP caps the connections one client address may hold
	// open at once, idle ones included (nginx's limit_conn, by
	// connection); one past it is answered 429 and closed at once. The
	// TrustedProxies' addresses are exempt. 0: no cap.
	MaxConnsPerIP int
	// Throttle, if set, admits each request before the gate decides it
	// (a shed request spends no quota): at once, after a wait in its
	// queue, or shed with 503 and Retry-After (see package throttle). A
	// request the gate delays gives its slot back for the delay and is
	// admitted again when it ends, if the gate's clock is Clock's.
	// Protocol switches are not throttled. nil: no throttler.
	Throttle *throttle.Throttler
	// CriticalityHeader is the request header the throttler reads a
	// request's criticality from; throttle.DefaultHeader if empty.
	CriticalityHeader string
	// OnVerdict, if set, sees each verdict of the gate after the metrics
	// have counted it (the dashboard's recorder): on the request's
	// goroutine, so it must be quick, and it must not keep v.
	OnVerdict func(v *gate.Verdict)
}

// Proxy is the proxy's data path: a fasthttp server whose handler limits
// each request with the gate and forwards it with a fasthttp.HostClient
// on keep-alive HTTP/1.1 connections to the upstream.
//
// The gate decides a request as soon as its header is read
// (headerReceived), before fasthttp reads any of its body or answers its
// "Expect: 100-continue": a refused request's body is never waited for.
type Proxy struct {
	gate    atomic.Pointer[gate.Gate] // rebuilt on every rules reload
	defers  atomic.Pointer[deferSet]  // the defer limits' queues (SetDefer)
	legacy  bool
	trusted []netip.Prefix

	up      *url.URL
	upName  string // up.Redacted(), for errors
	upAddr  string // host:port
	upTLS   *tls.Config
	rewrite bool   // the upstream URL has a path or query to join
	upPath  string // its escaped path
	upQuery string
	dialer  *net.Dialer
	hc      *fasthttp.HostClient
	// hcStream sends the requests whose body of known length streams
	// (hostClient).
	hcStream *fasthttp.HostClient
	srv      *fasthttp.Server
	log      *slog.Logger

	pm        *Metrics
	onVerdict func(*gate.Verdict)
	passed    prometheus.Counter
	refused   prometheus.Counter
	delayed   prometheus.Counter
	errored   prometheus.Counter
	upstream  prometheus.Counter

	timeouts struct {
		upstream time.Duration // Config.UpstreamTimeout
		body     time.Duration // Config.BodyTimeout
	}
	upTimeouts prometheus.Counter
	clientErrs [numClientReasons]prometheus.Counter
	// early: the gate runs in the server's HeaderReceived hook
	// (headerCtxWorks); else in the handler, after fasthttp has read the
	// first 8 KiB of a body.
	early bool
	// conns caps the connections per client address (nil: no cap).
	conns *connCap
	// th admits allowed requests (nil: none); critHeader names the
	// header of their criticality.
	th         *throttle.Throttler
	critHeader string
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

// New returns a proxy to cfg.Upstream. It serves nothing before its gate
// is set (SetGate).
func New(cfg Config) (*Proxy, error) {
	up := cfg.Upstream
	if up == nil || (up.Scheme != "http" && up.Scheme != "https") || up.Host == "" {
		return nil, fmt.Errorf("proxy: upstream %v: want an http:// or https:// URL with a host", up)
	}
	if cfg.MaxConnsPerIP < 0 {
		return nil, fmt.Errorf("proxy: MaxConnsPerIP %d: want 0 (no cap) or more", cfg.MaxConnsPerIP)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics()
	}
	pm := cfg.Metrics
	p := &Proxy{
		legacy: cfg.XRateLimit, trusted: cfg.TrustedProxies, up: up, upName: up.Redacted(), log: cfg.Logger, pm: pm, onVerdict: cfg.OnVerdict,
		upTimeouts: pm.upstreamTimeouts, early: headerCtxWorks(),
		dialer:   &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second},
		passed:   pm.requests.WithLabelValues("passed"),
		refused:  pm.requests.WithLabelValues("refused"),
		delayed:  pm.requests.WithLabelValues("delayed"),
		errored:  pm.requests.WithLabelValues("error"),
		upstream: pm.upstream,
	}
	p.timeouts.upstream, p.timeouts.body = cfg.UpstreamTimeout, cfg.BodyTimeout
	p.th, p.critHeader = cfg.Throttle, cfg.CriticalityHeader
	if p.critHeader == "" {
		p.critHeader = throttle.DefaultHeader
	}
	p.conns = newConnCap(cfg.MaxConnsPerIP, cfg.TrustedProxies, pm.connsRefused)
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
	p.hc = p.hostClient(16 << 10)
	p.hcStream = p.hostClient(1)
	p.srv = p.server()
	return p, nil
}

// SetGate makes g the gate of the requests read from now on.
func (p *Proxy) SetGate(g *gate.Gate) { p.gate.Store(g) }

// Gate returns the gate set last.
func (p *Proxy) Gate() *gate.Gate { return p.gate.Load() }

// Serve serves the proxy on l until Shutdown.
func (p *Proxy) Serve(l net.Listener) error {
	return p.srv.Serve(peerListener{Listener: l, scan: p.early, conns: p.conns})
}

// Shutdown stops the server as fasthttp's ShutdownWithContext does (its
// idle connections closed at once, the others after their request), then
// closes the idle connections to the upstream.
func (p *Proxy) Shutdown(ctx context.Context) error {
	err := p.srv.ShutdownWithContext(ctx)
	p.hc.CloseIdleConnections()
	p.hcStream.CloseIdleConnections()
	return err
}

// server returns the proxy's fasthttp server.
func (p *Proxy) server() *fasthttp.Server {
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
		// and forward); IdleTimeout a keep-alive connection's wait for
		// its next request. nginx's client_header_timeout is 60 s too.
		// The two are the same so that peerConn can skip fasthttp's
		// second deadline of each request.
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

package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/clock"
	"github.com/redis/rueidis"

	"github.com/floodgate/floodgate/gate"
	"github.com/floodgate/floodgate/internal/dashboard"
	"github.com/floodgate/floodgate/internal/proxy"
	"github.com/floodgate/floodgate/overrides"
	"github.com/floodgate/floodgate/rules"
	"github.com/floodgate/floodgate/service"
	"github.com/floodgate/floodgate/throttle/throttlemetrics"
)

// proxyConfig is what `floodgate proxy` is told, by flags or FLOODGATE_*
// environment variables (flags win).
type proxyConfig struct {
	commonConfig
	upstream, listen       string
	trusted                string
	clientIPHeaders        string
	ipv6Prefix             int
	xRateLimit, failClosed bool
	// upstreamTimeout bounds the wait for the upstream's response header
	// (0: none); bodyTimeout the wait for each read of a request's body
	// (0: none).
	upstreamTimeout, bodyTimeout time.Duration
	connCap                      connCapConfig
	throttle                     throttleConfig
	// deferq tunes the defer routes' queues (deferq.Options).
	deferq deferConfig
}

func proxyFlags(args []string, stderr io.Writer) (*proxyConfig, error) {
	c := &proxyConfig{}
	fs := flag.NewFlagSet("proxy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c.register(fs, "memory-store snapshots, the example rules", "127.0.0.1:6071")
	c.registerMaxMemory(fs)
	c.journal.register(fs)
	c.connCap.register(fs)
	c.throttle.register(fs)
	fs.StringVar(&c.upstream, "upstream", envString("UPSTREAM", ""), "the service behind the proxy, http://host:port (required) [FLOODGATE_UPSTREAM]")
	fs.StringVar(&c.listen, "listen", envString("LISTEN", "127.0.0.1:8000"), "the proxy's listen address (port 0: any free port) [FLOODGATE_LISTEN]")
	fs.StringVar(&c.trusted, "trusted-proxies", envString("TRUSTED_PROXIES", ""), "comma-separated CIDRs of load balancers in front of the proxy, whose --client-ip-header is believed [FLOODGATE_TRUSTED_PROXIES]")
	fs.StringVar(&c.clientIPHeaders, "client-ip-header", envString("CLIENT_IP_HEADER", "X-Forwarded-For"), "the forwarding header(s) the trusted proxies set, comma-separated, the first present winning: X-Forwarded-For, Forwarded or X-Real-IP; name only those they set [FLOODGATE_CLIENT_IP_HEADER]")
	fs.IntVar(&c.ipv6Prefix, "ipv6-prefix", envInt("IPV6_PREFIX", 64), "IPv6 clients are keyed by this prefix length (128: each address) [FLOODGATE_IPV6_PREFIX]")
	fs.BoolVar(&c.xRateLimit, "x-ratelimit-headers", envBool("X_RATELIMIT_HEADERS"), "add X-RateLimit-Limit/Remaining/Reset headers [FLOODGATE_X_RATELIMIT_HEADERS]")
	fs.BoolVar(&c.failClosed, "fail-closed", envBool("FAIL_CLOSED"), "refuse requests (503) when the store fails outright; default: let them through [FLOODGATE_FAIL_CLOSED]")
	fs.DurationVar(&c.upstreamTimeout, "upstream-timeout", envDuration("UPSTREAM_TIMEOUT", 60*time.Second), "how long the upstream may take to send a response's header once it has the request, else 504; a response whose header came is never cut (it may stream for as long as it lasts); 0: no limit [FLOODGATE_UPSTREAM_TIMEOUT]")
	fs.DurationVar(&c.bodyTimeout, "client-body-timeout", envDuration("CLIENT_BODY_TIMEOUT", 60*time.Second), "how long a client may leave its request's body without sending more (between two reads, as nginx's client_body_timeout), else 408 and the connection closes; 0: no limit [FLOODGATE_CLIENT_BODY_TIMEOUT]")
	c.deferq.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("proxy: unexpected argument %q", fs.Arg(0))
	}
	if c.upstream == "" {
		return nil, errors.New("proxy: --upstream is required (the service to protect, http://host:port)")
	}
	if c.upstreamTimeout < 0 {
		return nil, fmt.Errorf("proxy: --upstream-timeout %v: want 0 (no limit) or more", c.upstreamTimeout)
	}
	if c.bodyTimeout < 0 {
		return nil, fmt.Errorf("proxy: --client-body-timeout %v: want 0 (no limit) or more", c.bodyTimeout)
	}
	if err := c.connCap.check(); err != nil {
		return nil, err
	}
	if err := c.throttle.check(); err != nil {
		return nil, err
	}
	if err := c.deferq.check(); err != nil {
		return nil, err
	}
	return c, nil
}

// proxyCommand runs `floodgate proxy` with args.
func proxyCommand(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c, err := proxyFlags(args, stderr)
	if err != nil {
		return command("proxy", stderr, nil, err, nil)
	}
	return command("proxy", stderr, &c.commonConfig, nil, func(log *slog.Logger) error { return runProxy(ctx, c, log) })
}

// runProxy runs `floodgate proxy` until ctx ends: the proxy's data path
// (internal/proxy) on --listen, its admin API on --admin-addr, the gate
// rebuilt on every rules reload.
func runProxy(ctx context.Context, c *proxyConfig, log *slog.Logger) error {
	if os.Getenv("GOGC") == "" {
		// A proxy's live heap is small and its garbage per request large
		// (headers, buffers): collect less often.
		debug.SetGCPercent(400)
	}
	pc, err := c.parse()
	if err != nil {
		return err
	}
	if err := c.prepare(log); err != nil {
		return err
	}
	tp, stopTracing, err := c.trace.provider(os.Stderr, log)
	if err != nil {
		return err
	}
	defer stopTracing()
	c.trace.tp = tp // the gates' (gateBuilder)
	metrics := service.NewMetrics()
	pm := proxy.NewMetrics()
	for _, col := range pm.Collectors() {
		if err := metrics.Register(col); err != nil {
			return err
		}
	}
	st, err := c.openStore("proxy-memstore.snapshot", log, metrics)
	if err != nil {
		return err
	}
	defer func() {
		if err := st.close(); err != nil {
			log.Error("close", "err", err)
		}
	}()
	// Overrides: where serve keeps them (on Redis, the same), for the
	// rules-file limits and the admin API.
	ovr, err := c.openOverrides(st, "proxy-overrides.db")
	if err != nil {
		return err
	}
	defer ovr.Close()
	th := c.throttle.throttler()
	if th != nil {
		if err := metrics.Register(throttlemetrics.New(th, nil)); err != nil {
			return err
		}
	}
	pd := newProxyDashboard(c, st, th)
	pcfg := proxy.Config{Upstream: pc.upstream, TrustedProxies: pc.clientIP.TrustedProxies, XRateLimit: c.xRateLimit,
		UpstreamTimeout: c.upstreamTimeout, BodyTimeout: c.bodyTimeout, Logger: log, Metrics: pm,
		MaxConnsPerIP: c.connCap.maxConnsPerIP, Throttle: th, CriticalityHeader: c.throttle.header}
	if pd != nil {
		pcfg.OnVerdict = pd.onVerdict
	}
	fp, err := proxy.New(pcfg)
	if err != nil {
		return err
	}
	var rc rueidis.Client
	if st.redis != nil {
		rc = st.redis.Client()
	}
	dw := newDeferWorkers(rc, c.upstream, c.deferq.options(), log)
	defer dw.stop()
	if rc != nil {
		if err := metrics.Register(newDeferMetrics(dw)); err != nil {
			return err
		}
	}
	onLoad := c.gateBuilder(fp, st.store, ovr, pc.clientIP, dw, log)
	if pd != nil {
		build := onLoad
		onLoad = func(cfg *rules.Config) error {
			if err := build(cfg); err != nil {
				return err
			}
			pd.prune(cfg)
			return nil
		}
	}
	loader := &ruleLoader{dir: c.rulesDir, log: log, metrics: metrics, files: map[string]*rules.Domain{},
		opts: c.throttle.rulesOptions(th, c.calendarMonth), onLoad: onLoad}
	cfg, err := loader.load() // builds the gate (onLoad)
	if err != nil {
		return err
	}
	// The admin API: the service's (rules, keys) on the same store and
	// rules, plus bans.
	svc := service.New(cfg, service.Options{Store: st.store, Overrides: ovr, Metrics: metrics, Logger: log})
	loader.svc = svc
	var dash *dashboard.Dashboard
	if pd != nil {
		dash = dashboard.New(pd, dashboard.Options{Token: c.adminToken, Guard: svc.RequireToken, Server: "proxy", NoLatency: true})
		stop := sampleEverySecond(pd.rec)
		defer stop()
	}
	err = c.serveProxy(ctx, log, fp, proxyAdmin(c.adminToken, svc, fp, dw, metrics, st.ready, dash), dash, loader)
	fp.Gate().Close()
	return err
}

// proxyParsed is what runProxy makes of proxyConfig's strings.
type proxyParsed struct {
	upstream *url.URL
	clientIP gate.ClientIP
}

// parse checks and parses --upstream, --trusted-proxies,
// --client-ip-header and --ipv6-prefix.
func (c *proxyConfig) parse() (*proxyParsed, error) {
	up, err := url.Parse(c.upstream)
	if err != nil || (up.Scheme != "http" && up.Scheme != "https") || up.Host == "" {
		return nil, fmt.Errorf("--upstream %q: want an http:// or https:// URL with a host", c.upstream)
	}
	trusted, err := parseTrusted(c.trusted)
	if err != nil {
		return nil, err
	}
	ipHeaders, err := parseIPHeaders(c.clientIPHeaders)
	if err != nil {
		return nil, err
	}
	if c.ipv6Prefix < 1 || c.ipv6Prefix > 128 {
		return nil, fmt.Errorf("--ipv6-prefix %d: want 1 to 128", c.ipv6Prefix)
	}
	return &proxyParsed{upstream: up, clientIP: gate.ClientIP{TrustedProxies: trusted, Headers: ipHeaders, IPv6Prefix: c.ipv6Prefix}}, nil
}

// parseTrusted parses --trusted-proxies: comma-separated CIDRs or
// addresses.
func parseTrusted(list string) ([]netip.Prefix, error) {
	var trusted []netip.Prefix
	for _, s := range strings.Split(list, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			a, aerr := netip.ParseAddr(s)
			if aerr != nil {
				return nil, fmt.Errorf("--trusted-proxies: %q is not a CIDR or an address", s)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		trusted = append(trusted, p)
	}
	return trusted, nil
}

// parseIPHeaders parses --client-ip-header.
func parseIPHeaders(list string) ([]string, error) {
	var ipHeaders []string
	for _, h := range strings.Split(list, ",") {
		h = strings.TrimSpace(h)
		switch strings.ToLower(h) {
		case "x-forwarded-for", "forwarded", "x-real-ip":
			ipHeaders = append(ipHeaders, h)
		default:
			return nil, fmt.Errorf("--client-ip-header: %q: want X-Forwarded-For, Forwarded or X-Real-IP", h)
		}
	}
	return ipHeaders, nil
}

// gateBuilder returns the rules loader's onLoad: it builds the gate of a
// rules configuration and gives it to fp. State lives in the store.
func (c *proxyConfig) gateBuilder(fp *proxy.Proxy, store floodgate.Store, ovr overrides.Store, clientIP gate.ClientIP, dw *deferWorkers, log *slog.Logger) func(*rules.Config) error {
	return func(cfg *rules.Config) error {
		limits, err := gate.FromRules(cfg)
		if err != nil {
			return err
		}
		queues, err := dw.build(cfg, limits)
		if err != nil {
			return err
		}
		g, err := gate.New(gate.Config{
			Limits: limits, Store: store, Rules: cfg, Overrides: overrides.Lookup(ovr), FailClosed: c.failClosed, Logger: log,
			Clock:    proxy.Clock(clock.Coarse), // a delay ends early when its client leaves
			ClientIP: clientIP, TracerProvider: c.trace.tp,
		})
		if err != nil {
			return err
		}
		fp.SetDefer(queues) // before the gate that defers to them
		dw.run(queues)
		fp.SetGate(g)
		log.Info("http routes live", "routes", len(limits), "deferred_queues", len(queues))
		return nil
	}
}

// proxyAdmin returns the proxy's admin API: metrics, health, the
// service's routes (rules, keys), lifting a ban, and the deferred
// queues' dead letters (deadletters.go).
func proxyAdmin(token string, svc *service.Service, fp *proxy.Proxy, dw *deferWorkers, metrics *service.Metrics, ready func() (bool, string), dash *dashboard.Dashboard) http.Handler {
	admin := http.NewServeMux()
	admin.Handle("GET /metrics", promhttp.HandlerFor(metrics.Registry, promhttp.HandlerOpts{}))
	admin.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") })
	admin.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ok, why := ready()
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		io.WriteString(w, why+"\n")
	})
	// svc's guard: one throttle of failed tokens with svc.AdminHandler's routes
	admin.Handle("POST /v1/bans/lift", svc.RequireToken(token, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct{ Limit, Key string }
		if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&body); err != nil || body.Limit == "" || body.Key == "" {
			http.Error(w, `want {"limit":"domain/route","key":"..."}`, http.StatusBadRequest)
			return
		}
		if err := fp.Gate().Lift(r.Context(), body.Limit, body.Key); err != nil {
			http.Error(w, err.Error(), http.StatusNotFound)
			return
		}
		io.WriteString(w, "lifted\n")
	})))
	admin.Handle("GET /v1/deadletters", svc.RequireToken(token, http.HandlerFunc(dw.listDeadLetters)))
	admin.Handle("POST /v1/deadletters/requeue", svc.RequireToken(token, http.HandlerFunc(dw.requeueDeadLetters)))
	if dash != nil {
		// the dashboard (dashboard.go): decisions, top keys, health
		admin.Handle("/dashboard/", dash)
		admin.Handle("/dashboard", http.RedirectHandler("/dashboard/", http.StatusMovedPermanently))
	}
	admin.Handle("/", svc.AdminHandler(token))
	return admin
}

// serveProxy serves the proxy and its admin API until ctx ends or either
// fails, serving the rules' reloads meanwhile, then drains both.
func (c *proxyConfig) serveProxy(ctx context.Context, log *slog.Logger, fp *proxy.Proxy, admin http.Handler, dash *dashboard.Dashboard, loader *ruleLoader) error {
	pl, err := net.Listen("tcp", c.listen)
	if err != nil {
		return fmt.Errorf("proxy listener %s: %w", c.listen, err)
	}
	log.Info("listening", "api", "proxy", "addr", pl.Addr().String(), "upstream", c.upstreamRedacted())
	al, err := net.Listen("tcp", c.adminAddr)
	if err != nil {
		pl.Close()
		return fmt.Errorf("admin listener %s: %w", c.adminAddr, err)
	}
	log.Info("listening", "api", "admin", "addr", al.Addr().String())
	if !isLoopback(c.adminAddr) {
		log.Warn("the admin API listens beyond loopback over plain HTTP (proxy has no TLS for it): its bearer token crosses the network in the clear; keep it on a private network or behind a TLS terminator", "addr", al.Addr().String())
	}
	as := &http.Server{Handler: admin, ReadHeaderTimeout: 10 * time.Second}
	if dash != nil {
		as.RegisterOnShutdown(dash.Close) // ends the event streams: Shutdown waits for them
	}
	var wg sync.WaitGroup
	errc := make(chan error, 2)
	wg.Add(2)
	go func() {
		defer wg.Done()
		if err := fp.Serve(pl); err != nil {
			errc <- err
		}
	}()
	go func() {
		defer wg.Done()
		if err := as.Serve(al); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errc <- err
		}
	}()

	c.serveUntilStopped(ctx, log, loader, errc, "floodgate proxy serving")
	dctx, cancel := context.WithTimeout(context.Background(), c.drain)
	defer cancel()
	if err := fp.Shutdown(dctx); err != nil {
		log.Warn("drain: requests still in flight", "err", err)
	}
	as.Shutdown(dctx)
	wg.Wait()
	log.Info("stopped")
	return nil
}

// upstreamRedacted is --upstream without its password, for the log.
func (c *proxyConfig) upstreamRedacted() string {
	if u, err := url.Parse(c.upstream); err == nil {
		return u.Redacted()
	}
	return c.upstream
}

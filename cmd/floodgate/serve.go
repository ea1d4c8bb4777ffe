package main

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/dashboard"
	"github.com/floodgate/floodgate/internal/gcfloor"
	"github.com/floodgate/floodgate/overrides"
	"github.com/floodgate/floodgate/rules"
	"github.com/floodgate/floodgate/service"
)

// serveConfig is what `floodgate serve` is told, by flags or FLOODGATE_*
// environment variables (flags win).
type serveConfig struct {
	commonConfig
	grpcAddr, httpAddr             string
	tlsCert, tlsKey, tlsClientCA   string
	allowRequestLimits, xRateLimit bool
	noRateLimit, shadowMode        bool
	record                         recordConfig   // the what-if recorder (--record-*)
	capacity                       capacityConfig // capacity leases (capacity.go)
}

func serveFlags(args []string, stderr io.Writer) (*serveConfig, error) {
	c := &serveConfig{}
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c.register(fs, "overrides, memory-store snapshots, the example rules, the capacity lease watermark", "127.0.0.1:6070")
	c.registerMaxMemory(fs)
	c.journal.register(fs)
	fs.StringVar(&c.grpcAddr, "grpc-addr", envString("GRPC_ADDR", "127.0.0.1:8081"), "gRPC listen address, HOST:PORT (port 0: any free port) or unix:PATH [FLOODGATE_GRPC_ADDR]")
	fs.StringVar(&c.httpAddr, "http-addr", envString("HTTP_ADDR", "127.0.0.1:8080"), "HTTP listen address, HOST:PORT or unix:PATH: /json, /healthz, /readyz, /metrics [FLOODGATE_HTTP_ADDR]")
	fs.StringVar(&c.tlsCert, "tls-cert", envString("TLS_CERT", ""), "TLS certificate for the gRPC, HTTP and admin listeners [FLOODGATE_TLS_CERT]")
	fs.StringVar(&c.tlsKey, "tls-key", envString("TLS_KEY", ""), "TLS key [FLOODGATE_TLS_KEY]")
	fs.StringVar(&c.tlsClientCA, "tls-client-ca", envString("TLS_CLIENT_CA", ""), "require client certificates signed by this CA [FLOODGATE_TLS_CLIENT_CA]")
	fs.BoolVar(&c.allowRequestLimits, "allow-request-limits", envBool("ALLOW_REQUEST_LIMITS"), "honour a descriptor's own limit field (lets callers choose their limit) [FLOODGATE_ALLOW_REQUEST_LIMITS]")
	fs.BoolVar(&c.xRateLimit, "x-ratelimit-headers", envBool("X_RATELIMIT_HEADERS"), "add X-RateLimit-Limit/Remaining/Reset headers [FLOODGATE_X_RATELIMIT_HEADERS]")
	fs.BoolVar(&c.noRateLimit, "no-ratelimit-headers", envBool("NO_RATELIMIT_HEADERS"), "leave out the RateLimit-Policy, RateLimit and Retry-After headers (they name the rules to clients) [FLOODGATE_NO_RATELIMIT_HEADERS]")
	fs.BoolVar(&c.shadowMode, "shadow-mode", envBool("SHADOW_MODE"), "every limit in shadow mode: decide, count and report, refuse nothing (envoyproxy/ratelimit's SHADOW_MODE) [FLOODGATE_SHADOW_MODE]")
	c.record.register(fs)
	c.capacity.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return nil, err
	}
	if err := c.record.check(); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("serve: unexpected argument %q", fs.Arg(0))
	}
	if err := c.capacity.check(); err != nil {
		return nil, err
	}
	if (c.tlsCert == "") != (c.tlsKey == "") {
		return nil, errors.New("serve: --tls-cert and --tls-key go together")
	}
	if c.tlsClientCA != "" && c.tlsCert == "" {
		return nil, errors.New("serve: --tls-client-ca needs --tls-cert and --tls-key")
	}
	return c, nil
}

func newLogger(c *commonConfig, w io.Writer) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(c.logLevel)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", c.logLevel)
	}
	opts := &slog.HandlerOptions{Level: lvl}
	switch c.logFormat {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", c.logFormat)
}

func isLoopback(addr string) bool {
	if strings.HasPrefix(addr, "unix:") {
		return true // this host's processes only, as the socket file's permissions allow
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// serve runs the service until SIGTERM or SIGINT (or ctx ends).
func serve(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c, err := serveFlags(args, stderr)
	if err != nil {
		return command("serve", stderr, nil, err, nil)
	}
	return command("serve", stderr, &c.commonConfig, nil, func(log *slog.Logger) error { return runServe(ctx, c, log) })
}

// serverTimeouts are an http.Server's read timeouts.
type serverTimeouts struct{ readHeader, read, idle time.Duration }

// httpTimeouts bound how long serve's HTTP and admin listeners wait on a
// client, so that slow or idle clients ("slow loris": headers or a body
// trickled a byte at a time, keep-alive connections held open) cannot pin
// connections and goroutines indefinitely. Requests here are small JSON
// from proxies and operators on a fast network; the values leave a slow
// but honest client ample room. Both listeners use them. Tests lower them
// (timeouts_test.go); nothing else changes them.
var httpTimeouts = serverTimeouts{
	// readHeader (ReadHeaderTimeout): the request line and headers, a few
	// hundred bytes, arrive in well under a second; 10s is generous and
	// still frees a connection that trickles them.
	readHeader: 10 * time.Second,
	// read (ReadTimeout): the whole request, headers and body, from when
	// the server starts reading it. Bodies are at most a few kilobytes of
	// JSON; 30s allows a congested link, and it bounds a body sent slowly
	// (ReadHeaderTimeout ends when the headers do).
	read: 30 * time.Second,
	// idle (IdleTimeout): a keep-alive connection waiting for its next
	// request. Envoy and other callers reuse their connections, so 2m keeps
	// them warm between bursts, while a client that opens connections and
	// leaves them idle does not keep them forever (with no idle timeout
	// net/http would fall back to ReadTimeout).
	idle: 2 * time.Minute,
}

func runServe(ctx context.Context, c *serveConfig, log *slog.Logger) error {
	gcfloor.Set(gcfloor.Default) // unless GOGC is set
	if err := c.prepare(log); err != nil {
		return err
	}
	metrics := service.NewMetrics()
	loader := &ruleLoader{dir: c.rulesDir, log: log, metrics: metrics, files: map[string]*rules.Domain{},
		opts: rules.Options{CalendarMonth: c.calendarMonth}}
	cfg, err := loader.load()
	if err != nil {
		return err
	}
	tp, stopTracing, err := c.trace.provider(os.Stderr, log)
	if err != nil {
		return err
	}
	defer stopTracing() // after the drain: the last decisions' spans are written
	st, err := c.openStores(log, metrics)
	if err != nil {
		return err
	}
	svc := service.New(cfg, service.Options{Store: st.store, Overrides: st.overrides, OverrideTimeout: c.storeTimeout, AllowRequestLimits: c.allowRequestLimits,
		XRateLimitHeaders: c.xRateLimit, NoRateLimitHeaders: c.noRateLimit, ShadowMode: c.shadowMode, Metrics: metrics, Logger: log, TracerProvider: tp,
		Record: c.record.options(rules.Options{CalendarMonth: c.calendarMonth}), RecordDecisions: !c.noDashboard})
	loader.svc = svc
	dash := c.newDashboard(svc, st, loader)
	srv, err := c.newServers(svc, metrics, st.ready, dash, log)
	if err != nil {
		return err
	}
	c.capacity.dataDir = c.dataDir
	leases, err := c.capacity.start(srv.gs, metrics, srv.gl.Addr().String(), srv.tls, log)
	if err != nil { // nothing served yet: release the listeners and the stores
		srv.gl.Close()
		srv.hl.Close()
		srv.al.Close()
		st.close(log)
		return err
	}
	if leases != nil {
		loader.also = leases.reload
	}
	srv.start()
	stopSampling := sampleEverySecond(svc.Recorder())
	defer stopSampling()
	c.serveUntilStopped(ctx, log, loader, srv.errc, "floodgate serving")
	leases.close() // resigns first: clients move to the next master while this one drains
	srv.drain(c.drain)
	leases.saveHorizon() // nothing is granted after the drain
	st.close(log)
	log.Info("stopped")
	return nil
}

// serveStores are the store serve decides on and where its overrides live.
type serveStores struct {
	store     floodgate.Store
	overrides overrides.Store
	ready     service.Readiness
	closers   []func() error // in the order opened
}

// openStores opens --store and the overrides beside it: on Redis with it,
// in a Bolt file in the data directory with the memory store.
func (c *serveConfig) openStores(log *slog.Logger, metrics *service.Metrics) (*serveStores, error) {
	st, err := c.openStore("memstore.snapshot", log, metrics)
	if err != nil {
		return nil, err
	}
	s := &serveStores{store: st.store, ready: st.ready, closers: []func() error{st.close}}
	cache, err := c.openOverrides(st, "overrides.db")
	if err != nil {
		return nil, err
	}
	s.overrides, s.closers = cache, append(s.closers, cache.Close) // closes the store under it too
	return s, nil
}

// close closes the stores, the last opened first.
func (s *serveStores) close(log *slog.Logger) {
	for i := len(s.closers) - 1; i >= 0; i-- {
		if err := s.closers[i](); err != nil {
			log.Error("close", "err", err)
		}
	}
}

// serveServers are serve's three listeners and their servers: gRPC, HTTP
// (/json, health, metrics) and admin.
type serveServers struct {
	tls        *tls.Config // nil: plaintext
	gl, hl, al net.Listener
	gs         *grpc.Server
	health     *service.Health
	hs, as     *http.Server
	cutter     bodyCutter
	wg         sync.WaitGroup
	errc       chan error // a listener's failure
}

// newServers opens the listeners and builds the servers on them.
func (c *serveConfig) newServers(svc *service.Service, metrics *service.Metrics, ready service.Readiness, dash *dashboard.Dashboard, log *slog.Logger) (*serveServers, error) {
	tlsConf, err := serverTLS(c)
	if err != nil {
		return nil, err
	}
	s := &serveServers{tls: tlsConf, errc: make(chan error, 3)}
	if s.gl, err = listenLogged("grpc", c.grpcAddr, log); err != nil {
		return nil, err
	}
	if s.hl, err = listenLogged("http", c.httpAddr, log); err != nil {
		return nil, err
	}
	if s.al, err = listenLogged("admin", c.adminAddr, log); err != nil {
		return nil, err
	}
	gopts := service.GRPCOptions()
	if tlsConf != nil {
		gopts = append(gopts, grpc.Creds(credentials.NewTLS(tlsConf)))
	}
	s.gs = grpc.NewServer(gopts...)
	s.health = svc.RegisterGRPC(s.gs)
	// Bodies here are small JSON: a client that sends one slowly, or keeps
	// an idle connection, is not kept waiting for (see httpTimeouts), nor
	// waited for by SIGTERM's drain (the cutter ends its read).
	s.hs = s.httpServer(svc.HTTPHandler(metrics, ready))
	// The admin listener speaks TLS too when there is a certificate: beyond
	// loopback its bearer token would otherwise cross the network in the
	// clear.
	// The dashboard (dashboard.go) shares the listener, its token and TLS.
	admin := svc.AdminHandler(c.adminToken)
	if dash != nil {
		admin = dash.Mount(admin)
	}
	s.as = s.httpServer(admin)
	if dash != nil {
		s.as.RegisterOnShutdown(dash.Close) // ends the event streams: Shutdown waits for them
	}
	if tlsConf == nil && !isLoopback(c.adminAddr) {
		log.Warn("the admin API listens beyond loopback without TLS: its bearer token crosses the network in the clear; set --tls-cert and --tls-key", "addr", s.al.Addr().String())
	}
	return s, nil
}

// listenLogged listens on addr (listenAddr) and logs where.
func listenLogged(what, addr string, log *slog.Logger) (net.Listener, error) {
	l, err := listenAddr(addr)
	if err != nil {
		return nil, fmt.Errorf("%s listener %s: %w", what, addr, err)
	}
	shown := l.Addr().String()
	if l.Addr().Network() == "unix" {
		shown = "unix:" + shown
	}
	log.Info("listening", "api", what, "addr", shown)
	return l, nil
}

// httpServer serves h with httpTimeouts, behind the cutter, with its own
// copy of the TLS config (each server sets its NextProtos).
func (s *serveServers) httpServer(h http.Handler) *http.Server {
	to := httpTimeouts
	return &http.Server{Handler: s.cutter.wrap(h), TLSConfig: s.tls.Clone(),
		ReadHeaderTimeout: to.readHeader, ReadTimeout: to.read, IdleTimeout: to.idle}
}

// start serves each listener on its own goroutine; a failure goes to errc.
func (s *serveServers) start() {
	s.run(func() error { return s.gs.Serve(s.gl) })
	s.run(func() error { return s.serveHTTP(s.hs, s.hl) })
	s.run(func() error { return s.serveHTTP(s.as, s.al) })
}

func (s *serveServers) run(f func() error) {
	s.wg.Go(func() {
		if err := f(); err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, grpc.ErrServerStopped) {
			s.errc <- err
		}
	})
}

func (s *serveServers) serveHTTP(hs *http.Server, l net.Listener) error {
	if s.tls != nil {
		return hs.ServeTLS(l, "", "")
	}
	return hs.Serve(l)
}

// drain stops taking requests and finishes those in flight, up to timeout;
// gRPC and HTTP at once. Health says NOT_SERVING for every service and
// ends its Watch streams, which would hold GracefulStop.
func (s *serveServers) drain(timeout time.Duration) {
	s.health.Drain()
	dctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var drained sync.WaitGroup
	drained.Go(func() { service.Drain(dctx, s.gs.GracefulStop, s.gs.Stop) })
	s.cutter.cut()
	drained.Go(func() { s.hs.Shutdown(dctx) })
	drained.Go(func() { s.as.Shutdown(dctx) })
	drained.Wait()
	s.wg.Wait()
}

func redactStore(s string) string {
	if at := strings.LastIndex(s, "@"); at >= 0 {
		if i := strings.Index(s, "://"); i >= 0 && i < at {
			return s[:i+3] + "xxxxx" + s[at:]
		}
	}
	return s
}

func serverTLS(c *serveConfig) (*tls.Config, error) {
	if c.tlsCert == "" {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(c.tlsCert, c.tlsKey)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert/--tls-key: %w", err)
	}
	conf := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if c.tlsClientCA != "" {
		pem, err := os.ReadFile(c.tlsClientCA)
		if err != nil {
			return nil, fmt.Errorf("--tls-client-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--tls-client-ca %s: no certificates in it", c.tlsClientCA)
		}
		conf.ClientCAs, conf.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return conf, nil
}

// ruleLoader loads the rules directory and reloads it when its files
// change. A file that fails validation, or that declares a domain another
// file holds (see dedupe), is refused alone: the domain it held keeps its
// previous rules, and the other files load as usual.
type ruleLoader struct {
	dir     string
	log     *slog.Logger
	metrics *service.Metrics
	svc     *service.Service
	files   map[string]*rules.Domain // by path: the last good version
	sig     string
	opts    rules.Options
	skipped map[string]bool // the entries last reported as not loaded (rules.List)
	last    lastReload      // the last load's result, for the dashboard (dashboard.go)
	// onLoad, when set, takes each configuration read (the first one
	// included) before it counts as loaded; an error refuses it whole:
	// the previous files stay the loader's, and the reload counts as
	// refused.
	onLoad func(*rules.Config) error
	// also, when set, runs at each reload check before the rules' own (the
	// capacity leases' resources file: capacity.go), force as given.
	also func(force bool)
}

// signature describes the directory's rule files (rules.Files) by name
// and content (a SHA-256 of each), so that every change shows: an edit
// that keeps a file's size within one tick of the file system's clock,
// and a Kubernetes ConfigMap update, which swaps the directory a file's
// symbolic link points through and leaves the link itself as it was. A
// file rules.ReadFile refuses unread (a FIFO, a device, one too large) is
// described by the refusal, its size and its time. It returns the files'
// paths sorted by name. Rules files are small; reading them at every poll
// costs little. A directory that cannot be listed (deleted, renamed) is
// described by the error, returned too, so that the state is refused once
// until it changes. Entries skipped as no rules files are reported
// (noteSkipped) but are no part of the signature.
func (l *ruleLoader) signature() (string, []string, error) {
	paths, skipped, err := rules.List(l.dir)
	if err != nil {
		return "!" + err.Error(), nil, err
	}
	l.noteSkipped(skipped)
	var b strings.Builder
	for _, p := range paths {
		n := filepath.Base(p)
		data, err := rules.ReadFile(p)
		if err != nil {
			var size int64
			var mod time.Time
			if info, err := os.Stat(p); err == nil {
				size, mod = info.Size(), info.ModTime()
			}
			fmt.Fprintf(&b, "%s|refused %v|%d|%d\n", n, err, size, mod.UnixNano())
			continue
		}
		fmt.Fprintf(&b, "%s|%x\n", n, sha256.Sum256(data))
	}
	return b.String(), paths, nil
}

// load reads every file; at start, any refused file is an error.
func (l *ruleLoader) load() (*rules.Config, error) {
	cfg, refused, err := l.read()
	if err != nil {
		return nil, err
	}
	if refused > 0 {
		return nil, fmt.Errorf("rules in %s: %d file(s) refused (see above)", l.dir, refused)
	}
	return cfg, nil
}

// read parses every file and builds the configuration from those that are
// valid (and, for refused files, their previous versions), returning it
// with the number of files refused. It records the directory's signature
// whatever the outcome, so a refused state is read again only once the
// files change (or on a forced reload), not at every poll.
func (l *ruleLoader) read() (*rules.Config, int, error) {
	sig, paths, err := l.signature()
	if err != nil {
		l.sig = sig
		l.metrics.Reload(false, len(l.files))
		err = fmt.Errorf("--rules %s: %w", l.dir, err)
		l.last.record(err)
		return nil, 0, err
	}
	next := map[string]*rules.Domain{}
	refused := 0
	var firstErr error // the first file refused
	for _, p := range paths {
		data, err := rules.ReadFile(p)
		if err == nil {
			var d *rules.Domain
			if d, err = rules.ParseWith(p, data, l.opts); err == nil {
				next[p] = d
				continue
			}
		}
		refused++
		if firstErr == nil {
			firstErr = fmt.Errorf("%s: %w", p, err)
		}
		if prev := l.files[p]; prev != nil {
			next[p] = prev
			l.log.Error("rules file refused; its previous rules stay live", "file", p, "err", err)
		} else {
			l.log.Error("rules file refused", "file", p, "err", err)
		}
	}
	refused += l.dedupe(paths, next)
	domains := make([]*rules.Domain, 0, len(next))
	for _, p := range paths {
		if d := next[p]; d != nil {
			domains = append(domains, d)
		}
	}
	cfg, err := rules.NewConfig(domains...)
	if err == nil && l.onLoad != nil {
		err = l.onLoad(cfg) // refused here, nothing of it is kept
	}
	if err != nil {
		l.sig = sig
		l.metrics.Reload(false, len(l.files))
		err = fmt.Errorf("rules in %s: %w", l.dir, err)
		l.last.record(err)
		return nil, refused + 1, err
	}
	l.files, l.sig = next, sig
	l.metrics.Reload(refused == 0, len(domains))
	if refused > 0 && firstErr == nil {
		firstErr = fmt.Errorf("%d file(s) declare a domain another file holds (see the log)", refused)
	}
	l.last.record(firstErr)
	return cfg, refused, nil
}

// dedupe refuses each file in next whose domain another file already
// declares. A domain stays with the file that held it in the live rules,
// if that file still declares it; otherwise it goes to the first file by
// name. A refused file falls back to its previous version when that
// declares a domain still free, and is left out otherwise. So a new file
// (say an editor's copy that sorts first) never takes a live domain over.
// It returns the number of files refused.
func (l *ruleLoader) dedupe(paths []string, next map[string]*rules.Domain) int {
	owner := map[string]string{} // by domain: the file declaring it
	for _, p := range paths {
		if d, prev := next[p], l.files[p]; d != nil && prev != nil && d.Name == prev.Name {
			if _, taken := owner[d.Name]; !taken {
				owner[d.Name] = p
			}
		}
	}
	refused := 0
	for _, p := range paths {
		d := next[p]
		if d == nil {
			continue
		}
		first, taken := owner[d.Name]
		if !taken {
			owner[d.Name] = p
			continue
		}
		if first == p {
			continue
		}
		refused++
		err, name := rules.DuplicateDomain(p, d.Name, first), d.Name
		if d = l.files[p]; d == nil || owner[d.Name] != "" {
			l.log.Error("rules file refused", "file", p, "domain", name, "err", err)
			delete(next, p)
			continue
		}
		l.log.Error("rules file refused; its previous rules stay live", "file", p, "domain", name, "err", err)
		next[p] = d
		owner[d.Name] = p
	}
	return refused
}

// noteSkipped warns of the entries of the directory that are not loaded
// (rules.List: a subdirectory, rules.conf, a file without an extension),
// which envoyproxy/ratelimit would read: each once, when it appears,
// rather than at every poll. Hidden entries and editors' files are not
// listed, so they stay silent.
func (l *ruleLoader) noteSkipped(skipped []string) {
	now := make(map[string]bool, len(skipped))
	for _, p := range skipped {
		now[p] = true
		if !l.skipped[p] {
			l.log.Warn("rules directory entry not loaded: only the directory's own *.yaml and *.yml files are rules files (envoyproxy/ratelimit reads every file, subdirectories included)", "entry", p)
		}
	}
	l.skipped = now
}

// reload reads the directory again when its files have changed since the
// last read, or always when force is set (SIGHUP), and puts the result
// live.
func (l *ruleLoader) reload(force bool) {
	if l.also != nil {
		l.also(force)
	}
	if !force {
		if sig, _, _ := l.signature(); sig == l.sig {
			return
		}
	}
	cfg, refused, err := l.read()
	if err != nil {
		l.log.Error("rules reload refused; the previous rules stay live", "err", err)
		return
	}
	if l.svc != nil {
		l.svc.SetRules(cfg)
	}
	l.log.Info("rules reloaded", "dir", l.dir, "refused_files", refused)
}

// listenAddr listens on addr: HOST:PORT over TCP, or unix:PATH on a Unix
// domain socket (a sidecar's, as envoyproxy/ratelimit's GRPC_UDS). A socket
// file left by a process that has gone is replaced; one that a running
// process still serves is not.
func listenAddr(addr string) (net.Listener, error) {
	path, ok := strings.CutPrefix(addr, "unix:")
	if !ok {
		return net.Listen("tcp", addr)
	}
	if path == "" {
		return nil, errors.New("want unix:PATH")
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("%s exists and is not a socket", path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("%s is in use by a running process", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, err
		}
	}
	return net.Listen("unix", path)
}

// openOverrides opens where overrides live, behind a cache (which closes
// the store under it): with a Redis store, on that Redis, shared by every
// serve and proxy on it; else a Bolt file of the data directory.
func (c *commonConfig) openOverrides(st *openedStore, boltFile string) (*overrides.Cache, error) {
	var ovr overrides.Store
	if st.redis == nil {
		b, err := overrides.OpenBolt(filepath.Join(c.dataDir, boltFile))
		if err != nil {
			return nil, err
		}
		ovr = b
	} else {
		ovr = overrides.NewRedis(st.redis.Client(), "floodgate-overrides")
	}
	// Over Redis, other instances' changes arrive by pub/sub; the TTL is a
	// backstop. Bolt is written only through this cache: no TTL needed.
	ttl := time.Duration(0)
	if _, onRedis := ovr.(*overrides.Redis); onRedis {
		ttl = 30 * time.Second
	}
	return overrides.NewCache(ovr, 1<<16, ttl), nil
}

package service

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/pprof"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/propagation"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/decide"
	"github.com/floodgate/floodgate/overrides"
	"github.com/floodgate/floodgate/rules"
)

// maxBody caps request bodies of the HTTP APIs.
const maxBody = 1 << 20

// MaxConcurrentStreams bounds the calls in flight on one gRPC connection
// (SETTINGS_MAX_CONCURRENT_STREAMS). Each call is decided in well under a
// millisecond, or within --store-timeout: 1,024 at once on one connection
// is far more than a proxy's connection carries.
const MaxConcurrentStreams = 1024

// GRPCOptions are the gRPC server options the service runs with: a fixed
// pool of stream workers, whose stacks stay grown, where a goroutine per
// request would copy its stack as each decision deepens it (14% of the
// server's CPU in profiles without the pool). The pool is as large as the
// requests a server of this size has in flight (64 callers in the
// benchmarks, each waiting on Redis there): grpc-go starts a goroutine for
// a request that finds every worker busy, and with 4 workers per core most
// requests did.
//
// Requests are decoded by lenientCodec: a string that is not valid UTF-8
// (a client's header, copied by Envoy) is escaped instead of failing the
// call.
//
// Keepalive pings are accepted every second, with or without calls in
// flight: grpc-go's default (one in five minutes) answers a client that
// pings more often with GOAWAY too_many_pings, and Envoy's
// connection_keepalive and grpc-go clients with keepalive set ping every
// few seconds to tens of seconds on idle connections, as they should.
//
// A connection carries at most MaxConcurrentStreams calls at once
// (grpc-go's default is unlimited): a stream that sent its headers and not
// its message holds a goroutine until its client hangs up, and one
// connection opening 100,000 such streams held 100,000 goroutines and a
// gigabyte. Clients queue their calls beyond it (grpc-go) or open another
// connection (Envoy), as HTTP/2 has them do.
func GRPCOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxConcurrentStreams(MaxConcurrentStreams),
		grpc.NumStreamWorkers(uint32(max(64, 16*runtime.GOMAXPROCS(0)))),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: time.Second, PermitWithoutStream: true}),
		grpc.ForceServerCodecV2(newLenientCodec()),
	}
}

// RegisterGRPC registers the rate-limit service, the gRPC health service
// (SERVING for "", envoy.service.ratelimit.v3.RateLimitService and
// "ratelimit", envoyproxy/ratelimit's name) and reflection on g. It returns
// the health service, whose Drain a shutdown calls first.
func (s *Service) RegisterGRPC(g *grpc.Server) *Health {
	rlsv3.RegisterRateLimitServiceServer(g, s)
	h := &Health{Server: health.NewServer(), drained: make(chan struct{})}
	h.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	h.SetServingStatus(rlsv3.RateLimitService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	h.SetServingStatus("ratelimit", healthpb.HealthCheckResponse_SERVING) // envoyproxy/ratelimit's name for itself
	healthpb.RegisterHealthServer(g, h)
	reflection.Register(g)
	return h
}

// Health is grpc-go's health service, made to let a drain finish: Drain
// marks every service NOT_SERVING and then ends the Watch streams (a
// watcher is told NOT_SERVING first). A Watch stream otherwise lasts as
// long as its client keeps it, and grpc.Server.GracefulStop waits for
// every stream: one load balancer's watch held SIGTERM's drain to its
// timeout, and the calls still in flight then were cut.
type Health struct {
	*health.Server
	drained chan struct{}
	once    sync.Once
}

// Drain marks every service NOT_SERVING, for good, and ends the Watch
// streams.
func (h *Health) Drain() {
	h.once.Do(func() {
		h.Shutdown()
		close(h.drained)
	})
}

// Watch is health.Server's, ending when Drain is called.
func (h *Health) Watch(req *healthpb.HealthCheckRequest, stream healthpb.Health_WatchServer) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	go func() {
		select {
		case <-h.drained:
			time.Sleep(drainNotice) // let the NOT_SERVING update reach the watcher
			cancel()
		case <-ctx.Done():
		}
	}()
	err := h.Server.Watch(req, watchStream{stream, ctx})
	select {
	case <-h.drained:
		return nil // ended by the drain, not by an error
	default:
		return err
	}
}

// drainNotice is how long a drain leaves the Watch streams to send their
// NOT_SERVING update before it ends them.
const drainNotice = 50 * time.Millisecond

// watchStream is a Watch stream under another context.
type watchStream struct {
	healthpb.Health_WatchServer
	ctx context.Context
}

func (w watchStream) Context() context.Context { return w.ctx }

// Readiness says whether the service can decide with its store, and why
// not (or why degraded).
type Readiness func() (ready bool, why string)

// HTTPHandler serves POST /json (Envoy's request and response as JSON: 200
// when OK, 429 when over the limit, as envoyproxy/ratelimit does),
// GET /healthz, GET /readyz and GET /metrics.
func (s *Service) HTTPHandler(m *Metrics, ready Readiness) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/json", s.serveJSON) // any method, as envoyproxy/ratelimit takes it
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "OK\n") })
	// envoyproxy/ratelimit's liveness path, for probes written for it: any
	// method, and its body
	mux.HandleFunc("/healthcheck", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "OK") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ok, why := true, "ready"
		if ready != nil {
			ok, why = ready()
		}
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		io.WriteString(w, why+"\n")
	})
	if m != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{}))
	}
	return mux
}

func (s *Service) serveJSON(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		bodyError(w, "request body", err)
		return
	}
	if len(bytes.TrimSpace(body)) == 0 {
		httpError(w, http.StatusBadRequest, `request: the body is empty; want a RateLimitRequest as JSON: {"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}`)
		return
	}
	if !utf8.Valid(body) {
		// A client's header copied byte for byte into a value: escaped
		// as the gRPC codec escapes it (lenientCodec), so both APIs
		// decide it, under the same key, rather than fail the request.
		body = escapeInvalidJSON(body)
	}
	var req rlsv3.RateLimitRequest
	err = protojson.Unmarshal(body, &req)
	if err != nil {
		// A string with a lone UTF-16 surrogate escape ("\ud800", which
		// JavaScript's JSON.stringify writes for a broken string):
		// protojson refuses it; read it as encoding/json does, and as a
		// gRPC client's UTF-8 encoder sends it, with U+FFFD in its place.
		if fixed, ok := replaceLoneSurrogates(body); ok {
			req.Reset()
			err = protojson.Unmarshal(fixed, &req)
		}
	}
	if err != nil {
		httpError(w, http.StatusBadRequest, "request: %v", err)
		return
	}
	var resp *rlsv3.RateLimitResponse
	if s.tracer != nil {
		resp, err = s.decideTraced(r.Context(), &req, propagation.HeaderCarrier(r.Header))
	} else {
		resp, err = s.decideObserved(r.Context(), &req)
	}
	if err != nil {
		code := http.StatusServiceUnavailable
		if errors.Is(err, errBadRequest) {
			code = http.StatusBadRequest
		}
		httpError(w, code, "%v", err)
		return
	}
	out, err := protojson.Marshal(resp)
	if err != nil {
		httpError(w, http.StatusInternalServerError, "response: %v", err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	for _, h := range resp.ResponseHeadersToAdd {
		w.Header().Set(h.Key, h.Value)
	}
	if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
		w.WriteHeader(http.StatusTooManyRequests)
	}
	w.Write(out)
}

// replaceLoneSurrogates returns the JSON text b with each \uXXXX escape of
// a UTF-16 surrogate that is not half of a pair written \ufffd, and
// whether it changed anything. Only escapes inside strings are read; b's
// other bytes are kept as they are.
func replaceLoneSurrogates(b []byte) ([]byte, bool) {
	hexAt := func(i int) (rune, bool) {
		if i+6 > len(b) || b[i] != '\\' || b[i+1] != 'u' {
			return 0, false
		}
		v, err := strconv.ParseUint(string(b[i+2:i+6]), 16, 16)
		return rune(v), err == nil
	}
	var out []byte
	changed, inString := false, false
	for i := 0; i < len(b); i++ {
		c := b[i]
		switch {
		case !inString:
			inString = c == '"'
		case c == '"':
			inString = false
		case c == '\\' && i+1 < len(b) && b[i+1] != 'u':
			out = append(out, c) // a two-byte escape: keep both
			i++
			c = b[i]
		case c == '\\':
			r, ok := hexAt(i)
			if !ok || r < 0xD800 || r > 0xDFFF {
				break
			}
			if r < 0xDC00 { // a high surrogate: keep it and its low half
				if lo, ok := hexAt(i + 6); ok && lo >= 0xDC00 && lo <= 0xDFFF {
					out = append(out, b[i:i+12]...)
					i += 11
					continue
				}
			}
			out = append(out, `\ufffd`...)
			i += 5
			changed = true
			continue
		}
		out = append(out, c)
	}
	return out, changed
}

// bodyError answers a request whose body could not be read: 413 when it
// is over maxBody, else 400 (cut short, or too slow).
func bodyError(w http.ResponseWriter, what string, err error) {
	code := http.StatusBadRequest
	if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
		code = http.StatusRequestEntityTooLarge
	}
	httpError(w, code, "%s: %v", what, err)
}

func httpError(w http.ResponseWriter, code int, format string, args ...any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(map[string]string{"error": fmt.Sprintf(format, args...)})
}

// AdminHandler serves the admin API: the overrides, resetting and
// inspecting a key, and the live rules. With a non-empty token every
// request must carry "Authorization: Bearer <token>", and a client
// network's failures are throttled (see RequireToken).
//
//	GET    /v1/rules
//	GET    /v1/overrides/{domain}?after=KEY&limit=N[&prefix=P][&q=S]  (filtered: overridesearch.go)
//	GET    /v1/overrides/{domain}/{key...}
//	PUT    /v1/overrides/{domain}/{key...}   {"limit":5,"period":"1s","burst":0,"algorithm":"","note":""}
//	DELETE /v1/overrides/{domain}/{key...}
//	PUT    /v1/overrides[?dry_run=true]      {"overrides":[{"domain":"d","key":"k","limit":5,"period":"1s"}]}: all or nothing
//	POST   /v1/keys/reset    {"domain":"d","entries":[{"key":"user","value":"241531"}]}
//	POST   /v1/keys/inspect  (the same body): the key's state, consuming nothing
//	GET    /v1/top?domain=D&rule=R&n=N  the keys most often over each rule's limit
//	POST   /v1/whatif?minutes=M  a rules file: its decisions over the recorded requests, and the live rules' (whatif.go)
//	GET    /debug/pprof/...  Go's profiles of the running service
func (s *Service) AdminHandler(token string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/rules", func(w http.ResponseWriter, r *http.Request) {
		cfg := s.rules.Load()
		if cfg == nil {
			httpError(w, http.StatusServiceUnavailable, "no rules loaded")
			return
		}
		b, err := cfg.JSON()
		if err != nil {
			httpError(w, http.StatusInternalServerError, "%v", err)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(b)
	})
	mux.HandleFunc("PUT /v1/overrides", s.adminBulkPut) // bulk.go
	mux.HandleFunc("GET /v1/overrides/{domain}", s.adminList)
	mux.HandleFunc("GET /v1/overrides/{domain}/{key...}", s.adminGet)
	mux.HandleFunc("PUT /v1/overrides/{domain}/{key...}", s.adminPut)
	mux.HandleFunc("DELETE /v1/overrides/{domain}/{key...}", s.adminDelete)
	mux.HandleFunc("POST /v1/keys/reset", func(w http.ResponseWriter, r *http.Request) { s.adminKey(w, r, floodgate.OpReset) })
	mux.HandleFunc("POST /v1/keys/inspect", func(w http.ResponseWriter, r *http.Request) { s.adminKey(w, r, floodgate.OpPeek) })
	mux.HandleFunc("GET /v1/top", s.adminTop)
	mux.HandleFunc("POST /v1/whatif", s.adminWhatIf)
	// Profiles of the running service (go tool pprof http://ADMIN/debug/pprof/profile).
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/cmdline", cmdline)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	return s.RequireToken(token, adminDeadline(mux, s.adminTimeout()))
}

// cmdline is pprof.Cmdline with the secrets of the command line left out:
// the values of flags named for a token, password or secret, and a URL's
// user information (a Redis password in --store). The admin token lets a
// caller change limits, not read the store's credentials.
func cmdline(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	io.WriteString(w, strings.Join(redactArgs(os.Args), "\x00"))
}

// redactArgs returns args with secrets replaced by "xxxxx" (see cmdline).
func redactArgs(args []string) []string {
	out := make([]string, len(args))
	secretNext := false
	for i, a := range args {
		switch {
		case secretNext:
			a, secretNext = "xxxxx", false
		case strings.HasPrefix(a, "-") && a != "-" && a != "--":
			name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
			if secretFlag(name) {
				if hasValue {
					a = a[:strings.Index(a, "=")+1] + "xxxxx"
				} else {
					secretNext = true
				}
			}
		}
		out[i] = redactURLs(a)
	}
	return out
}

func secretFlag(name string) bool {
	name = strings.ToLower(name)
	return strings.Contains(name, "token") || strings.Contains(name, "password") || strings.Contains(name, "secret")
}

// redactURLs replaces the user information of each URL in s (several
// hosts may be listed: redis-sentinel://u:p@h:1,h:2/m) with xxxxx.
func redactURLs(s string) string {
	i := strings.Index(s, "://")
	if i < 0 {
		return s
	}
	rest := s[i+3:]
	end := strings.IndexAny(rest, "/?#")
	if end < 0 {
		end = len(rest)
	}
	at := strings.LastIndex(rest[:end], "@")
	if at < 0 {
		return s[:i+3] + redactURLs(rest)
	}
	return s[:i+3] + "xxxxx" + redactURLs(rest[at:])
}

// DefaultAdminTimeout is Options.AdminTimeout's default.
const DefaultAdminTimeout = 5 * time.Second

// adminTimeout returns Options.AdminTimeout, or its default.
func (s *Service) adminTimeout() time.Duration {
	if s.opts.AdminTimeout > 0 {
		return s.opts.AdminTimeout
	}
	return DefaultAdminTimeout
}

// adminDeadline gives every admin call but the profiles (which run as long
// as asked) a deadline of d.
func adminDeadline(h http.Handler, d time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/debug/pprof/") {
			h.ServeHTTP(w, r)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), d)
		defer cancel()
		h.ServeHTTP(w, r.WithContext(ctx))
	})
}

// storeError answers an admin call whose store call failed: 503 when the
// store did not answer in time or is unavailable, else 500.
func (s *Service) storeError(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		httpError(w, http.StatusServiceUnavailable, "the store did not answer within %s: %v", s.adminTimeout(), err)
		return
	}
	httpError(w, http.StatusInternalServerError, "%v", err)
}

func (s *Service) overridesOr503(w http.ResponseWriter) overrides.Store {
	if s.opts.Overrides == nil {
		httpError(w, http.StatusServiceUnavailable, "no overrides store configured")
	}
	return s.opts.Overrides
}

func (s *Service) adminList(w http.ResponseWriter, r *http.Request) {
	st := s.overridesOr503(w)
	if st == nil {
		return
	}
	limit := 100
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > overrides.MaxListLimit {
			httpError(w, http.StatusBadRequest, "limit: want 1 to %d overrides a page, got %q", overrides.MaxListLimit, v)
			return
		}
		limit = n
	}
	if f, ok, err := readOverrideFilter(r); err != nil {
		httpError(w, http.StatusBadRequest, "%v", err)
		return
	} else if ok { // a filtered page: an object, since a short page need not be the last
		res, err := f.search(r.Context(), st, r.PathValue("domain"), r.URL.Query().Get("after"), limit)
		if err != nil {
			s.storeError(w, r, err)
			return
		}
		writeJSON(w, res)
		return
	}
	list, err := st.List(r.Context(), r.PathValue("domain"), r.URL.Query().Get("after"), limit)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	if list == nil {
		list = []overrides.Override{} // [], not null
	}
	writeJSON(w, list)
}

func (s *Service) adminGet(w http.ResponseWriter, r *http.Request) {
	st := s.overridesOr503(w)
	if st == nil {
		return
	}
	o, ok, err := st.Get(r.Context(), r.PathValue("domain"), decide.BoundKey(r.PathValue("key")))
	switch {
	case err != nil:
		s.storeError(w, r, err)
	case !ok:
		httpError(w, http.StatusNotFound, "no override for %q in domain %q", r.PathValue("key"), r.PathValue("domain"))
	default:
		writeJSON(w, o)
	}
}

func (s *Service) adminPut(w http.ResponseWriter, r *http.Request) {
	st := s.overridesOr503(w)
	if st == nil {
		return
	}
	o, err := overrides.DecodeJSON(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		bodyError(w, "override", err)
		return
	}
	// a key over MaxKeyBytes is stored as decisions look it up
	o.Domain, o.Key, o.Updated = r.PathValue("domain"), decide.BoundKey(r.PathValue("key")), time.Now().UTC()
	if err := o.Validate(); err != nil { // a FieldError names the override itself
		httpError(w, http.StatusBadRequest, "%v", err)
		return
	}
	if err := s.checkOverride(o, r.PathValue("key")); err != nil {
		httpError(w, http.StatusBadRequest, "override: %v", err)
		return
	}
	// one change at a time: two at once would both carry the count from
	// the same policy, and the second move would overwrite the first
	s.adminMu.Lock()
	defer s.adminMu.Unlock()
	before, had, err := st.Get(r.Context(), o.Domain, o.Key)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	if err := st.Put(r.Context(), o); err != nil {
		s.storeError(w, r, err)
		return
	}
	var from *overrides.Override
	if had {
		from = &before
	}
	s.carry(r.Context(), o.Domain, r.PathValue("key"), from, &o)
	writeJSON(w, o)
}

func (s *Service) adminDelete(w http.ResponseWriter, r *http.Request) {
	st := s.overridesOr503(w)
	if st == nil {
		return
	}
	domain, key := r.PathValue("domain"), decide.BoundKey(r.PathValue("key"))
	s.adminMu.Lock() // as adminPut
	defer s.adminMu.Unlock()
	before, had, err := st.Get(r.Context(), domain, key)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	ok, err := st.Delete(r.Context(), domain, key)
	switch {
	case err != nil:
		s.storeError(w, r, err)
	case !ok:
		httpError(w, http.StatusNotFound, "no override for %q in domain %q", r.PathValue("key"), domain)
	default:
		if had {
			s.carry(r.Context(), domain, r.PathValue("key"), &before, nil)
		}
		w.WriteHeader(http.StatusNoContent)
	}
}

// carry moves what a key has used from the policy that decided it before an
// override change (from: its old override, nil for the rule's own numbers)
// to the one deciding it now (to, likewise), on a store that can
// (floodgate.Mover): raising a key's daily limit from 1,000 to 2,000 after
// 1,500 requests leaves it 500, not a fresh 2,000, and a lower one does not
// hand out a fresh quota either. Each rule keeps its count by name, the
// overridden one converted to its new numbers. A key that matches no limit
// of the live rules has nothing to carry. A failed move is logged: the
// change stands, and the key's count starts afresh.
func (s *Service) carry(ctx context.Context, domain, rawKey string, from, to *overrides.Override) {
	mv, ok := s.opts.Store.(floodgate.Mover)
	cfg := s.rules.Load()
	if !ok || cfg == nil {
		return
	}
	entries, ok := rules.ParseKey(rawKey)
	if !ok {
		return
	}
	m := cfg.Match(domain, entries)
	key := decide.BoundKey(rawKey)
	if m == nil || m.Limit.Policy == nil || decide.BoundKey(m.Key) != key {
		return
	}
	policy := func(o *overrides.Override) *floodgate.Policy {
		if o != nil {
			if p, err := s.dec.OverridePolicy(domain, m.Limit, numbers(*o)); err == nil {
				return p
			}
		}
		return m.Limit.Policy
	}
	fp, tp := policy(from), policy(to)
	if fp == tp {
		return
	}
	if err := mv.Move(ctx, s.opts.Clock.NowMicro(), fp, tp, decide.StoreKey(domain, key)); err != nil {
		s.opts.Logger.Warn("overrides: could not carry a key's count to its new limit; it starts afresh", "domain", domain, "key", key, "err", err)
	}
}

// checkOverride refuses an override that could never apply to the limit
// its key belongs to in the live rules (a burst on a fixed window, say),
// which decisions would otherwise skip with no more than a log line. A key
// that matches no limit now is taken: rules change.
func (s *Service) checkOverride(o overrides.Override, key string) error {
	cfg := s.rules.Load()
	entries, ok := rules.ParseKey(key)
	if cfg == nil || !ok {
		return nil
	}
	m := cfg.Match(o.Domain, entries)
	if m == nil || decide.BoundKey(m.Key) != o.Key {
		return nil
	}
	if _, err := s.dec.OverridePolicy(o.Domain, m.Limit, numbers(o)); err != nil {
		return fmt.Errorf("cannot apply to the limit %q that key %q matches: %w", m.Limit.Name, key, err)
	}
	return nil
}

type keyRequest struct {
	Domain  string        `json:"domain"`
	Entries []rules.Entry `json:"entries"`
}

// readKeyRequest reads an admin key call's body: one JSON object, no
// unknown field. It answers a bad one itself (ok false).
func readKeyRequest(w http.ResponseWriter, r *http.Request) (kr keyRequest, ok bool) {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&kr); err != nil {
		bodyError(w, "body", err)
		return kr, false
	}
	// anything after the object would be a second key, silently not reset
	if _, err := dec.Token(); err != io.EOF {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			bodyError(w, "body", err)
			return kr, false
		}
		httpError(w, http.StatusBadRequest, "body: more after the JSON object; one key a request")
		return kr, false
	}
	return kr, true
}

func (s *Service) adminKey(w http.ResponseWriter, r *http.Request, kind floodgate.OpKind) {
	kr, ok := readKeyRequest(w, r)
	if !ok {
		return
	}
	cfg := s.rules.Load()
	if cfg == nil || kr.Domain == "" || len(kr.Entries) == 0 {
		httpError(w, http.StatusBadRequest, "want a domain and entries")
		return
	}
	// the bounds ShouldRateLimit holds a descriptor to: one beyond them
	// is a mistake in the call, not a key no limit applies to (404)
	if len(kr.Entries) > MaxEntries {
		httpError(w, http.StatusBadRequest, "%d entries; at most %d", len(kr.Entries), MaxEntries)
		return
	}
	for i, e := range kr.Entries {
		switch {
		case e.Key == "":
			httpError(w, http.StatusBadRequest, "entries[%d].key is empty", i)
			return
		case len(e.Key) > MaxEntryBytes:
			httpError(w, http.StatusBadRequest, "entries[%d].key is longer than %d bytes", i, MaxEntryBytes)
			return
		}
	}
	m := cfg.Match(kr.Domain, kr.Entries)
	if m == nil || m.Limit.Policy == nil {
		httpError(w, http.StatusNotFound, "no limit applies to that descriptor")
		return
	}
	key := decide.BoundKey(m.Key) // as decisions store it
	if m.Limit.Blocked {          // requests_per_unit 0: nothing is counted, everything refused
		writeJSON(w, map[string]any{"limit": m.Limit.Name, "key": key, "allowed": false, "remaining": 0, "blocked": true})
		return
	}
	// the key's override, if it has one, holds its state: inspect or reset that
	p := s.dec.KeyPolicy(r.Context(), kr.Domain, m.Limit, key)
	// inspect peeks at a request of cost 1, the next one: a peek of cost
	// 0 fits even a spent key, and would say allowed, retry after 0
	op := floodgate.Op{Policy: p, Key: decide.StoreKey(kr.Domain, key), Kind: kind}
	if kind == floodgate.OpPeek {
		op.Cost = 1
	}
	d, err := s.opts.Store.Do(r.Context(), s.opts.Clock.NowMicro(), op)
	if err != nil {
		httpError(w, http.StatusServiceUnavailable, "%v", err)
		return
	}
	if d.Degraded { // the store did not answer: its failure mode's made-up answer says nothing of the key
		what := "inspected"
		if kind == floodgate.OpReset {
			what = "reset"
		}
		httpError(w, http.StatusServiceUnavailable, "the store is unavailable: key %q of limit %q was not %s", key, m.Limit.Name, what)
		return
	}
	writeJSON(w, map[string]any{
		"limit": m.Limit.Name, "key": key, "allowed": d.Allowed, "remaining": d.Remaining,
		"reset_after": d.ResetAfter.String(), "retry_after": d.RetryAfter.String(), "rule": d.Rule, "degraded": d.Degraded,
		"override": p != m.Limit.Policy,
	})
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

// Drain waits for in-flight work, up to ctx.
func Drain(ctx context.Context, stop func(), force func()) {
	done := make(chan struct{})
	go func() { stop(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		force()
	}
}

// numbers is o's numbers, as the decider applies them.
func numbers(o overrides.Override) rules.Override {
	return rules.Override{Limit: o.Limit, Period: o.Period, Burst: o.Burst, Algorithm: o.Algorithm}
}

// Package service is Floodgate's rate-limit service: Envoy's
// envoy.service.ratelimit.v3 API over gRPC and HTTP/JSON, on the engine and
// any store, with rules from package rules and per-key overrides from
// package overrides.
package service

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/internal/decide"
	"github.com/floodgate/floodgate/internal/decisiontrace"
	"github.com/floodgate/floodgate/internal/recorder"
	"github.com/floodgate/floodgate/internal/topk"
	"github.com/floodgate/floodgate/overrides"
	"github.com/floodgate/floodgate/rules"
)

// Bounds on one request, so hostile input costs little (the decider's:
// every front door has the same).
const (
	MaxDescriptors = decide.MaxDescriptors // descriptors in one request
	MaxEntries     = decide.MaxEntries     // entries in one descriptor
	MaxEntryBytes  = decide.MaxEntryBytes  // bytes in one entry's key (a value may be longer: see MaxKeyBytes)
	MaxKeyBytes    = decide.MaxKeyBytes    // bytes of a descriptor's store key (after its domain): a longer one is kept as its start and a digest
	MaxHits        = decide.MaxHits        // hits_addend counted: a larger one counts as this, more than any rule holds (refused, nothing consumed)
	maxPolicies    = 16 << 10              // response header descriptions cached
)

// Options configure a Service.
type Options struct {
	Store floodgate.Store // keeps the limits' state (required)
	Clock floodgate.Clock // default clock.Coarse
	// Overrides holds per-key overrides (may be nil). A lookup gives up
	// after OverrideTimeout (default 50ms) and the rule decides.
	Overrides       overrides.Store
	OverrideTimeout time.Duration // bounds an override lookup (default 50ms)
	// ShadowMode puts every limit in shadow mode, as shadow_mode: true on
	// each would (envoyproxy/ratelimit's SHADOW_MODE): decisions are made,
	// counted and reported in metrics, and no request is refused.
	ShadowMode bool
	// AllowRequestLimits honours a descriptor's own `limit` field. Off by
	// default: it lets a caller choose its own limit.
	AllowRequestLimits bool
	// XRateLimitHeaders adds X-RateLimit-Limit, -Remaining and -Reset.
	XRateLimitHeaders bool
	// NoRateLimitHeaders leaves out RateLimit-Policy, RateLimit and
	// Retry-After (envoyproxy/ratelimit sends none: they name the rules
	// to the clients).
	NoRateLimitHeaders bool
	Metrics            *Metrics // may be nil
	// AdminTimeout bounds an admin call's work on the stores (the
	// overrides store, the rate-limit store): when one does not answer in
	// time the call gets 503 instead of waiting as long as its client does
	// (default DefaultAdminTimeout).
	AdminTimeout time.Duration
	// Logger receives warnings, such as failed override lookups (default
	// slog.Default()).
	Logger *slog.Logger
	// TracerProvider, when set, traces each ShouldRateLimit (gRPC or
	// /json) in a span of kind server, "floodgate.ShouldRateLimit",
	// continuing the caller's trace (W3C traceparent in the gRPC metadata
	// or the HTTP headers): its domain, rules, key hashes (never a key),
	// outcome and store latency (docs/SERVICE.md "Traces"). nil: off, at no
	// cost.
	TracerProvider trace.TracerProvider
	// Record keeps the requests of the last minutes for POST /v1/whatif
	// (the zero value records nothing).
	Record RecordOptions
	// RecordDecisions keeps the recent history of decisions per rule and
	// second for floodgate's dashboard (Service.Recorder): an atomic add
	// per decision.
	RecordDecisions bool
}

// Service answers ShouldRateLimit. It is safe for concurrent use.
type Service struct {
	rlsv3.UnimplementedRateLimitServiceServer
	opts  Options
	rules atomic.Pointer[rules.Config]
	dec   *decide.Decider

	policyHeaders     sync.Map // policyHeaderKey → *policyHeader
	policyHeaderCount atomic.Int64

	adminMu sync.Mutex // serializes override changes: each carries the count from the one before

	guardMu sync.Mutex
	guards  map[string]*tokenGuard // RequireToken's, by token: one throttle for every handler a token guards

	lastLog atomic.Int64
	tracer  *decisiontrace.Tracer // nil: off

	reqLog  *requestLog        // the requests recorded for what-ifs; nil: recording off
	whatIf  chan struct{}      // one what-if at a time
	limited *topk.Rules        // the top limited keys per rule (GET /v1/top)
	rec     *recorder.Recorder // nil unless Options.RecordDecisions
	own     sync.Map           // domain → *recorder.Counters: requests' own limits
}

// New returns a service deciding with cfg's rules.
func New(cfg *rules.Config, opts Options) *Service {
	if opts.Clock == nil {
		opts.Clock = clock.Coarse
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.OverrideTimeout <= 0 {
		opts.OverrideTimeout = 50 * time.Millisecond
	}
	s := &Service{opts: opts, dec: decide.New(decide.Options{
		Overrides:          overrides.Lookup(opts.Overrides),
		OverrideTimeout:    opts.OverrideTimeout,
		ShadowMode:         opts.ShadowMode,
		AllowRequestLimits: opts.AllowRequestLimits,
		Logger:             opts.Logger,
	})}
	s.tracer = decisiontrace.New(opts.TracerProvider, "floodgate.ShouldRateLimit", trace.SpanKindServer)
	s.reqLog, s.whatIf = newRequestLog(opts.Record), make(chan struct{}, 1)
	s.limited = newLimited()
	if opts.RecordDecisions {
		s.rec = recorder.New()
	}
	s.rules.Store(cfg)
	return s
}

// Recorder returns the history of decisions kept for the dashboard, nil
// unless Options.RecordDecisions. Its owner samples it every second
// (recorder.Recorder.Sample).
func (s *Service) Recorder() *recorder.Recorder { return s.rec }

// SetRules swaps the live rules (a reload); the top limited keys of rules
// no longer live are dropped.
func (s *Service) SetRules(cfg *rules.Config) {
	s.rules.Store(cfg)
	pruneLimited(s.limited, cfg)
}

// Rules returns the live rules.
func (s *Service) Rules() *rules.Config { return s.rules.Load() }

// Store returns the service's store.
func (s *Service) Store() floodgate.Store { return s.opts.Store }

// errBadRequest marks an invalid request.
var errBadRequest = decide.ErrBadRequest

// ShouldRateLimit implements the gRPC API.
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	var resp *rlsv3.RateLimitResponse
	var err error
	if s.tracer != nil {
		md, _ := metadata.FromIncomingContext(ctx)
		resp, err = s.decideTraced(ctx, req, decisiontrace.MDCarrier(md))
	} else {
		resp, err = s.decideObserved(ctx, req)
	}
	switch {
	case errors.Is(err, errBadRequest):
		return nil, status.Error(codes.InvalidArgument, err.Error())
	case err != nil:
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	return resp, nil
}

// decideObserved is Decide, measured.
func (s *Service) decideObserved(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	start := time.Now()
	resp, err := s.Decide(ctx, req)
	if s.rec == nil && s.opts.Metrics == nil {
		return resp, err
	}
	took := time.Since(start)
	if s.rec != nil && err == nil {
		s.rec.ObserveLatency(took)
	}
	if s.opts.Metrics != nil {
		domain := req.GetDomain()
		if cfg := s.rules.Load(); cfg == nil || cfg.Domain(domain) == nil {
			domain = "_unknown" // callers choose domains: no series per garbage
		}
		s.opts.Metrics.observeRequest(domain, resp, err, took)
	}
	return resp, err
}

// Decide answers a request; errors wrapping errBadRequest are the caller's.
func (s *Service) Decide(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if err := decide.CheckRequest(req.GetDomain(), len(req.GetDescriptors())); err != nil {
		return nil, err
	}
	cfg := s.rules.Load()
	if s.reqLog != nil {
		s.record(cfg, req)
	}
	n := len(req.Descriptors)
	// Most requests carry a descriptor or two: keep them off the heap.
	// (The entries stay there only if no descriptor is stored anywhere
	// else, so the many get code of their own.)
	var descBuf [4]decide.Descriptor
	var resBuf [4]decide.Result
	var entryBuf [8]rules.Entry
	if n > len(descBuf) {
		return s.decideMany(ctx, cfg, req)
	}
	entries := entryBuf[:0]
	for i, d := range req.Descriptors {
		start := len(entries)
		entries = appendEntries(entries, d)
		descBuf[i] = s.descriptor(cfg, req, d, entries[start:len(entries):len(entries)]) // (into a slice, it would move them to the heap)
	}
	return s.decide(ctx, cfg, req, descBuf[:n], resBuf[:n])
}

// decideMany is Decide for a request of many descriptors.
func (s *Service) decideMany(ctx context.Context, cfg *rules.Config, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	descs := make([]decide.Descriptor, len(req.Descriptors))
	var entries []rules.Entry
	for i, d := range req.Descriptors {
		start := len(entries)
		entries = appendEntries(entries, d)
		descs[i] = s.descriptor(cfg, req, d, entries[start:len(entries):len(entries)])
	}
	return s.decide(ctx, cfg, req, descs, make([]decide.Result, len(descs)))
}

// decide decides descs (req's) into res, and answers.
func (s *Service) decide(ctx context.Context, cfg *rules.Config, req *rlsv3.RateLimitRequest, descs []decide.Descriptor, res []decide.Result) (*rlsv3.RateLimitResponse, error) {
	if s.tracer != nil {
		return s.decideSpan(ctx, cfg, req, descs, res)
	}
	if err := s.dec.Decide(ctx, s.opts.Store, s.opts.Clock, cfg, req.Domain, descs, res); err != nil {
		return nil, err
	}
	return s.respond(req, res), nil
}

// appendEntries appends d's entries.
func appendEntries(entries []rules.Entry, d *rlcommon.RateLimitDescriptor) []rules.Entry {
	for _, e := range d.GetEntries() {
		// A value of any length is limited (it comes from the client,
		// say a header: refusing the request would let it through where
		// Envoy fails open); the decider keeps its store key short.
		entries = append(entries, rules.Entry{Key: e.GetKey(), Value: e.GetValue()})
	}
	return entries
}

// descriptor is d (of req) as the decider takes it, its entries es.
func (s *Service) descriptor(cfg *rules.Config, req *rlsv3.RateLimitRequest, d *rlcommon.RateLimitDescriptor, es []rules.Entry) decide.Descriptor {
	desc := decide.Descriptor{Entries: es, Hits: int64(req.HitsAddend), Refund: d.GetIsNegativeHits()}
	if desc.Hits == 0 {
		desc.Hits = 1
	}
	if d.GetHitsAddend() != nil {
		// 0 checks without consuming; too many counts as MaxHits
		desc.Hits = int64(min(d.HitsAddend.Value, MaxHits))
	}
	if d.GetLimit() != nil && s.opts.AllowRequestLimits && cfg.Domain(req.Domain) != nil {
		desc.Own = ownLimit(d.Limit)
	}
	return desc
}

var unitNames = map[typev3.RateLimitUnit]time.Duration{
	typev3.RateLimitUnit_SECOND: time.Second,
	typev3.RateLimitUnit_MINUTE: time.Minute,
	typev3.RateLimitUnit_HOUR:   time.Hour,
	typev3.RateLimitUnit_DAY:    24 * time.Hour,
	typev3.RateLimitUnit_MONTH:  30 * 24 * time.Hour,
	typev3.RateLimitUnit_YEAR:   365 * 24 * time.Hour,
}

// ownLimit is a descriptor's own limit as the decider takes it.
func ownLimit(l *rlcommon.RateLimitDescriptor_RateLimitOverride) *decide.OwnLimit {
	return &decide.OwnLimit{RequestsPerUnit: l.RequestsPerUnit, Unit: unitNames[l.Unit], UnitName: l.Unit.String(), Multiplier: l.GetUnitMultiplier().GetValue()}
}

// respond turns the decider's results into the response.
func (s *Service) respond(req *rlsv3.RateLimitRequest, res []decide.Result) *rlsv3.RateLimitResponse {
	resp, parts := newResponse(len(res))
	var hdr headerState
	var violations []int // descriptors over their quota in quota mode
	soft := false        // an enforced soft-mode limit let a descriptor past its soft line
	for i := range res {
		r := &res[i]
		st, ph := s.status(req, i, r, &parts[i])
		resp.Statuses[i] = st
		switch r.Code {
		case decide.Over:
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		case decide.QuotaViolation:
			violations = append(violations, i)
		}
		if r.Enforced() {
			// the headers speak of the limits that are enforced, and of
			// the same wait as the status
			hdr.add(ph, &r.Decision, r.Code == decide.Over)
			soft = soft || softCrossed(&r.Decision)
		}
	}
	if !s.opts.NoRateLimitHeaders || s.opts.XRateLimitHeaders {
		resp.ResponseHeadersToAdd = hdr.headers(resp.ResponseHeadersToAdd, !s.opts.NoRateLimitHeaders, s.opts.XRateLimitHeaders, resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT)
	}
	if soft {
		// as the middleware marks it (gate.HeaderWarning); Envoy adds it
		// to the downstream response, OK or not
		resp.ResponseHeadersToAdd = appendHeader(resp.ResponseHeadersToAdd, HeaderWarning, WarningValue)
	}
	resp.DynamicMetadata = dynamicMetadata(res, violations)
	return resp
}

// status fills descriptor i's status in p from its result, and counts it
// in the metrics; ph is what the headers say of a decided result.
func (s *Service) status(req *rlsv3.RateLimitRequest, i int, r *decide.Result, p *respPart) (st *rlsv3.RateLimitResponse_DescriptorStatus, ph *policyHeader) {
	st = &p.status
	st.Code = rlsv3.RateLimitResponse_OK
	if !r.Decided() {
		if r.Limit != nil && r.Limit.Unlimited && !r.Own && !r.Replaced {
			st.LimitRemaining = math.MaxUint32 // as envoyproxy/ratelimit says it
		}
		return st, nil
	}
	ph = s.headerOf(r)
	if r.Op >= 0 {
		st.LimitRemaining = uint32(min(max(r.Decision.Remaining, 0), math.MaxUint32))
		st.CurrentLimit = currentLimit(&p.limit, r, req.Descriptors[i].GetLimit(), ph)
	} else { // blocked
		st.CurrentLimit = currentLimit(&p.limit, r, req.Descriptors[i].GetLimit(), nil)
	}
	if r.Op >= 0 || r.Wait > 0 {
		st.DurationUntilReset = setDuration(&p.duration, r.Wait)
	}
	s.observeDecision(req.Domain, r)
	return st, ph
}

// observeDecision counts a decided result: in the metrics, and, over the
// limit, in the top limited keys.
func (s *Service) observeDecision(domain string, r *decide.Result) {
	var ls *limitSeries
	if s.opts.Metrics != nil {
		ls = s.opts.Metrics.observeDecision(domain, r.Limit, r.Shadow, r.Key, statKey(r), &r.Decision)
	}
	if !r.Decision.Allowed {
		s.limited.Add(topk.RuleID{Domain: domain, Rule: ruleName(r.Limit)}, r.Key)
	}
	if s.rec != nil {
		s.recCounters(domain, r.Limit, ls).Record(r.Decision.Allowed, r.Shadow || r.Limit.QuotaMode, r.Decision.Degraded, r.Decision.Excess)
	}
}

// recCounters are l's counters in the recorder: kept in its metrics
// series ls when it has one (one lookup for both), else found by counters.
func (s *Service) recCounters(domain string, l *rules.Limit, ls *limitSeries) *recorder.Counters {
	if ls == nil {
		return s.counters(domain, l)
	}
	c := ls.rec.Load()
	if c == nil || c.Dropped() {
		c = s.counters(domain, l)
		ls.rec.Store(c)
	}
	return c
}

// counters are l's decision counters in the recorder: found by the
// limit's pointer, or, for a request's own limit (a fresh one each time),
// by domain.
func (s *Service) counters(domain string, l *rules.Limit) *recorder.Counters {
	if l.Policy != nil {
		return s.rec.For(l, recorder.ID{Domain: domain, Rule: l.Name})
	}
	if c, ok := s.own.Load(domain); ok {
		return c.(*recorder.Counters)
	}
	c := s.rec.For(ownLimits{domain}, recorder.ID{Domain: domain, Rule: requestLimitRule})
	if cfg := s.rules.Load(); cfg != nil && cfg.Domain(domain) != nil { // own limits need a known domain: bounded
		s.own.Store(domain, c)
	}
	return c
}

// ownLimits is the recorder's key of a domain's own limits.
type ownLimits struct{ domain string }

// ruleName is a limit's name as GET /v1/rules and the metrics show it:
// requestLimitRule for a request's own limit.
func ruleName(l *rules.Limit) string {
	if l.Policy == nil {
		return requestLimitRule
	}
	return l.Name
}

// headerOf is what the headers say of a decided result: its policy's, or,
// for a blocked limit, its limit's.
func (s *Service) headerOf(r *decide.Result) *policyHeader {
	if r.Op >= 0 {
		return s.headerFor(r.Limit, r.Policy)
	}
	return s.headerFor(r.Limit, r.Limit.Policy)
}

// statKey is the descriptor's statistics key (rules.Match.StatKey), or ""
// for a limit of the request's own.
func statKey(r *decide.Result) string {
	if r.Match == nil {
		return ""
	}
	return r.Match.StatKey
}

// logOnce logs at most one line a second.
func (s *Service) logOnce(msg string, args ...any) {
	now := time.Now().Unix()
	if last := s.lastLog.Load(); last != now && s.lastLog.CompareAndSwap(last, now) {
		s.opts.Logger.Warn(msg, args...)
	}
}

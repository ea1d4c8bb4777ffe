// Package service is Floodgate's rate-limit service: Envoy's
// envoy.service.ratelimit.v3 API over gRPC and HTTP/JSON, on the engine and
// any store, with rules from package rules and per-key overrides from
// package overrides.
package service

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/internal/ratehdr"
	"github.com/floodgate/floodgate/overrides"
	"github.com/floodgate/floodgate/rules"
)

// Bounds on one request, so hostile input costs little.
const (
	MaxDescriptors = 64       // descriptors in one request
	MaxEntries     = 32       // entries in one descriptor
	MaxEntryBytes  = 1024     // bytes in one entry's key (a value may be longer: see MaxKeyBytes)
	MaxKeyBytes    = 1024     // bytes of a descriptor's store key (after its domain): a longer one is kept as its start and a digest
	MaxHits        = 1 << 52  // hits_addend counted: a larger one counts as this, more than any rule holds (refused, nothing consumed)
	maxPolicies    = 16 << 10 // policies built for overrides and request limits, cached
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
}

// Service answers ShouldRateLimit. It is safe for concurrent use.
type Service struct {
	rlsv3.UnimplementedRateLimitServiceServer
	opts  Options
	rules atomic.Pointer[rules.Config]

	mu        sync.Mutex
	policies  map[string]*floodgate.Policy // by override signature
	ownLimits map[string]struct{}          // the own limits' signatures seen (maxOwnLimits)
	ownLimitL sync.Map                     // ownLimitKey → *rules.Limit: one per own limit, so its headers are computed once

	policyHeaders     sync.Map // policyHeaderKey → *policyHeader
	policyHeaderCount atomic.Int64

	adminMu sync.Mutex // serializes override changes: each carries the count from the one before

	guardMu sync.Mutex
	guards  map[string]*tokenGuard // RequireToken's, by token: one throttle for every handler a token guards

	overrideFailed atomic.Int64 // when an override lookup last failed (UnixNano)
	lastLog        atomic.Int64
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
	s := &Service{opts: opts, policies: map[string]*floodgate.Policy{}, ownLimits: map[string]struct{}{}}
	s.rules.Store(cfg)
	return s
}

// SetRules swaps the live rules (a reload).
func (s *Service) SetRules(cfg *rules.Config) { s.rules.Store(cfg) }

// Rules returns the live rules.
func (s *Service) Rules() *rules.Config { return s.rules.Load() }

// Store returns the service's store.
func (s *Service) Store() floodgate.Store { return s.opts.Store }

// errBadRequest marks an invalid request.
var errBadRequest = errors.New("invalid request")

func badRequest(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errBadRequest, fmt.Sprintf(format, args...))
}

// ShouldRateLimit implements the gRPC API.
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	resp, err := s.decideObserved(ctx, req)
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
	if s.opts.Metrics != nil {
		domain := req.GetDomain()
		if cfg := s.rules.Load(); cfg == nil || cfg.Domain(domain) == nil {
			domain = "_unknown" // callers choose domains: no series per garbage
		}
		s.opts.Metrics.observeRequest(domain, resp, err, time.Since(start))
	}
	return resp, err
}

// a planned descriptor
type item struct {
	match    *rules.Match
	limit    *rules.Limit
	policy   *floodgate.Policy
	key      string
	hits     int64
	refund   bool
	replaced bool
	blocked  bool                                            // requests_per_unit: 0: always over, the store is not asked
	reqLimit *rlcommon.RateLimitDescriptor_RateLimitOverride // the descriptor's own limit, when it decides
	decide   bool                                            // the store decides it (under policy, once resolved)
	op       int                                             // index into ops, or -1
}

// Decide answers a request; errors wrapping errBadRequest are the caller's.
func (s *Service) Decide(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if req == nil || req.Domain == "" {
		return nil, badRequest("domain must not be empty")
	}
	if len(req.Descriptors) == 0 {
		return nil, badRequest("no descriptors")
	}
	if len(req.Descriptors) > MaxDescriptors {
		return nil, badRequest("%d descriptors; at most %d", len(req.Descriptors), MaxDescriptors)
	}
	hits := int64(req.HitsAddend)
	if hits == 0 {
		hits = 1
	}
	cfg := s.rules.Load()
	// Most requests carry a descriptor or two: keep them off the heap.
	var itemBuf [4]item
	items := itemBuf[:0]
	if len(req.Descriptors) > len(itemBuf) {
		items = make([]item, 0, len(req.Descriptors))
	}
	items = items[:len(req.Descriptors)]
	var entryBuf [8]rules.Entry
	entries := entryBuf[:0]
	var replaced map[string]bool
	for i, d := range req.Descriptors {
		it := &items[i]
		it.op = -1
		if d == nil || len(d.Entries) == 0 {
			// Envoy sends one when its only action found nothing (a
			// request_headers action with skip_if_absent and no such
			// header): it matches nothing, and is OK, as in
			// envoyproxy/ratelimit. Refusing the request would fail it
			// whole, and let it through every limit where Envoy fails open.
			continue
		}
		if len(d.Entries) > MaxEntries {
			return nil, badRequest("descriptors[%d] has %d entries; at most %d", i, len(d.Entries), MaxEntries)
		}
		entries = entries[:0]
		for j, e := range d.Entries {
			if e.Key == "" {
				return nil, badRequest("descriptors[%d].entries[%d].key is empty", i, j)
			}
			if len(e.Key) > MaxEntryBytes {
				return nil, badRequest("descriptors[%d].entries[%d].key is longer than %d bytes", i, j, MaxEntryBytes)
			}
			// A value of any length is limited (it comes from the client,
			// say a header: refusing the request would let it through
			// where Envoy fails open); boundKey keeps its store key short.
			entries = append(entries, rules.Entry{Key: e.Key, Value: e.Value})
		}
		it.hits = hits
		if d.HitsAddend != nil {
			// 0 checks without consuming. Hits can come from what a client
			// sends (Envoy's hits_addend format strings): too many is an
			// answer (over the limit), not an error, which Envoy would let
			// through when it fails open. A rule's numbers stay under 2^51,
			// so MaxHits is more than any holds, and exact in Redis's Lua.
			it.hits = int64(min(d.HitsAddend.Value, MaxHits))
		}
		it.refund = d.IsNegativeHits
		if cfg != nil {
			it.match = cfg.Match(req.Domain, entries)
		}
		if it.match != nil {
			it.limit = it.match.Limit
			it.key = it.match.Key
			it.blocked = it.limit.Blocked
		}
		// As envoyproxy/ratelimit: a descriptor's own limit applies in the
		// domains the rules know, whatever the descriptor matches, and in
		// place of the matched limit altogether (its GetLimit returns the
		// own limit without looking at the rules): none of that limit's
		// shadow_mode, quota_mode, replaces, metadata or share_threshold
		// applies, and each value is counted on its own.
		if d.Limit != nil && s.opts.AllowRequestLimits && cfg.Domain(req.Domain) != nil {
			p, err := s.requestPolicy(d.Limit)
			switch {
			case errors.Is(err, errTooManyOwnLimits):
				// the rules decide, as without --allow-request-limits
				s.logOnce("a descriptor's own limit ignored", "err", err)
			case err != nil:
				return nil, badRequest("descriptors[%d].limit: %v", i, err)
			default:
				it.key = boundKey(entryKey(entries))
				it.reqLimit = d.Limit
				it.limit = s.ownLimit(p, d.Limit.RequestsPerUnit == 0)
				it.blocked = it.limit.Blocked
				if !it.blocked {
					it.policy = p
				} // else it blocks, as a rule's requests_per_unit: 0 does (p is a placeholder)
				continue
			}
		}
		if it.limit != nil {
			for _, r := range it.limit.Replaces {
				if replaced == nil {
					replaced = map[string]bool{}
				}
				replaced[r] = true
			}
		}
		it.key = boundKey(it.key)
	}

	// Which descriptors the store decides, and under which policy: the
	// rule's, or the key's override.
	lookups := 0
	for i := range items {
		it := &items[i]
		if it.limit == nil || it.limit.Unlimited && it.policy == nil {
			continue
		}
		// As envoyproxy/ratelimit: only a limit with a name given in the
		// file can be replaced.
		if it.limit.NameGiven && replaced[it.limit.Name] && it.policy == nil {
			it.replaced = true
			continue
		}
		if it.blocked && it.policy == nil {
			continue
		}
		it.decide = true
		if it.policy == nil {
			lookups++
		}
	}
	s.resolvePolicies(ctx, req.Domain, items, lookups)

	// Plan the store operations: one per limited descriptor, all in one
	// batch (one round trip of store latency).
	var opBuf [4]floodgate.Op
	ops := opBuf[:0]
	for i := range items {
		it := &items[i]
		if !it.decide || it.policy == nil {
			continue
		}
		p := it.policy
		kind, cost := floodgate.OpAllow, it.hits
		switch {
		case it.refund:
			kind = floodgate.OpRefund
		case cost == 0:
			kind = floodgate.OpPeek
		}
		it.op = len(ops)
		ops = append(ops, floodgate.Op{Policy: p, Key: req.Domain + "\x00" + it.key, Kind: kind, Cost: cost})
	}
	// All or nothing across descriptors, where the domain opts in: the
	// descriptors that can refuse (not shadow or quota mode; refunds aside)
	// form a group, admitted together or consuming nothing. A descriptor
	// of requests_per_unit 0 that refuses refuses the whole request: then
	// the others are only checked.
	var group []bool
	if dom := cfg.Domain(req.Domain); dom != nil && dom.AllOrNothing && len(ops) > 0 {
		refused := false
		for i := range items {
			if it := &items[i]; it.limit != nil && !s.shadow(it.limit) && !it.limit.QuotaMode && it.blockedOver() {
				refused = true
			}
		}
		members := 0
		group = make([]bool, len(ops))
		for i := range items {
			it := &items[i]
			if it.op < 0 || it.limit == nil || s.shadow(it.limit) || it.limit.QuotaMode || it.refund {
				continue
			}
			if refused && ops[it.op].Kind == floodgate.OpAllow {
				ops[it.op].Kind = floodgate.OpPeek
			}
			group[it.op] = true
			members++
		}
		if refused || members < 2 {
			group = nil // one member, or none that may consume: a plain batch
		}
	}

	var decisionBuf [4]floodgate.Decision
	decisions := decisionBuf[:0]
	now := s.opts.Clock.NowMicro()
	switch {
	case len(ops) == 0:
	case len(ops) == 1: // one store call, no batch to build
		d, err := s.opts.Store.Do(ctx, now, ops[0])
		if err != nil {
			return nil, err
		}
		decisions = append(decisions, d)
	default:
		// The store keeps neither slice, but escape analysis cannot know
		// that through an interface: give it heap copies.
		batch, out := append([]floodgate.Op(nil), ops...), make([]floodgate.Decision, len(ops))
		var err error
		if group != nil {
			_, err = floodgate.DoGroup(ctx, s.opts.Store, now, batch, group, out)
		} else {
			err = s.opts.Store.DoBatch(ctx, now, batch, out)
		}
		if err != nil {
			return nil, err
		}
		decisions = out
	}

	resp, parts := newResponse(len(items))
	var hdr headerState
	var violations []int // descriptors over their quota in quota mode
	for i := range items {
		it := &items[i]
		p := &parts[i]
		st := &p.status
		st.Code = rlsv3.RateLimitResponse_OK
		resp.Statuses[i] = st
		if it.blocked && it.op < 0 && !it.replaced {
			st.CurrentLimit = currentLimit(&p.limit, it, &floodgate.Decision{}, nil)
			ph := s.headerFor(&item{limit: it.limit, policy: it.limit.Policy})
			wait := ph.rules[0].period // no wait helps; the window's end is what the status says
			if ph.rules[0].fixed {
				wait = windowLeft(now, ph.rules[0].period)
				st.DurationUntilReset = setDuration(&p.duration, wait)
			}
			if !s.shadow(it.limit) && !it.limit.QuotaMode { // the headers say 0 left, as the status does
				hdr.add(ph, &floodgate.Decision{Allowed: !it.blockedOver(), ResetAfter: wait, RetryAfter: wait, Rule: ph.rules[0].rule}, it.blockedOver())
			}
			if s.opts.Metrics != nil {
				s.opts.Metrics.observeDecision(req.Domain, it.limit, s.shadow(it.limit), it.key, it.statKey(), &floodgate.Decision{Allowed: !it.blockedOver()})
			}
			switch {
			case !it.blockedOver():
				// a check (hits_addend 0) or a refund: 0 hits do not exceed 0
			case it.limit.QuotaMode && !it.limit.ShadowMode:
				// (a shadow_mode limit is OK before quota mode sees it)
				violations = append(violations, i)
			case !s.shadow(it.limit):
				st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
				resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
			}
			continue
		}
		if it.op < 0 {
			if it.limit != nil && it.limit.Unlimited && it.policy == nil {
				st.LimitRemaining = math.MaxUint32 // as envoyproxy/ratelimit says it
			}
			continue
		}
		d := &decisions[it.op]
		ph := s.headerFor(it)
		st.CurrentLimit = currentLimit(&p.limit, it, d, ph)
		st.LimitRemaining = uint32(min(max(d.Remaining, 0), math.MaxUint32))
		wait := d.ResetAfter
		if !d.Allowed && d.RetryAfter > 0 {
			wait = d.RetryAfter // else no wait helps (hits over the whole limit)
		}
		if rh := ph.forRule(d.Rule); wait <= 0 && rh.fixed {
			// nothing counted yet, or no wait helps: a fixed window
			// still says when it ends, as envoyproxy/ratelimit does
			wait = windowLeft(now, rh.period)
		}
		st.DurationUntilReset = setDuration(&p.duration, wait)
		over := !d.Allowed
		if s.opts.Metrics != nil {
			s.opts.Metrics.observeDecision(req.Domain, it.limit, s.shadow(it.limit), it.key, it.statKey(), d)
		}
		if over && it.limit.QuotaMode && !it.limit.ShadowMode {
			// admitted, and said in the metadata; a limit in shadow_mode
			// too is OK before quota mode sees it, as in
			// envoyproxy/ratelimit, whose limiter answers it OK
			violations = append(violations, i)
			over = false
		}
		if over && s.shadow(it.limit) {
			over = false // counted and logged, never blocking
		}
		if over {
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if !s.shadow(it.limit) && !it.limit.QuotaMode {
			// the headers speak of the limits that are enforced, and of
			// the same wait as the status
			hd := *d
			if hd.Allowed {
				hd.ResetAfter = wait
			} else {
				hd.RetryAfter = wait
			}
			hdr.add(ph, &hd, over)
		}
	}
	if !s.opts.NoRateLimitHeaders || s.opts.XRateLimitHeaders {
		resp.ResponseHeadersToAdd = hdr.headers(resp.ResponseHeadersToAdd, !s.opts.NoRateLimitHeaders, s.opts.XRateLimitHeaders, resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT)
	}
	resp.DynamicMetadata = dynamicMetadata(items, violations)
	return resp, nil
}

// shadow reports whether l counts without refusing: its own shadow_mode,
// or the service's.
func (s *Service) shadow(l *rules.Limit) bool { return s.opts.ShadowMode || l.ShadowMode }

// statKey is the descriptor's statistics key (rules.Match.StatKey), or ""
// for a limit of the request's own.
func (it *item) statKey() string {
	if it.match == nil {
		return ""
	}
	return it.match.StatKey
}

// blockedOver says whether a descriptor is over a limit of
// requests_per_unit 0: when it brings hits (a check or a refund does not).
func (it *item) blockedOver() bool {
	return it.blocked && it.op < 0 && !it.replaced && it.hits != 0 && !it.refund
}

// windowLeft is the time from now (Unix µs) to the end of the fixed
// window of period p aligned to the Unix epoch.
func windowLeft(now int64, p time.Duration) time.Duration {
	pm := p.Microseconds()
	if pm <= 0 {
		return 0
	}
	return time.Duration(pm-now%pm) * time.Microsecond
}

// dynamicMetadata is the response's dynamic_metadata when some matched
// limit has metadata or quota_mode (nil otherwise): "metadata", the
// matched limits' metadata mappings, one per descriptor of the request
// (null where none); and, as envoyproxy/ratelimit names them,
// "quotaModeEnabled" and "quotaModeViolations" (the indexes of the
// descriptors admitted over their quota).
func dynamicMetadata(items []item, violations []int) *structpb.Struct {
	var meta, quota bool
	for i := range items {
		if l := items[i].limit; l != nil && !items[i].replaced {
			meta = meta || l.Metadata != nil
			quota = quota || l.QuotaMode
		}
	}
	if !meta && !quota {
		return nil
	}
	fields := map[string]*structpb.Value{}
	if meta {
		list := make([]*structpb.Value, len(items))
		for i := range items {
			list[i] = structpb.NewNullValue()
			if l := items[i].limit; l != nil && l.Metadata != nil && !items[i].replaced {
				if v, err := structpb.NewStruct(l.Metadata); err == nil {
					list[i] = structpb.NewStructValue(v)
				}
			}
		}
		fields["metadata"] = structpb.NewListValue(&structpb.ListValue{Values: list})
	}
	if quota {
		fields["quotaModeEnabled"] = structpb.NewBoolValue(true)
		if len(violations) > 0 {
			list := make([]*structpb.Value, len(violations))
			for i, v := range violations {
				list[i] = structpb.NewNumberValue(float64(v))
			}
			fields["quotaModeViolations"] = structpb.NewListValue(&structpb.ListValue{Values: list})
		}
	}
	return &structpb.Struct{Fields: fields}
}

// A response and the messages it points to are allocated together: one
// block for the usual single descriptor (the response, its status, limit,
// duration and up to three headers), a few slices for more. They are
// ordinary messages to the caller; only the allocations are shared.
type respHead struct {
	resp     rlsv3.RateLimitResponse
	hdrPtrs  [3]*corev3.HeaderValue
	hdrVals  [3]corev3.HeaderValue
	statuses [1]*rlsv3.RateLimitResponse_DescriptorStatus
}

// respPart is one descriptor's status and what it points to.
type respPart struct {
	status   rlsv3.RateLimitResponse_DescriptorStatus
	limit    rlsv3.RateLimitResponse_RateLimit
	duration durationpb.Duration
}

type respOne struct {
	respHead
	part [1]respPart
}

func newResponse(n int) (*rlsv3.RateLimitResponse, []respPart) {
	var h *respHead
	var parts []respPart
	if n == 1 {
		b := &respOne{}
		h, parts = &b.respHead, b.part[:]
		h.resp.Statuses = h.statuses[:]
	} else {
		h, parts = &respHead{}, make([]respPart, n)
		h.resp.Statuses = make([]*rlsv3.RateLimitResponse_DescriptorStatus, n)
	}
	for i := range h.hdrPtrs {
		h.hdrPtrs[i] = &h.hdrVals[i]
	}
	h.resp.OverallCode = rlsv3.RateLimitResponse_OK
	// headers() fills ResponseHeadersToAdd from this (empty) slice.
	h.resp.ResponseHeadersToAdd = h.hdrPtrs[:0]
	return &h.resp, parts
}

// setDuration is durationpb.New(d), into dst.
// setDuration sets dst to d in whole seconds, rounded up, as
// envoyproxy/ratelimit reports duration_until_reset: Envoy's
// X-RateLimit-Reset takes the seconds alone, so 0.3 s would say 0 (retry
// now) and 56.3 s would say 56 where the RateLimit header says 57.
func setDuration(dst *durationpb.Duration, d time.Duration) *durationpb.Duration {
	dst.Seconds, dst.Nanos = ratehdr.CeilSeconds(d), 0
	return dst
}

// override looks up key's override within OverrideTimeout. After a failed
// lookup (the overrides' store down, say) it does not ask again for a
// second, so requests do not each pay the timeout: the rules decide.
func (s *Service) override(ctx context.Context, domain, key string) (overrides.Override, bool, error) {
	if t := s.overrideFailed.Load(); t != 0 && time.Since(time.Unix(0, t)) < time.Second {
		return overrides.Override{}, false, nil
	}
	if k, ok := s.opts.Overrides.(interface{ MayHave(string) bool }); ok && !k.MayHave(domain) {
		return overrides.Override{}, false, nil // no lookup, and no context for one
	}
	lctx := withLazyTimeout(ctx, s.opts.OverrideTimeout)
	o, ok, err := s.opts.Overrides.Get(lctx, domain, key)
	lctx.stop()
	if err != nil {
		s.overrideFailed.Store(time.Now().UnixNano())
	}
	return o, ok, err
}

// resolvePolicies sets the policy of each item the store decides that
// has none yet (n of them): its key's override applied to its limit, or
// the limit's own. Several lookups run at once, so that a request whose
// keys are not cached waits for one lookup's latency (a round trip to
// Redis), not one per descriptor.
func (s *Service) resolvePolicies(ctx context.Context, domain string, items []item, n int) {
	if n <= 1 || s.opts.Overrides == nil {
		for i := range items {
			if it := &items[i]; it.decide && it.policy == nil {
				it.policy = s.keyPolicy(ctx, domain, it.limit, it.key)
			}
		}
		return
	}
	// The goroutines get copies: a pointer into items would move every
	// request's items to the heap.
	type lookup struct {
		l   *rules.Limit
		key string
		p   *floodgate.Policy
	}
	ls := make([]lookup, 0, n)
	for i := range items {
		if it := &items[i]; it.decide && it.policy == nil {
			ls = append(ls, lookup{l: it.limit, key: it.key})
		}
	}
	var wg sync.WaitGroup
	for j := range ls {
		wg.Go(func() { ls[j].p = s.keyPolicy(ctx, domain, ls[j].l, ls[j].key) })
	}
	wg.Wait()
	j := 0
	for i := range items {
		if it := &items[i]; it.decide && it.policy == nil {
			it.policy = ls[j].p
			j++
		}
	}
}

// keyPolicy returns the policy deciding key under l: the key's override
// applied to l's rules when there is one, else l's own policy. A failed
// lookup or an override that cannot apply leaves l's policy (logged).
func (s *Service) keyPolicy(ctx context.Context, domain string, l *rules.Limit, key string) *floodgate.Policy {
	if s.opts.Overrides == nil {
		return l.Policy
	}
	o, ok, err := s.override(ctx, domain, key)
	if err != nil {
		s.logOnce("overrides: lookup failed; the rules decide meanwhile", "err", err)
		return l.Policy
	}
	if !ok {
		return l.Policy
	}
	p, err := s.overridePolicy(domain, l, o)
	if err != nil {
		s.logOnce("overrides: cannot apply an override; using the rule", "domain", domain, "key", key, "err", err)
		return l.Policy
	}
	return p
}

// logOnce logs at most one line a second.
func (s *Service) logOnce(msg string, args ...any) {
	now := time.Now().Unix()
	if last := s.lastLog.Load(); last != now && s.lastLog.CompareAndSwap(last, now) {
		s.opts.Logger.Warn(msg, args...)
	}
}

// boundKey returns k if it is at most MaxKeyBytes long, and otherwise its
// first MaxKeyBytes-65 bytes, "#" and the hex SHA-256 of the whole: keys of
// bounded size in the store, whatever the values clients send, and still
// one key per distinct value.
func boundKey(k string) string {
	if len(k) <= MaxKeyBytes {
		return k
	}
	sum := sha256.Sum256([]byte(k))
	n := MaxKeyBytes - 65
	for n > 0 && !utf8.RuneStart(k[n]) { // keep whole characters
		n--
	}
	return k[:n] + "#" + hex.EncodeToString(sum[:])
}

// entryKey is the store key for a descriptor no rule matched (a request's
// own limit).
func entryKey(es []rules.Entry) string {
	var b strings.Builder
	for i, e := range es {
		if i > 0 {
			b.WriteByte('|')
		}
		b.WriteString(strconv.Quote(e.Key))
		b.WriteByte('=')
		b.WriteString(strconv.Quote(e.Value))
	}
	return b.String()
}

var unitNames = map[typev3.RateLimitUnit]time.Duration{
	typev3.RateLimitUnit_SECOND: time.Second,
	typev3.RateLimitUnit_MINUTE: time.Minute,
	typev3.RateLimitUnit_HOUR:   time.Hour,
	typev3.RateLimitUnit_DAY:    24 * time.Hour,
	typev3.RateLimitUnit_MONTH:  30 * 24 * time.Hour,
	typev3.RateLimitUnit_YEAR:   365 * 24 * time.Hour,
}

// maxOwnLimits bounds the distinct own limits (requests_per_unit and
// window) callers may use: each is a policy, and a table of its own in the
// memory store, kept for good; beyond, a descriptor's own limit is ignored
// and the rules decide.
const maxOwnLimits = 4096

var errTooManyOwnLimits = fmt.Errorf("more than %d distinct own limits are in use", maxOwnLimits)

// maxOwnWindow is the longest window a descriptor's own limit may ask for:
// a hundred years of 365 days (a multiplier beyond overflows a Duration).
const maxOwnWindow = 100 * 365 * 24 * time.Hour

// requestPolicy builds (and caches) the policy of a descriptor's own limit.
func (s *Service) requestPolicy(l *rlcommon.RateLimitDescriptor_RateLimitOverride) (*floodgate.Policy, error) {
	w, ok := unitNames[l.Unit]
	if !ok {
		return nil, fmt.Errorf("unit %v", l.Unit)
	}
	if l.UnitMultiplier != nil && l.UnitMultiplier.Value > 1 {
		if m := int64(l.UnitMultiplier.Value); m > int64(maxOwnWindow/w) {
			return nil, fmt.Errorf("unit_multiplier %d: a window of %d × %v is more than %v", m, m, w, maxOwnWindow)
		}
		w *= time.Duration(l.UnitMultiplier.Value)
	}
	rpu := max(l.RequestsPerUnit, 1) // 0 blocks: the caller does not ask the store (a placeholder)
	sig := fmt.Sprintf("request|%d|%d", rpu, w)
	s.mu.Lock()
	if _, seen := s.ownLimits[sig]; !seen {
		if len(s.ownLimits) >= maxOwnLimits {
			s.mu.Unlock()
			return nil, errTooManyOwnLimits
		}
		s.ownLimits[sig] = struct{}{}
	}
	s.mu.Unlock()
	return s.cachedPolicy(sig, func() (*floodgate.Policy, error) {
		return floodgate.NewPolicy(sig, floodgate.Rule{Name: fmt.Sprintf("%d/%s", rpu, w), Algorithm: floodgate.FixedWindow, Limit: int64(rpu), Period: w})
	})
}

type ownLimitKey struct {
	policy  string
	blocked bool
}

// ownLimit returns the limit standing for a descriptor's own limit of
// policy p (requestPolicy's), blocked for requests_per_unit 0: unnamed in
// the file, in no shadow or quota mode, replacing nothing. One per policy
// (at most maxOwnLimits of them), so that the headers' cache, keyed by
// limit, holds one entry per own limit rather than one per request.
func (s *Service) ownLimit(p *floodgate.Policy, blocked bool) *rules.Limit {
	k := ownLimitKey{p.Name(), blocked}
	if v, ok := s.ownLimitL.Load(k); ok {
		return v.(*rules.Limit)
	}
	l := &rules.Limit{Name: p.Rules()[0].Name}
	if blocked {
		// the placeholder policy says the window to the headers
		l.Blocked, l.Policy, l.Window = true, p, p.Rules()[0].Period
	}
	v, _ := s.ownLimitL.LoadOrStore(k, l)
	return v.(*rules.Limit)
}

// overridePolicy builds (and caches) the policy of a per-key override: the
// matched limit's rules with one of them given the override's numbers —
// the rule whose window is the override's period when there is one (an
// override of 50 per second on "100 per second and 5 per hour" keeps the
// hourly rule), else the first rule. The other rules still apply.
func (s *Service) overridePolicy(domain string, l *rules.Limit, o overrides.Override) (*floodgate.Policy, error) {
	if l.Policy == nil {
		return nil, errors.New("the matched limit is unlimited")
	}
	sig := fmt.Sprintf("override|%s|%s|%d|%d|%d|%s", l.Policy.Name(), domain, o.Limit, o.Period, o.Burst, o.Algorithm)
	return s.cachedPolicy(sig, func() (*floodgate.Policy, error) {
		rs := append([]floodgate.Rule(nil), l.Policy.Rules()...)
		k := 0
		for i, r := range rs {
			if r.Calendar == "" && r.Period == o.Period {
				k = i
				break
			}
		}
		// the rule keeps its name: a key's count follows it by name when
		// its override changes (carry)
		r := o.Apply(rs[k])
		if r.Algorithm == floodgate.SlidingSubwindow && o.Algorithm == "" {
			// the rule's sub-windows need not divide the override's period
			r.Algorithm, r.Granularity = floodgate.SlidingWindow, 0
		}
		rs[k] = r
		return floodgate.NewPolicy(sig, rs...)
	})
}

func (s *Service) cachedPolicy(sig string, build func() (*floodgate.Policy, error)) (*floodgate.Policy, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p, ok := s.policies[sig]; ok {
		return p, nil
	}
	p, err := build()
	if err != nil {
		return nil, err
	}
	if len(s.policies) >= maxPolicies {
		// One out, at random (a map's order is): clearing them all made
		// every request rebuild its policy while more than maxPolicies
		// override number sets were in use (20,000 took decisions to
		// about 1,300 a second).
		for k := range s.policies {
			delete(s.policies, k)
			break
		}
	}
	s.policies[sig] = p
	return p, nil
}

var envoyUnits = map[string]rlsv3.RateLimitResponse_RateLimit_Unit{
	"second": rlsv3.RateLimitResponse_RateLimit_SECOND, "minute": rlsv3.RateLimitResponse_RateLimit_MINUTE,
	"hour": rlsv3.RateLimitResponse_RateLimit_HOUR, "day": rlsv3.RateLimitResponse_RateLimit_DAY,
	"week": rlsv3.RateLimitResponse_RateLimit_WEEK, "month": rlsv3.RateLimitResponse_RateLimit_MONTH,
	"year": rlsv3.RateLimitResponse_RateLimit_YEAR,
}

// currentLimit reports the deciding rule as Envoy's API can: its name
// (for a one-rule limit, the name given in the file, which Envoy leaves
// empty otherwise; for several rules, the deciding rule's), requests per
// unit, and the unit with its multiplier when the window is one (90 s is
// 90 × SECOND; a calendar window has no unit: the headers carry it).
//
// ph is the headers' description of it's policy (nil when it has none);
// it names the policy's rules, so nothing here copies them.
func currentLimit(cl *rlsv3.RateLimitResponse_RateLimit, it *item, d *floodgate.Decision, ph *policyHeader) *rlsv3.RateLimitResponse_RateLimit {
	cl.RequestsPerUnit = uint32(min(max(d.Limit, 0), math.MaxUint32))
	if rl := it.reqLimit; rl != nil {
		// the descriptor's own limit, said as given (Envoy's units are
		// numbered alike in both enums), unnamed, as envoyproxy/ratelimit does
		cl.Unit = rlsv3.RateLimitResponse_RateLimit_Unit(rl.Unit)
		if m := rl.GetUnitMultiplier().GetValue(); m > 1 {
			cl.UnitMultiplier = wrapperspb.UInt32(m)
		}
		if it.blocked {
			cl.RequestsPerUnit = 0
		}
		return cl
	}
	l := it.limit
	if l == nil {
		return cl
	}
	if l.NameGiven {
		cl.Name = l.Name
	}
	several := ph != nil && len(ph.rules) > 1
	if ph != nil && (it.policy != l.Policy || several) {
		// an override, a request's own limit, or one rule of several:
		// the deciding rule's window (none for a calendar window)
		rh := ph.forRule(d.Rule)
		if several {
			cl.Name = rh.rule
		}
		w := rh.period
		for _, u := range []struct {
			name string
			d    time.Duration
		}{{"day", 24 * time.Hour}, {"hour", time.Hour}, {"minute", time.Minute}, {"second", time.Second}} {
			if w >= u.d && w%u.d == 0 {
				cl.Unit = envoyUnits[u.name]
				if n := w / u.d; n > 1 {
					cl.UnitMultiplier = wrapperspb.UInt32(uint32(n))
				}
				break
			}
		}
		return cl
	}
	if l.Blocked {
		cl.RequestsPerUnit = 0
	}
	if l.MultipliedUnit != "" {
		cl.Unit = envoyUnits[l.MultipliedUnit]
		if l.UnitMultiplier > 1 {
			cl.UnitMultiplier = wrapperspb.UInt32(l.UnitMultiplier)
		}
	}
	return cl
}

// headerState gathers what the response headers say: the deciding limit
// (the one that denies with the longest wait, else the one with the fewest
// remaining) and every limit's policy, each rule of each, at most
// maxPolicyItems items.
type headerState struct {
	policy   string             // the first limit's RateLimit-Policy items
	first    []string           // and each of them
	policies []string           // the others' items, once each
	items    int                // how many in all, at most maxPolicyItems
	best     floodgate.Decision // a copy: a pointer would move the decisions to the heap
	hasBest  bool
	bestOver bool
	name     string
	window   time.Duration
}

// policyHeader is what the headers say of a (limit, policy), computed
// once: its RateLimit-Policy items, one per rule, and each rule's name and
// window for the RateLimit header.
type policyHeader struct {
	item  string   // at most maxPolicyItems of items
	items []string // one per rule
	rules []ruleHeader
}

// maxPolicyItems bounds RateLimit-Policy's items: a request of hundreds of
// descriptors gets the first few policies, not a header of kilobytes.
const maxPolicyItems = 8

type ruleHeader struct {
	rule, name string        // the rule's name in its policy; as the headers say it
	window     time.Duration // nominal for a calendar window
	period     time.Duration // 0 for a calendar window
	fixed      bool          // a fixed window aligned to the Unix epoch
}

// forRule returns the header of the rule named rule (the first rule's if
// none is).
func (ph *policyHeader) forRule(rule string) *ruleHeader {
	for i := range ph.rules {
		if ph.rules[i].rule == rule {
			return &ph.rules[i]
		}
	}
	return &ph.rules[0]
}

type policyHeaderKey struct {
	limit  *rules.Limit
	policy *floodgate.Policy
}

func (s *Service) headerFor(it *item) *policyHeader {
	k := policyHeaderKey{it.limit, it.policy}
	if v, ok := s.policyHeaders.Load(k); ok {
		return v.(*policyHeader)
	}
	rs := it.policy.Rules()
	ph := &policyHeader{rules: make([]ruleHeader, len(rs))}
	items := make([]string, len(rs))
	for i, r := range rs {
		name := r.Name
		if len(rs) == 1 && it.limit != nil && it.limit.Name != "" {
			name = it.limit.Name
		}
		rh := ruleHeader{rule: r.Name, name: sfString(name), window: ratehdr.Window(r), period: r.Period}
		if r.Calendar != "" {
			rh.period = 0
		}
		rh.fixed = r.Algorithm == floodgate.FixedWindow && rh.period > 0
		ph.rules[i] = rh
		q, w := ratehdr.Quota(r)
		if it.limit != nil && it.limit.Blocked {
			q = 0 // the policy's rule holds a placeholder of 1
		}
		items[i] = ratehdr.PolicyItem(rh.name, q, w)
	}
	ph.items, ph.item = items, strings.Join(items[:min(len(items), maxPolicyItems)], ", ")
	if s.policyHeaderCount.Add(1) > maxPolicies {
		s.policyHeaders.Clear() // old rule versions and overrides: start over
		s.policyHeaderCount.Store(1)
	}
	v, _ := s.policyHeaders.LoadOrStore(k, ph)
	return v.(*policyHeader)
}

func (h *headerState) add(ph *policyHeader, d *floodgate.Decision, over bool) {
	rh := ph.forRule(d.Rule)
	w, name := rh.window, rh.name
	switch {
	case h.policy == "":
		h.policy, h.first, h.items = ph.item, ph.items, min(len(ph.items), maxPolicyItems)
	case h.policy != ph.item:
		for _, x := range ph.items {
			if h.items == maxPolicyItems {
				break
			}
			if !slices.Contains(h.first, x) && !slices.Contains(h.policies, x) { // once each
				h.policies, h.items = append(h.policies, x), h.items+1
			}
		}
	}
	better := !h.hasBest
	if !better {
		switch {
		case over && !h.bestOver:
			better = true
		case over && h.bestOver:
			better = d.RetryAfter > h.best.RetryAfter
		case !over && !h.bestOver:
			better = d.Remaining < h.best.Remaining
		}
	}
	if better {
		h.best, h.hasBest, h.bestOver, h.name, h.window = *d, true, over, name, w
	}
}

// headers renders RateLimit-Policy and RateLimit per
// draft-ietf-httpapi-ratelimit-headers-11 (structured fields: a quoted
// policy name with q (quota), w (window, seconds); r (remaining), t
// (seconds until reset)), Retry-After when over, and X-RateLimit-* if asked.
func (h *headerState) headers(dst []*corev3.HeaderValue, draft, legacy, over bool) []*corev3.HeaderValue {
	if !h.hasBest {
		return nil
	}
	d := &h.best
	reset := d.ResetAfter
	if h.bestOver {
		reset = d.RetryAfter
	}
	secs := ceilSeconds(reset)
	policy := h.policy
	if len(h.policies) > 0 {
		policy += ", " + strings.Join(h.policies, ", ")
	}
	// A decision a failure mode made while the store could not answer
	// counted nothing: no RateLimit (nor X-RateLimit-*) claims what
	// remains, as the middleware's do not; the policy still applies.
	counted := !d.Degraded
	if draft {
		var buf [96]byte
		dst = appendHeader(dst, "RateLimit-Policy", policy)
		if counted {
			dst = appendHeader(dst, "RateLimit", string(ratehdr.AppendLimit(buf[:0], h.name, d.Remaining, reset)))
		}
		if over {
			dst = appendHeader(dst, "Retry-After", strconv.FormatInt(max(secs, 1), 10))
		}
	}
	if legacy && counted {
		dst = appendHeader(dst, "X-RateLimit-Limit", strconv.FormatInt(d.Limit, 10))
		dst = appendHeader(dst, "X-RateLimit-Remaining", strconv.FormatInt(max(d.Remaining, 0), 10))
		dst = appendHeader(dst, "X-RateLimit-Reset", strconv.FormatInt(secs, 10))
	}
	return dst
}

// appendHeader appends a header, in the next of dst's preallocated values
// while there is room.
func appendHeader(dst []*corev3.HeaderValue, key, value string) []*corev3.HeaderValue {
	if n := len(dst); n < cap(dst) {
		dst = dst[:n+1]
		if h := dst[n]; h != nil {
			h.Key, h.Value = key, value
			return dst
		}
		dst[n] = &corev3.HeaderValue{Key: key, Value: value}
		return dst
	}
	return append(dst, &corev3.HeaderValue{Key: key, Value: value})
}

func ceilSeconds(d time.Duration) int64 { return ratehdr.CeilSeconds(d) }

func sfString(s string) string { return ratehdr.SFString(s) }

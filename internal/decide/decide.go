// Package decide is the one interpreter of a rules file's limits: a
// request's descriptors, matched to their limits (replaces, blocked,
// unlimited, a descriptor's own limit, per-key overrides), become store
// operations, and the store's decisions become per-descriptor results
// (quota_mode, shadow_mode, all or nothing). The service, the middleware
// and the proxy are its front doors.
//
// A caller that decides more than rules-file limits puts the decider's
// operations into its own store call: Plan appends them to the caller's
// operations, and Finish reads their decisions. Decide does both, in one
// store call of its own.
package decide

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/rules"
	"github.com/floodgate/floodgate/storekit"
)

// Bounds on one request, so hostile input costs little.
const (
	MaxDescriptors = 64       // descriptors in one request
	MaxEntries     = 32       // entries in one descriptor
	MaxEntryBytes  = 1024     // bytes in one entry's key (a value may be longer: see MaxKeyBytes)
	MaxKeyBytes    = 1024     // bytes of a descriptor's store key (after its domain): a longer one is kept as its start and a digest
	MaxHits        = 1 << 52  // hits counted: a larger number counts as this, more than any rule holds (refused, nothing consumed)
	maxPolicies    = 16 << 10 // policies built for overrides and own limits, cached
)

// ErrBadRequest marks an invalid request (the caller's error).
var ErrBadRequest = errors.New("invalid request")

func badRequest(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadRequest, fmt.Sprintf(format, args...))
}

// Options configure a Decider.
type Options struct {
	// Overrides holds per-key overrides (may be nil). A lookup gives up
	// after OverrideTimeout (default 50ms) and the rule decides.
	Overrides       rules.Overrides
	OverrideTimeout time.Duration
	// ShadowMode puts every limit in shadow mode.
	ShadowMode bool
	// AllowRequestLimits honours a descriptor's own limit.
	AllowRequestLimits bool
	// Logger receives warnings (default slog.Default()).
	Logger *slog.Logger
}

// A Decider decides descriptors against rules. It is safe for concurrent
// use.
type Decider struct {
	opts Options

	mu        sync.Mutex
	policies  map[string]*floodgate.Policy // by signature
	ownLimits map[string]struct{}          // the own limits' signatures seen (maxOwnLimits)
	ownLimitL sync.Map                     // ownLimitKey → *rules.Limit

	overrideFailed atomic.Int64 // when an override lookup last failed (UnixNano)
	lastLog        atomic.Int64
}

// New returns a decider.
func New(opts Options) *Decider {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.OverrideTimeout <= 0 {
		opts.OverrideTimeout = 50 * time.Millisecond
	}
	return &Decider{opts: opts, policies: map[string]*floodgate.Policy{}, ownLimits: map[string]struct{}{}}
}

// A Descriptor is one descriptor of a request.
type Descriptor struct {
	// Entries are the descriptor's entries, in order; none matches
	// nothing (and is OK).
	Entries []rules.Entry
	// Hits is what the descriptor counts: 0 checks without consuming,
	// more than MaxHits counts as MaxHits.
	Hits   int64
	Refund bool      // give Hits back rather than take them
	Own    *OwnLimit // the descriptor's own limit, with AllowRequestLimits
}

// Code is a descriptor's answer.
type Code uint8

// The codes.
const (
	OK             Code = iota // within its limit, or no limit applies
	Over                       // over its limit: the request is refused
	QuotaViolation             // over its limit in quota_mode: admitted, and said
)

// A Result is what the decider made of one descriptor.
type Result struct {
	Match  *rules.Match      // the rules' match (nil: none, or an own limit)
	Limit  *rules.Limit      // the deciding limit: the match's, or one standing for an own limit
	Policy *floodgate.Policy // the policy the store decides under (an override's, an own limit's)
	Key    string            // the store key after the domain (bounded)
	Own    bool              // the descriptor's own limit decides
	Hits   int64
	Refund bool
	// Replaced: another matched limit replaces this one; Blocked:
	// requests_per_unit 0 (the store is not asked).
	Replaced, Blocked bool
	// Op is the index of the descriptor's operation among the caller's
	// operations, or -1 when the store is not asked.
	Op int
	// Member: the operation can refuse the request (neither shadow nor
	// quota mode, nor a refund): a member of an all-or-nothing group.
	Member bool
	// Decision is the store's (or, for a blocked limit, the decider's)
	// decision, with its wait: RetryAfter when refused, else ResetAfter
	// (a fixed window's end when nothing else says it).
	Decision floodgate.Decision
	Wait     time.Duration // the status's wait until reset (0 for a blocked limit but a fixed window's)
	Code     Code
	Shadow   bool // the limit counts without refusing (shadow_mode)

	decide bool // the store decides it (under Policy, once resolved)
}

// Decided reports whether a limit decided the descriptor (the store, or a
// blocked limit).
func (r *Result) Decided() bool {
	return r.Op >= 0 || r.blockedHere()
}

// Enforced reports whether the result's limit can refuse: the headers
// speak of it (not shadow or quota mode).
func (r *Result) Enforced() bool {
	return r.Decided() && !r.Shadow && !r.Limit.QuotaMode
}

// blockedHere: a blocked limit that the decider itself decides.
func (r *Result) blockedHere() bool { return r.Blocked && r.Op < 0 && !r.Replaced }

// blockedOver says whether a descriptor is over a limit of
// requests_per_unit 0: when it brings hits (a check or a refund does not).
func (r *Result) blockedOver() bool {
	return r.blockedHere() && r.Hits != 0 && !r.Refund
}

// Plan matches descs (of domain, under cfg) into res (len(res) ==
// len(descs)) and appends the store operations they need to ops; each
// result's Op indexes ops. An invalid request gives an error wrapping
// ErrBadRequest.
func (d *Decider) Plan(ctx context.Context, cfg *rules.Config, domain string, descs []Descriptor, res []Result, ops []floodgate.Op) ([]floodgate.Op, error) {
	if err := CheckRequest(domain, len(descs)); err != nil {
		return ops, err
	}
	var replaced map[string]bool
	for i := range descs {
		if err := d.match(cfg, domain, i, &descs[i], &res[i]); err != nil {
			return ops, err
		}
		if r := &res[i]; r.Limit != nil && !r.Own {
			for _, name := range r.Limit.Replaces {
				if replaced == nil {
					replaced = map[string]bool{}
				}
				replaced[name] = true
			}
		}
	}
	lookups := d.markDecided(res, replaced)
	d.resolvePolicies(ctx, domain, res, lookups)
	return d.appendOps(domain, res, ops), nil
}

// CheckRequest checks a request's domain and its number of descriptors,
// n, before a front door converts them.
func CheckRequest(domain string, n int) error {
	if domain == "" {
		return badRequest("domain must not be empty")
	}
	if n == 0 {
		return badRequest("no descriptors")
	}
	if n > MaxDescriptors {
		return badRequest("%d descriptors; at most %d", n, MaxDescriptors)
	}
	return nil
}

// checkEntries checks descriptor i's entries.
func checkEntries(i int, es []rules.Entry) error {
	if len(es) > MaxEntries {
		return badRequest("descriptors[%d] has %d entries; at most %d", i, len(es), MaxEntries)
	}
	for j := range es {
		if es[j].Key == "" {
			return badRequest("descriptors[%d].entries[%d].key is empty", i, j)
		}
		if len(es[j].Key) > MaxEntryBytes {
			return badRequest("descriptors[%d].entries[%d].key is longer than %d bytes", i, j, MaxEntryBytes)
		}
	}
	return nil
}

// match finds descriptor i's limit and key.
func (d *Decider) match(cfg *rules.Config, domain string, i int, desc *Descriptor, r *Result) error {
	*r = Result{Op: -1}
	if len(desc.Entries) == 0 {
		// Envoy sends one when its only action found nothing (a
		// request_headers action with skip_if_absent and no such
		// header): it matches nothing, and is OK, as in
		// envoyproxy/ratelimit. Refusing the request would fail it
		// whole, and let it through every limit where Envoy fails open.
		return nil
	}
	if err := checkEntries(i, desc.Entries); err != nil {
		return err
	}
	// Hits can come from what a client sends: too many is an answer
	// (over the limit), not an error, which Envoy would let through when
	// it fails open. A rule's numbers stay under 2^51, so MaxHits is more
	// than any holds, and exact in Redis's Lua.
	r.Hits, r.Refund = min(max(desc.Hits, 0), MaxHits), desc.Refund
	if m := cfg.Match(domain, desc.Entries); m != nil {
		r.Match, r.Limit, r.Blocked = m, m.Limit, m.Limit.Blocked
		r.Key = m.Key
	}
	r.Shadow = r.Limit != nil && (d.opts.ShadowMode || r.Limit.ShadowMode)
	if desc.Own != nil && d.opts.AllowRequestLimits && cfg.Domain(domain) != nil {
		return d.own(i, desc, r)
	}
	r.Key = BoundKey(r.Key)
	return nil
}

// own puts descriptor i under its own limit. As envoyproxy/ratelimit: it
// applies in the domains the rules know, whatever the descriptor matches,
// and in place of the matched limit altogether: none of that limit's
// shadow_mode, quota_mode, replaces, metadata or share_threshold applies,
// and each value is counted on its own.
func (d *Decider) own(i int, desc *Descriptor, r *Result) error {
	p, err := d.ownPolicy(desc.Own)
	switch {
	case errors.Is(err, errTooManyOwnLimits):
		// the rules decide, as without AllowRequestLimits
		d.logOnce("a descriptor's own limit ignored", "err", err)
		r.Key = BoundKey(r.Key)
		return nil
	case err != nil:
		return badRequest("descriptors[%d].limit: %v", i, err)
	}
	r.Match, r.Own, r.Shadow = nil, true, d.opts.ShadowMode
	r.Key = BoundKey(EntryKey(desc.Entries))
	r.Limit = d.ownLimit(p, desc.Own.RequestsPerUnit == 0)
	r.Blocked = r.Limit.Blocked
	if !r.Blocked {
		r.Policy = p
	} // else it blocks, as a rule's requests_per_unit: 0 does (p is a placeholder)
	return nil
}

// markDecided marks the results the store decides, and returns how many
// need their policy resolved (an override lookup each).
func (d *Decider) markDecided(res []Result, replaced map[string]bool) int {
	lookups := 0
	for i := range res {
		r := &res[i]
		switch {
		case r.Limit == nil, r.Limit.Unlimited && r.Policy == nil:
			continue
		case r.Limit.NameGiven && replaced[r.Limit.Name] && r.Policy == nil:
			// As envoyproxy/ratelimit: only a limit with a name given in
			// the file can be replaced.
			r.Replaced = true
			continue
		case r.Blocked && r.Policy == nil:
			continue
		}
		r.decide = true
		if r.Policy == nil {
			lookups++
		}
	}
	return lookups
}

// appendOps appends one operation per result the store decides.
func (d *Decider) appendOps(domain string, res []Result, ops []floodgate.Op) []floodgate.Op {
	for i := range res {
		r := &res[i]
		if !r.decide || r.Policy == nil {
			continue
		}
		kind := floodgate.OpAllow
		switch {
		case r.Refund:
			kind = floodgate.OpRefund
		case r.Hits == 0:
			kind = floodgate.OpPeek
		}
		r.Op = len(ops)
		r.Member = !r.Shadow && !r.Limit.QuotaMode && !r.Refund
		ops = append(ops, floodgate.Op{Policy: r.Policy, Key: StoreKey(domain, r.Key), Kind: kind, Cost: r.Hits})
	}
	return ops
}

// Refusing reports whether a blocked limit refuses the request whatever
// the store says (neither shadow nor quota mode).
func Refusing(res []Result) bool {
	for i := range res {
		if r := &res[i]; r.blockedOver() && !r.Shadow && !r.Limit.QuotaMode {
			return true
		}
	}
	return false
}

// Finish sets each result's Decision, Wait and Code from decs (decs[i]
// is the decision of the caller's ops[i]; a caller that moves an
// operation sets Op to its new index) at now (Unix µs). With decs nil,
// it finishes the blocked limits alone, which the store does not decide.
func (d *Decider) Finish(now int64, res []Result, decs []floodgate.Decision) {
	for i := range res {
		r := &res[i]
		switch {
		case r.blockedHere():
			finishBlocked(now, r)
		case r.Op >= 0 && decs != nil:
			finishDecided(now, r, &decs[r.Op])
		}
	}
}

// finishBlocked decides a blocked limit: over, unless it brings no hits.
func finishBlocked(now int64, r *Result) {
	ri := ruleOf(r.Limit.Policy, "")
	wait := ri.period // no wait helps; a fixed window's end is what the status says
	if ri.fixed {
		wait = windowLeft(now, ri.period)
		r.Wait = wait
	}
	over := r.blockedOver()
	r.Decision = floodgate.Decision{Allowed: !over, ResetAfter: wait, RetryAfter: wait, Rule: ri.name}
	if over {
		r.Decision.Reason = floodgate.ReasonLimited
	}
	r.Code = code(r, over)
}

// finishDecided reads the store's decision.
func finishDecided(now int64, r *Result, dec *floodgate.Decision) {
	r.Decision = *dec
	wait := dec.ResetAfter
	if !dec.Allowed && dec.RetryAfter > 0 {
		wait = dec.RetryAfter // else no wait helps (hits over the whole limit)
	}
	if wait <= 0 {
		if ri := ruleOf(r.Policy, dec.Rule); ri.fixed {
			// nothing counted yet, or no wait helps: a fixed window
			// still says when it ends, as envoyproxy/ratelimit does
			wait = windowLeft(now, ri.period)
		}
	}
	r.Wait = wait
	if dec.Allowed {
		r.Decision.ResetAfter = wait
	} else {
		r.Decision.RetryAfter = wait
	}
	r.Code = code(r, !dec.Allowed)
}

// code is the answer of a result over its limit or not: quota mode admits
// (and says so), shadow mode admits silently. A limit in shadow_mode too
// is OK before quota mode sees it, as in envoyproxy/ratelimit, whose
// limiter answers it OK.
func code(r *Result, over bool) Code {
	switch {
	case !over:
		return OK
	case r.Limit.QuotaMode && !r.Limit.ShadowMode:
		return QuotaViolation
	case r.Shadow:
		return OK
	}
	return Over
}

// Decide plans descs, asks store in one call (floodgate.DoGroup in an
// all_or_nothing domain: the descriptors that can refuse are admitted
// together or consume nothing; a blocked one refusing makes the others
// only checked) and finishes res.
func (d *Decider) Decide(ctx context.Context, store floodgate.Store, clk floodgate.Clock, cfg *rules.Config, domain string, descs []Descriptor, res []Result) error {
	var opBuf [4]floodgate.Op
	ops, err := d.Plan(ctx, cfg, domain, descs, res, opBuf[:0])
	if err != nil {
		return err
	}
	var group []bool
	if dom := cfg.Domain(domain); dom != nil && dom.AllOrNothing && len(ops) > 0 {
		group = groupOf(res, ops)
	}
	var decBuf [4]floodgate.Decision
	decs := decBuf[:0]
	now := clk.NowMicro()
	switch {
	case len(ops) == 0:
	case len(ops) == 1: // one store call, no batch to build
		dec, err := store.Do(ctx, now, ops[0])
		if err != nil {
			return err
		}
		decs = append(decs, dec)
	default:
		// The store keeps neither slice, but escape analysis cannot know
		// that through an interface: give it heap copies.
		batch, out := append([]floodgate.Op(nil), ops...), make([]floodgate.Decision, len(ops))
		if group != nil {
			_, err = floodgate.DoGroup(ctx, store, now, batch, group, out)
		} else {
			err = store.DoBatch(ctx, now, batch, out)
		}
		if err != nil {
			return err
		}
		decs = out
	}
	d.Finish(now, res, decs)
	return nil
}

// groupOf is the all-or-nothing group of an all_or_nothing domain's
// operations (nil for a plain batch: fewer than two members, or a blocked
// limit refusing, which makes every member a check).
func groupOf(res []Result, ops []floodgate.Op) []bool {
	refused := Refusing(res)
	members := 0
	group := make([]bool, len(ops))
	for i := range res {
		r := &res[i]
		if r.Op < 0 || !r.Member {
			continue
		}
		if refused && ops[r.Op].Kind == floodgate.OpAllow {
			ops[r.Op].Kind = floodgate.OpPeek
		}
		group[r.Op] = true
		members++
	}
	if refused || members < 2 {
		return nil
	}
	return group
}

// logOnce logs at most one line a second.
func (d *Decider) logOnce(msg string, args ...any) {
	now := time.Now().Unix()
	if last := d.lastLog.Load(); last != now && d.lastLog.CompareAndSwap(last, now) {
		d.opts.Logger.Warn(msg, args...)
	}
}

// ruleInfo is what Finish needs of a policy's rule.
type ruleInfo struct {
	name   string
	period time.Duration // 0 for a calendar window
	fixed  bool          // a fixed window aligned to the Unix epoch
}

type ruleInfoKey struct{}

// ruleOf returns p's rule named name (its first when none is), kept with
// the policy.
func ruleOf(p *floodgate.Policy, name string) ruleInfo {
	if p == nil {
		return ruleInfo{}
	}
	ris := storekit.Attached(p, ruleInfoKey{}, func() any {
		rs := p.Rules()
		out := make([]ruleInfo, len(rs))
		for i, r := range rs {
			out[i] = ruleInfo{name: r.Name, period: r.Period}
			if r.Calendar != "" {
				out[i].period = 0
			}
			out[i].fixed = r.Algorithm == floodgate.FixedWindow && out[i].period > 0
		}
		return out
	}).([]ruleInfo)
	for _, ri := range ris {
		if ri.name == name {
			return ri
		}
	}
	return ris[0]
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

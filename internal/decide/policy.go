package decide

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/rules"
)

// override looks up key's override within OverrideTimeout. After a failed
// lookup (the overrides' store down, say) it does not ask again for a
// second, so requests do not each pay the timeout: the rules decide.
func (d *Decider) override(ctx context.Context, domain, key string) (rules.Override, bool, error) {
	if t := d.overrideFailed.Load(); t != 0 && time.Since(time.Unix(0, t)) < time.Second {
		return rules.Override{}, false, nil
	}
	if k, ok := d.opts.Overrides.(interface{ MayHave(string) bool }); ok && !k.MayHave(domain) {
		return rules.Override{}, false, nil // no lookup, and no context for one
	}
	lctx := withLazyTimeout(ctx, d.opts.OverrideTimeout)
	o, ok, err := d.opts.Overrides.Lookup(lctx, domain, key)
	lctx.stop()
	if err != nil {
		d.overrideFailed.Store(time.Now().UnixNano())
	}
	return o, ok, err
}

// resolvePolicies sets the policy of each result the store decides that
// has none yet (n of them): its key's override applied to its limit, or
// the limit's own. Several lookups run at once, so that a request whose
// keys are not cached waits for one lookup's latency (a round trip to
// Redis), not one per descriptor.
func (d *Decider) resolvePolicies(ctx context.Context, domain string, res []Result, n int) {
	if n <= 1 || d.opts.Overrides == nil {
		for i := range res {
			if r := &res[i]; r.decide && r.Policy == nil {
				r.Policy = d.keyPolicy(ctx, domain, r.Limit, r.Key)
			}
		}
		return
	}
	// The goroutines get copies: a pointer into res would move every
	// request's results to the heap.
	type lookup struct {
		l   *rules.Limit
		key string
		p   *floodgate.Policy
	}
	ls := make([]lookup, 0, n)
	for i := range res {
		if r := &res[i]; r.decide && r.Policy == nil {
			ls = append(ls, lookup{l: r.Limit, key: r.Key})
		}
	}
	var wg sync.WaitGroup
	for j := range ls {
		wg.Go(func() { ls[j].p = d.keyPolicy(ctx, domain, ls[j].l, ls[j].key) })
	}
	wg.Wait()
	j := 0
	for i := range res {
		if r := &res[i]; r.decide && r.Policy == nil {
			r.Policy = ls[j].p
			j++
		}
	}
}

// keyPolicy returns the policy deciding key under l: the key's override
// applied to l's rules when there is one, else l's own policy. A failed
// lookup or an override that cannot apply leaves l's policy (logged).
func (d *Decider) keyPolicy(ctx context.Context, domain string, l *rules.Limit, key string) *floodgate.Policy {
	if d.opts.Overrides == nil {
		return l.Policy
	}
	o, ok, err := d.override(ctx, domain, key)
	if err != nil {
		d.logOnce("overrides: lookup failed; the rules decide meanwhile", "err", err)
		return l.Policy
	}
	if !ok {
		return l.Policy
	}
	p, err := d.overridePolicy(domain, l, o)
	if err != nil {
		d.logOnce("overrides: cannot apply an override; using the rule", "domain", domain, "key", key, "err", err)
		return l.Policy
	}
	return p
}

// KeyPolicy returns the policy deciding key (bounded) under l in domain:
// its override's, or l's.
func (d *Decider) KeyPolicy(ctx context.Context, domain string, l *rules.Limit, key string) *floodgate.Policy {
	return d.keyPolicy(ctx, domain, l, key)
}

// OverridePolicy returns the policy of an override of l in domain (see
// overridePolicy); the admin API moves a key's state onto it.
func (d *Decider) OverridePolicy(domain string, l *rules.Limit, o rules.Override) (*floodgate.Policy, error) {
	return d.overridePolicy(domain, l, o)
}

// overridePolicy builds (and caches) the policy of a per-key override: the
// matched limit's rules with one of them given the override's numbers —
// the rule whose window is the override's period when there is one (an
// override of 50 per second on "100 per second and 5 per hour" keeps the
// hourly rule), else the first rule. The other rules still apply.
func (d *Decider) overridePolicy(domain string, l *rules.Limit, o rules.Override) (*floodgate.Policy, error) {
	if l.Policy == nil {
		return nil, errors.New("the matched limit is unlimited")
	}
	sig := fmt.Sprintf("override|%s|%s|%d|%d|%d|%s", l.Policy.Name(), domain, o.Limit, o.Period, o.Burst, o.Algorithm)
	return d.cachedPolicy(sig, func() (*floodgate.Policy, error) {
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

// OwnLimit is a descriptor's own limit (Envoy's RateLimitOverride):
// RequestsPerUnit (0 blocks) per Multiplier Units.
type OwnLimit struct {
	RequestsPerUnit uint32
	Unit            time.Duration // 0: a unit the caller does not know, named UnitName
	UnitName        string
	Multiplier      uint32 // 0 or 1: one unit
}

// maxOwnLimits bounds the distinct own limits (requests_per_unit and
// window) callers may use: each is a policy, and a table of its own in the
// memory store, kept for good; beyond, a descriptor's own limit is ignored
// and the rules decide.
const maxOwnLimits = 4096

var errTooManyOwnLimits = fmt.Errorf("more than %d distinct own limits are in use", maxOwnLimits)

// MaxOwnWindow is the longest window a descriptor's own limit may ask for:
// a hundred years of 365 days (a multiplier beyond overflows a Duration).
const MaxOwnWindow = 100 * 365 * 24 * time.Hour

// ownPolicy builds (and caches) the policy of a descriptor's own limit.
func (d *Decider) ownPolicy(l *OwnLimit) (*floodgate.Policy, error) {
	w := l.Unit
	if w <= 0 {
		return nil, errors.New("unit " + l.UnitName) // (fmt would move every request's entries to the heap)
	}
	if m := int64(l.Multiplier); m > 1 {
		if m > int64(MaxOwnWindow/w) {
			return nil, fmt.Errorf("unit_multiplier %d: a window of %d × %v is more than %v", m, m, w, MaxOwnWindow)
		}
		w *= time.Duration(m)
	}
	rpu := max(l.RequestsPerUnit, 1) // 0 blocks: the caller does not ask the store (a placeholder)
	sig := fmt.Sprintf("request|%d|%d", rpu, w)
	d.mu.Lock()
	if _, seen := d.ownLimits[sig]; !seen {
		if len(d.ownLimits) >= maxOwnLimits {
			d.mu.Unlock()
			return nil, errTooManyOwnLimits
		}
		d.ownLimits[sig] = struct{}{}
	}
	d.mu.Unlock()
	return d.cachedPolicy(sig, func() (*floodgate.Policy, error) {
		return floodgate.NewPolicy(sig, floodgate.Rule{Name: fmt.Sprintf("%d/%s", rpu, w), Algorithm: floodgate.FixedWindow, Limit: int64(rpu), Period: w})
	})
}

type ownLimitKey struct {
	policy  string
	blocked bool
}

// ownLimit returns the limit standing for a descriptor's own limit of
// policy p (ownPolicy's), blocked for requests_per_unit 0: unnamed in
// the file, in no shadow or quota mode, replacing nothing. One per policy
// (at most maxOwnLimits of them), so that a cache keyed by limit (the
// service's headers) holds one entry per own limit rather than one per
// request.
func (d *Decider) ownLimit(p *floodgate.Policy, blocked bool) *rules.Limit {
	k := ownLimitKey{p.Name(), blocked}
	if v, ok := d.ownLimitL.Load(k); ok {
		return v.(*rules.Limit)
	}
	l := &rules.Limit{Name: p.Rules()[0].Name}
	if blocked {
		// the placeholder policy says the window to the headers
		l.Blocked, l.Policy, l.Window = true, p, p.Rules()[0].Period
	}
	v, _ := d.ownLimitL.LoadOrStore(k, l)
	return v.(*rules.Limit)
}

func (d *Decider) cachedPolicy(sig string, build func() (*floodgate.Policy, error)) (*floodgate.Policy, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if p, ok := d.policies[sig]; ok {
		return p, nil
	}
	p, err := build()
	if err != nil {
		return nil, err
	}
	if len(d.policies) >= maxPolicies {
		// One out, at random (a map's order is): clearing them all made
		// every request rebuild its policy while more than maxPolicies
		// override number sets were in use (20,000 took decisions to
		// about 1,300 a second).
		for k := range d.policies {
			delete(d.policies, k)
			break
		}
	}
	d.policies[sig] = p
	return p, nil
}

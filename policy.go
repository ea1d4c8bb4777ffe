package floodgate

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/floodgate/floodgate/internal/algo"
	"github.com/floodgate/floodgate/internal/compiled"
)

// A Policy is the set of rules applied to one key together, all or
// nothing: a request is admitted only if every rule admits it, and a denied
// request consumes nothing from any rule. Policies are immutable; WithLimit
// returns a new version.
//
// The policy's name identifies its state in a store: two versions of a
// policy with one name (say, before and after a limit change) share each
// key's state, matched rule by rule by rule name. The in-memory store
// decides under the newest version it has seen (the one created last), for
// callers of the older one too; the Redis store decides each call under
// the caller's version, converting the key's state when versions
// alternate. So two different live policies must not share a name: on the
// memory store the newer one's limits would apply to both (a strict login
// limit loosened by a lax one of its name), which it logs as a warning.
type Policy struct {
	name    string
	rules   []Rule
	elastic uint64 // bit i: rule i is elastic
	c       compiled.Policy
}

func init() {
	compiled.Of = func(p *Policy) *compiled.Policy { return &p.c }
}

var policySeq atomic.Uint64

// NewPolicy validates and compiles rules into a policy named name. An
// empty name gives the policy a unique name of its own, so its state is
// never shared.
func NewPolicy(name string, rules ...Rule) (*Policy, error) {
	if len(rules) == 0 {
		return nil, &RuleError{Field: "rules", Msg: "a policy needs at least one rule"}
	}
	if len(rules) > algo.MaxRules {
		return nil, &RuleError{Rule: fmt.Sprintf("rules[%d]", algo.MaxRules), Field: "rules", Msg: fmt.Sprintf("a policy holds at most %d rules", algo.MaxRules)}
	}
	p := &Policy{name: name, c: compiled.Policy{Version: policySeq.Add(1)}}
	if p.name == "" {
		p.name = fmt.Sprintf("policy#%d", p.c.Version)
	}
	seen := make(map[string]bool, len(rules))
	for i, r := range rules {
		if r.Name == "" {
			r.Name = r.defaultName()
		}
		if seen[r.Name] {
			return nil, &RuleError{Rule: fmt.Sprintf("rules[%d]", i), Field: "name", Msg: fmt.Sprintf("duplicate rule name %q", r.Name)}
		}
		seen[r.Name] = true
		ap, err := r.compile(r.Name)
		if err != nil {
			return nil, err
		}
		ap.Off = p.c.Width
		p.c.Width += ap.Width
		if ap.Elastic > 0 {
			p.elastic |= 1 << i
		}
		p.rules = append(p.rules, r)
		p.c.Tiered = p.c.Tiered || r.Tier != TierExact && r.Tier != ""
		p.c.Params = append(p.c.Params, ap)
		p.c.Names = append(p.c.Names, r.Name)
	}
	return p, nil
}

// MustPolicy is NewPolicy that panics on an invalid rule, for rules fixed
// in the program's source.
func MustPolicy(name string, rules ...Rule) *Policy {
	p, err := NewPolicy(name, rules...)
	if err != nil {
		panic(err)
	}
	return p
}

// Name returns the policy's name.
func (p *Policy) Name() string { return p.name }

// Rules returns a copy of the policy's rules, names filled in.
func (p *Policy) Rules() []Rule { return append([]Rule(nil), p.rules...) }

// CanDelay reports whether a request over p's limit can be delayed rather
// than refused: whether some rule of p is a bucket (token bucket, either
// refill, leaky bucket, its shaper, GCRA), which lends capacity that frees
// later to Reserve and Wait. Window rules only ever admit now, so a delay
// action on a policy of windows alone would refuse every request it meant
// to delay.
func (p *Policy) CanDelay() bool {
	for i := range p.c.Params {
		if p.c.Params[i].Reservable() {
			return true
		}
	}
	return false
}

// WithLimit returns a new version of the policy with rule's limit (and its
// burst, when the burst was the limit) set to limit. Stores keep what each
// key has consumed, in requests, clamped to the new capacity.
func (p *Policy) WithLimit(rule string, limit int64) (*Policy, error) {
	rules := p.Rules()
	found := false
	for i := range rules {
		if rules[i].Name == rule {
			if rules[i].Burst == rules[i].Limit {
				rules[i].Burst = 0
			}
			rules[i].Limit = limit
			found = true
		}
	}
	if !found {
		return nil, &RuleError{Rule: rule, Field: "name", Msg: fmt.Sprintf("policy %q has no such rule", p.name)}
	}
	return NewPolicy(p.name, rules...)
}

// spare evaluates the elastic rules' signals.
func (p *Policy) spare() uint64 {
	if p.elastic == 0 {
		return 0
	}
	var m uint64
	for i := range p.rules {
		if p.elastic&(1<<i) != 0 && p.rules[i].Spare() {
			m |= 1 << i
		}
	}
	return m
}

// Op returns an operation on key under p, with its elastic rules' signals
// evaluated now. Callers that compose their own batches (several policies
// on one store, decided in one Store.DoBatch) build them with Op.
func (p *Policy) Op(kind OpKind, key string, cost int64, maxDelay time.Duration) Op {
	op := Op{Policy: p, Key: key, Kind: kind, Cost: cost, MaxDelay: maxDelay}
	if p.elastic != 0 {
		op.Spare = p.spare()
	}
	return op
}

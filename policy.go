package floodgate

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/floodgate/floodgate/internal/algo"
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
	params  []algo.Params
	width   int
	elastic uint64 // bit i: rule i is elastic
	seq     uint64
	// attached is what stores keep about the policy (Attached)
	attached sync.Map
}

// Attached returns the value kept with p under key (a store's own, say its
// prepared call arguments for p), made by build the first time it is
// asked for. The value lives as long as p does: a store keeps nothing per
// policy in a map of its own, which every reload of the rules (new policy
// objects) would grow. build may run more than once for one key when
// callers race; one of its values is kept.
func (p *Policy) Attached(key any, build func() any) any {
	if v, ok := p.attached.Load(key); ok {
		return v
	}
	v, _ := p.attached.LoadOrStore(key, build())
	return v
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
	p := &Policy{name: name, seq: policySeq.Add(1)}
	if p.name == "" {
		p.name = fmt.Sprintf("policy#%d", p.seq)
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
		ap.Off = p.width
		p.width += ap.Width
		if ap.Elastic > 0 {
			p.elastic |= 1 << i
		}
		p.rules = append(p.rules, r)
		p.params = append(p.params, ap)
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

// Version orders versions of policies: a later NewPolicy or WithLimit
// returns a larger version.
func (p *Policy) Version() uint64 { return p.seq }

// Compiled returns the policy's compiled rules, for the stores of this
// module that run the math elsewhere (the Redis store's Lua). Its element
// type is internal: other packages cannot use it.
func (p *Policy) Compiled() []algo.Params { return p.params }

// CanDelay reports whether a request over p's limit can be delayed rather
// than refused: whether some rule of p is a bucket (token bucket, either
// refill, leaky bucket, its shaper, GCRA), which lends capacity that frees
// later to Reserve and Wait. Window rules only ever admit now, so a delay
// action on a policy of windows alone would refuse every request it meant
// to delay.
func (p *Policy) CanDelay() bool {
	for i := range p.params {
		if p.params[i].Reservable() {
			return true
		}
	}
	return false
}

// Width is the number of int64 state words a key of this policy needs.
func (p *Policy) Width() int { return p.width }

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

// Apply performs op on one key's state (Width words, all zero for a key
// never seen) at now, microseconds since the epoch, and returns the
// decision. It is the whole algorithm: a store keeps the words and calls
// Apply under whatever makes the key's update atomic.
func (p *Policy) Apply(state []int64, now int64, op Op) Decision {
	var d Decision
	p.ApplyTo(state, now, &op, &d)
	return d
}

// ApplyTo is Apply writing the decision into *d, for stores on the hot
// path (it copies no large values).
func (p *Policy) ApplyTo(state []int64, now int64, op *Op, d *Decision) {
	var maxDelay int64
	if op.Kind == OpReserve {
		maxDelay = op.MaxDelay.Microseconds()
	}
	var r algo.Result
	algo.ApplyTo(p.params, state[:p.width], now, algo.Op(op.Kind), op.Cost, maxDelay, op.Spare, &r)
	d.Allowed = r.Allowed
	d.Limit = r.Limit
	d.Remaining = r.Remaining
	d.ResetAfter = time.Duration(r.ResetAfter) * time.Microsecond
	d.RetryAfter = time.Duration(r.RetryAfter) * time.Microsecond
	d.Delay = time.Duration(r.Delay) * time.Microsecond
	d.Rule = p.rules[r.Rule].Name
	d.Excess = r.Excess
	d.Degraded = false
	switch {
	case r.TooLarge:
		d.Reason = ReasonCostTooLarge
	case !r.Allowed:
		d.Reason = ReasonLimited
	default:
		d.Reason = ReasonNone
	}
}

// Consumption reports how much of its capacity a key's most constrained
// rule has used, in thousandths, advancing the state to now; 0 means the
// state is fresh and may be dropped without changing any decision. Stores
// use it to expire idle keys and to evict the least consumed keys first.
func (p *Policy) Consumption(state []int64, now int64) int64 {
	return algo.Consumption(p.params, state[:p.width], now)
}

// ValidState reports whether state is one p's rules can be decided on:
// every rule's indexes within its ring, counts and levels not negative nor
// absurdly large, times within the next two thousand years. Every state
// the engine writes is valid; a store reading states from outside (a
// snapshot file) checks them, since an invalid one, from a damaged file,
// could index out of range.
func (p *Policy) ValidState(state []int64) bool {
	if len(state) < p.width {
		return false
	}
	for i := range p.params {
		q := &p.params[i]
		if !algo.Valid(q, state[q.Off:q.Off+q.Width]) {
			return false
		}
	}
	return true
}

// Migrate converts a key's state from policy from (another version of p)
// to p, rule by rule matched by name, keeping what each rule consumed in
// requests, clamped to the new capacity. Rules new to p start fresh.
func (p *Policy) Migrate(from *Policy, old []int64, state []int64, now int64) {
	clear(state[:p.width])
	for i := range p.params {
		for j := range from.params {
			if from.rules[j].Name == p.rules[i].Name {
				np, op := &p.params[i], &from.params[j]
				algo.Convert(op, old[op.Off:op.Off+op.Width], np, state[np.Off:np.Off+np.Width], now)
			}
		}
	}
}

// MigrateOnto is Migrate onto a key's state under p that may already hold
// requests (a key decided under p while its state was being carried to
// it): what state had consumed is kept and added, rule by rule, to what is
// carried from old, as consumed now, clamped to each rule's capacity.
// Movers use it, so that a request decided under p in the moment before
// the move is not lost. A fresh state makes it Migrate.
func (p *Policy) MigrateOnto(from *Policy, old []int64, state []int64, now int64) {
	carried := make([]int64, p.width)
	p.Migrate(from, old, carried, now)
	for i := range p.params {
		np := &p.params[i]
		had, dst := state[np.Off:np.Off+np.Width], carried[np.Off:np.Off+np.Width]
		used := algo.Used(np, had, algo.Advance(np, had, now))
		if used == 0 {
			continue
		}
		t := algo.Advance(np, dst, now)
		if np.Bucket() { // levels add exactly, fractions of a request too
			dst[0] = min(dst[0]+had[0], np.MaxCeiling()*np.Unit)
			continue
		}
		if room := np.MaxCeiling() - algo.Used(np, dst, t); room > 0 {
			algo.Commit(np, dst, t, min(used, room))
		}
	}
	copy(state[:p.width], carried)
}

// SameLayout reports whether keys of p and q have interchangeable state:
// the same rules with the same parameters.
func (p *Policy) SameLayout(q *Policy) bool {
	if len(p.params) != len(q.params) {
		return false
	}
	for i := range p.params {
		a, b := p.params[i], q.params[i]
		if p.rules[i].Name != q.rules[i].Name || a.Kind != b.Kind || a.Limit != b.Limit || a.Period != b.Period ||
			a.Burst != b.Burst || a.Gran != b.Gran || a.Cal != b.Cal || a.Loc != b.Loc || a.WeekDay0 != b.WeekDay0 ||
			a.Soft != b.Soft || a.Elastic != b.Elastic || a.CountRejected != b.CountRejected {
			return false
		}
	}
	return true
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

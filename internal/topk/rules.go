package topk

import (
	"cmp"
	"slices"
	"sync"
	"sync/atomic"
)

// RuleID names a rule: its domain and name.
type RuleID struct{ Domain, Rule string }

// RuleTop is a rule's most counted keys.
type RuleTop struct {
	RuleID
	Keys []Entry[struct{}]
}

// Rules keeps a summary of keys per rule, safe for concurrent use: at
// most maxRules rules (a rule first counted beyond them is not), each a
// summary of slots keys. Counting takes the rule's lock only.
type Rules struct {
	slots, maxRules int
	rules           sync.Map // RuleID → *ruleSummary
	n               atomic.Int64
}

type ruleSummary struct {
	mu   sync.Mutex
	keys *Summary
}

// NewRules returns an empty set of per-rule summaries.
func NewRules(slots, maxRules int) *Rules { return &Rules{slots: slots, maxRules: maxRules} }

// Add counts one occurrence of key under rule id.
func (r *Rules) Add(id RuleID, key string) {
	v, ok := r.rules.Load(id)
	if !ok {
		if r.n.Add(1) > int64(r.maxRules) {
			r.n.Add(-1)
			return
		}
		var loaded bool
		if v, loaded = r.rules.LoadOrStore(id, &ruleSummary{keys: New(r.slots)}); loaded {
			r.n.Add(-1)
		}
	}
	s := v.(*ruleSummary)
	s.mu.Lock()
	s.keys.Add(key, 1)
	s.mu.Unlock()
}

// Prune drops the rules keep refuses (those a reload removed).
func (r *Rules) Prune(keep func(RuleID) bool) {
	r.rules.Range(func(k, _ any) bool {
		if !keep(k.(RuleID)) {
			if _, loaded := r.rules.LoadAndDelete(k); loaded {
				r.n.Add(-1)
			}
		}
		return true
	})
}

// Top returns the n most counted keys of each rule match accepts, by
// domain then rule.
func (r *Rules) Top(match func(RuleID) bool, n int) []RuleTop {
	var out []RuleTop
	r.rules.Range(func(k, v any) bool {
		id := k.(RuleID)
		if match != nil && !match(id) {
			return true
		}
		s := v.(*ruleSummary)
		s.mu.Lock()
		top := s.keys.Top(n)
		s.mu.Unlock()
		out = append(out, RuleTop{RuleID: id, Keys: top})
		return true
	})
	slices.SortFunc(out, func(a, b RuleTop) int {
		return cmp.Or(cmp.Compare(a.Domain, b.Domain), cmp.Compare(a.Rule, b.Rule))
	})
	return out
}

package service

import (
	"cmp"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/floodgate/floodgate/internal/topk"
	"github.com/floodgate/floodgate/rules"
)

// Bounds of the top limited keys (GET /v1/top): each rule keeps a
// Space-Saving summary (internal/topk) of LimitedSlots keys, of which at
// most MaxTopKeys are reported, and at most LimitedRules rules are tracked
// at once (a rule first limited beyond them is not; a reload drops the
// rules no longer live). A key is the store key after the domain, at most
// MaxKeyBytes: the worst case is some LimitedRules × LimitedSlots × 1 KiB
// (64 MiB), a few hundred kilobytes with keys of tens of bytes.
const (
	LimitedSlots = 256
	LimitedRules = 256
	MaxTopKeys   = 100
)

// limitedKeys are the keys most often decided over their limit, per rule:
// refused, or, in shadow or quota mode, that would have been.
type limitedKeys struct {
	rules sync.Map // ruleID → *limitedRule
	n     atomic.Int64
}

// ruleID names a rule: its domain, and its name as GET /v1/rules shows it.
type ruleID struct{ domain, rule string }

type limitedRule struct {
	mu   sync.Mutex
	keys *topk.Summary
}

// add counts one decision of rule over its limit for key.
func (lk *limitedKeys) add(domain, rule, key string) {
	id := ruleID{domain, rule}
	v, ok := lk.rules.Load(id)
	if !ok {
		if lk.n.Add(1) > LimitedRules {
			lk.n.Add(-1)
			return
		}
		var loaded bool
		if v, loaded = lk.rules.LoadOrStore(id, &limitedRule{keys: topk.New(LimitedSlots)}); loaded {
			lk.n.Add(-1)
		}
	}
	r := v.(*limitedRule)
	r.mu.Lock()
	r.keys.Add(key, 1)
	r.mu.Unlock()
}

// prune drops the rules that cfg no longer holds (a reload).
func (lk *limitedKeys) prune(cfg *rules.Config) {
	lk.rules.Range(func(k, _ any) bool {
		id := k.(ruleID)
		if id.rule != requestLimitRule && !hasRule(cfg, id) {
			lk.rules.Delete(k)
			lk.n.Add(-1)
		}
		return true
	})
}

func hasRule(cfg *rules.Config, id ruleID) bool {
	d := cfg.Domain(id.domain)
	if d == nil {
		return false
	}
	for _, l := range d.Limits() {
		if l.Name == id.rule {
			return true
		}
	}
	return false
}

// TopKey is a key in GET /v1/top's answer: how many of its decisions were
// over the limit (an estimate never below the true count) and by how much
// that may overstate them.
type TopKey struct {
	Key   string `json:"key"`
	Count uint64 `json:"count"`
	Error uint64 `json:"error"`
}

// TopRule is a rule's top limited keys.
type TopRule struct {
	Domain string   `json:"domain"`
	Rule   string   `json:"rule"`
	Keys   []TopKey `json:"keys"`
}

// top returns the n keys most often over the limit of each rule matching
// domain and rule ("" matches any), by domain and rule.
func (lk *limitedKeys) top(domain, rule string, n int) []TopRule {
	out := []TopRule{}
	lk.rules.Range(func(k, v any) bool {
		id := k.(ruleID)
		if (domain != "" && id.domain != domain) || (rule != "" && id.rule != rule) {
			return true
		}
		r := v.(*limitedRule)
		r.mu.Lock()
		top := r.keys.Top(n)
		r.mu.Unlock()
		tr := TopRule{Domain: id.domain, Rule: id.rule, Keys: make([]TopKey, len(top))}
		for i, e := range top {
			tr.Keys[i] = TopKey{Key: e.Key, Count: e.Count, Error: e.Error}
		}
		out = append(out, tr)
		return true
	})
	slices.SortFunc(out, func(a, b TopRule) int {
		return cmp.Or(cmp.Compare(a.Domain, b.Domain), cmp.Compare(a.Rule, b.Rule))
	})
	return out
}

// TopLimited returns the n keys (1 to MaxTopKeys) most often decided over
// the limit of each rule matching domain and rule ("" matches any): see
// GET /v1/top.
func (s *Service) TopLimited(domain, rule string, n int) []TopRule {
	return s.limited.top(domain, rule, min(max(n, 1), MaxTopKeys))
}

// adminTop serves GET /v1/top?domain=D&rule=R&n=N: the n (default 10, 1
// to MaxTopKeys; another value is a 400 naming n) keys most often over
// the limit of each rule, as
//
//	{"rules":[{"domain":"d","rule":"r","keys":[{"key":"k","count":N,"error":E}]}]}
//
// by domain then rule, each rule's keys the most counted first. A rule is
// named as GET /v1/rules names its limit ("name"): the rate_limit's name
// when it has one, else the descriptor path as envoyproxy/ratelimit names
// its statistics ("domain.key_value.key2"); a request's own limits
// (--allow-request-limits) are "_request_limit". A key is the store key
// after the domain ("key=value|key2=value2", as POST /v1/keys/inspect
// shows it). Count is an estimate that never understates the decisions of
// the key over the limit (refused, or, in shadow or quota mode, that would
// have been), and overstates them by at most Error. domain and rule
// filter (exact match); either may be left out.
func (s *Service) adminTop(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	n := 10
	if v := q.Get("n"); v != "" {
		var err error
		n, err = strconv.Atoi(v)
		if err != nil || n < 1 || n > MaxTopKeys {
			httpError(w, http.StatusBadRequest, "n: want 1 to %d keys a rule, got %q", MaxTopKeys, v)
			return
		}
	}
	writeJSON(w, map[string]any{"rules": s.TopLimited(q.Get("domain"), q.Get("rule"), n)})
}

package service

import (
	"net/http"
	"strconv"

	"github.com/floodgate/floodgate/internal/topk"
	"github.com/floodgate/floodgate/rules"
)

// Bounds of the top limited keys (GET /v1/top): each rule keeps a
// Space-Saving summary (internal/topk) of LimitedSlots keys, of which at
// most MaxTopKeys are reported, and at most LimitedRules rules are tracked
// at once (a rule first limited beyond them is not; a reload drops the
// rules no longer live). A key is the store key after the domain, at most
// MaxKeyBytes: the worst case is some LimitedRules × LimitedSlots × 1 KiB
// (64 MiB), a few megabytes with keys of tens of bytes. 1,024 slots, ten
// times the most keys reported, find the true top 100 of a flat Zipf
// stream over a million keys where 256 found 40–57 % (docs/BENCHMARKS.md,
// "Heavy hitters").
const (
	LimitedSlots = 1024
	LimitedRules = 64
	MaxTopKeys   = 100
)

// newLimited returns the summaries of the top limited keys.
func newLimited() *topk.Rules { return topk.NewRules(LimitedSlots, LimitedRules) }

// pruneLimited drops the rules that cfg no longer holds (a reload).
func pruneLimited(lk *topk.Rules, cfg *rules.Config) {
	lk.Prune(func(id topk.RuleID) bool { return id.Rule == requestLimitRule || hasRule(cfg, id) })
}

func hasRule(cfg *rules.Config, id topk.RuleID) bool {
	d := cfg.Domain(id.Domain)
	if d == nil {
		return false
	}
	for _, l := range d.Limits() {
		if l.Name == id.Rule {
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

// TopRules converts per-rule summaries into GET /v1/top's rules: the n
// keys of each rule matching domain and rule ("" matches any).
func TopRules(lk *topk.Rules, domain, rule string, n int) []TopRule {
	out := []TopRule{}
	for _, rt := range lk.Top(func(id topk.RuleID) bool {
		return (domain == "" || id.Domain == domain) && (rule == "" || id.Rule == rule)
	}, n) {
		tr := TopRule{Domain: rt.Domain, Rule: rt.Rule, Keys: make([]TopKey, len(rt.Keys))}
		for i, e := range rt.Keys {
			tr.Keys[i] = TopKey{Key: e.Key, Count: e.Count, Error: e.Error}
		}
		out = append(out, tr)
	}
	return out
}

// TopLimited returns the n keys (1 to MaxTopKeys) most often decided over
// the limit of each rule matching domain and rule ("" matches any): see
// GET /v1/top.
func (s *Service) TopLimited(domain, rule string, n int) []TopRule {
	return TopRules(s.limited, domain, rule, min(max(n, 1), MaxTopKeys))
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

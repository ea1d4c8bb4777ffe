package service

import (
	"slices"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/ratehdr"
	"github.com/floodgate/floodgate/rules"
)

// The header that marks a request let past a soft limit (a rule in mode:
// soft admitted it beyond its requests_per_unit, within soft_percent), and
// its value: the middleware's (gate.HeaderWarning) in the response Envoy
// sends downstream.
const (
	HeaderWarning = "Floodgate-Warning"
	WarningValue  = "soft limit exceeded"
)

// softCrossed reports whether d admitted a request past its rule's soft
// line: a soft (or elastic) limit's warning, the "warned" outcome.
func softCrossed(d *floodgate.Decision) bool { return d.Allowed && d.Excess }

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

// headerFor returns what the headers say of limit l decided under policy
// p, cached.
func (s *Service) headerFor(l *rules.Limit, p *floodgate.Policy) *policyHeader {
	k := policyHeaderKey{l, p}
	if v, ok := s.policyHeaders.Load(k); ok {
		return v.(*policyHeader)
	}
	rs := p.Rules()
	ph := &policyHeader{rules: make([]ruleHeader, len(rs))}
	items := make([]string, len(rs))
	for i, r := range rs {
		name := r.Name
		if len(rs) == 1 && l != nil && l.Name != "" {
			name = l.Name
		}
		rh := ruleHeader{rule: r.Name, name: sfString(name), window: ratehdr.Window(r), period: r.Period}
		if r.Calendar != "" {
			rh.period = 0
		}
		rh.fixed = r.Algorithm == floodgate.FixedWindow && rh.period > 0
		ph.rules[i] = rh
		q, w := ratehdr.Quota(r)
		if l != nil && l.Blocked {
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

package refmodel

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
)

// coverage counts what the random traces exercised, so that a change to the
// generators cannot quietly leave an algorithm or an outcome untested.
type coverage struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *coverage) add(keys ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	for _, k := range keys {
		c.n[k]++
	}
}

// label names a rule's algorithm variant.
func label(s Spec) string {
	l := s.Kind.String()
	switch {
	case s.Cal != CalNone:
		l += "/" + [...]string{"", "day", "week", "month"}[s.Cal]
	case s.CountRejected:
		l += "/count_rejected"
	}
	return l
}

var allLabels = []string{
	"token_bucket", "token_bucket/interval", "leaky_bucket", "leaky_bucket_shaper", "gcra",
	"fixed_window", "fixed_window/day", "fixed_window/week", "fixed_window/month",
	"sliding_log", "sliding_log/count_rejected", "sliding_window", "sliding_subwindow",
}

// record counts a decision by its deciding rule.
func (c *coverage) record(specs []Spec, op Op, d Decision) {
	s := specs[d.Rule]
	l := label(s)
	var keys []string
	switch {
	case d.Reason == ReasonCostTooLarge:
		keys = append(keys, l+" too_large")
	case !d.Allowed:
		keys = append(keys, l+" limited")
	case op == Allow || op == Reserve:
		keys = append(keys, l+" admitted")
	}
	if d.Excess {
		switch {
		case s.SoftPercent > 0:
			keys = append(keys, "excess soft")
		case s.ElasticCeiling > 0:
			keys = append(keys, "excess elastic")
		}
	}
	if d.Delay > 0 {
		keys = append(keys, "reserve delayed")
	}
	if !d.Allowed && d.Reason == ReasonLimited && d.RetryAfter > 0 && op == Reserve {
		keys = append(keys, "reserve denied")
	}
	c.add(keys...)
}

// check fails t unless every algorithm was admitted, limited and found too
// large at least once, and the modes and reservations were exercised.
func (c *coverage) check(t *testing.T) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var want []string
	for _, l := range allLabels {
		want = append(want, l+" admitted", l+" limited", l+" too_large")
	}
	want = append(want, "excess soft", "excess elastic", "reserve delayed", "reserve denied")
	var missing []string
	for _, k := range want {
		if c.n[k] == 0 {
			missing = append(missing, k)
		}
	}
	if len(missing) > 0 && !t.Failed() {
		t.Errorf("the random traces never exercised: %s", strings.Join(missing, ", "))
	}
	if testing.Verbose() {
		keys := make([]string, 0, len(c.n))
		for k := range c.n {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var b strings.Builder
		for _, k := range keys {
			fmt.Fprintf(&b, "  %-40s %d\n", k, c.n[k])
		}
		t.Logf("coverage:\n%s", b.String())
	}
}

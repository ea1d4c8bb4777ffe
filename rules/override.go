package rules

import (
	"context"
	"time"

	"github.com/floodgate/floodgate"
)

// An Override gives one key of a domain its own numbers, in place of one
// rule of its matched limit.
type Override struct {
	Limit     int64
	Period    time.Duration
	Burst     int64               // 0: Limit
	Algorithm floodgate.Algorithm // "": the rule's
}

// Apply returns r with the override's numbers (and algorithm, if it has
// one), dropping what no longer applies to it.
func (o Override) Apply(r floodgate.Rule) floodgate.Rule {
	r.Limit, r.Period, r.Burst = o.Limit, o.Period, o.Burst
	r.Calendar, r.Location, r.WeekStart = "", nil, 0
	if o.Algorithm != "" {
		r.Algorithm = o.Algorithm
	}
	if r.Algorithm != floodgate.TokenBucket && r.Algorithm != "" {
		r.Refill = ""
	}
	if r.Algorithm != floodgate.SlidingSubwindow {
		r.Granularity = 0
	}
	if r.Algorithm != floodgate.SlidingLog {
		r.CountRejected = false
	}
	return r
}

// Overrides finds per-key overrides of a rules file's limits (package overrides
// adapts its stores: overrides.Lookup). It may also have a MayHave(domain string) bool
// method, false when domain has none: then no lookup is made.
type Overrides interface {
	// Lookup returns key's override in domain, and whether there is one.
	Lookup(ctx context.Context, domain, key string) (Override, bool, error)
}

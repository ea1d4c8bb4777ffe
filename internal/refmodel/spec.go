package refmodel

import (
	"fmt"
	"strings"
	"time"
)

// Kind is an algorithm.
type Kind int

// The algorithms.
const (
	TokenBucket         Kind = iota + 1 // continuous refill
	TokenBucketInterval                 // Limit tokens at the end of each refill period
	LeakyMeter                          // leaky bucket as a meter
	LeakyShaper                         // leaky bucket as a queue
	GCRA                                // generic cell rate algorithm
	FixedWindow                         // epoch-aligned or calendar windows
	SlidingLog                          // exact log
	SlidingWindow                       // sliding window counter
	SlidingSubwindow                    // ring of sub-window counters
)

var kindNames = map[Kind]string{
	TokenBucket: "token_bucket", TokenBucketInterval: "token_bucket/interval",
	LeakyMeter: "leaky_bucket", LeakyShaper: "leaky_bucket_shaper", GCRA: "gcra",
	FixedWindow: "fixed_window", SlidingLog: "sliding_log", SlidingWindow: "sliding_window",
	SlidingSubwindow: "sliding_subwindow",
}

func (k Kind) String() string { return kindNames[k] }

// Calendar is a calendar alignment of a fixed window.
type Calendar int

// Calendar units.
const (
	CalNone Calendar = iota
	CalDay
	CalWeek
	CalMonth
)

// Spec is one rule as the model sees it.
type Spec struct {
	Kind   Kind
	Limit  int64 // L
	Period int64 // P in microseconds; unused by calendar windows
	Burst  int64 // B for buckets; 0 means Limit

	Gran int64 // SlidingSubwindow: sub-window length G (divides Period)

	Cal       Calendar
	Loc       *time.Location
	WeekStart time.Weekday

	CountRejected bool // SlidingLog

	SoftPercent    int64 // > 0: soft mode
	ElasticCeiling int64 // > 0: elastic mode
}

// B is the rule's base capacity: the burst of a bucket, else the limit.
func (s *Spec) B() int64 {
	if s.Burst > 0 {
		return s.Burst
	}
	return s.Limit
}

// Soft is the soft-mode ceiling B + B*pct/100, at least B+1; 0 when hard.
func (s *Spec) Soft() int64 {
	if s.SoftPercent <= 0 {
		return 0
	}
	b := s.B()
	return max(b+b*s.SoftPercent/100, b+1)
}

// Ceiling is the capacity that applies to a request.
func (s *Spec) Ceiling(spare bool) int64 {
	switch {
	case s.SoftPercent > 0:
		return s.Soft()
	case s.ElasticCeiling > 0 && spare:
		return s.ElasticCeiling
	}
	return s.B()
}

// MaxCeiling is the largest capacity the rule ever applies.
func (s *Spec) MaxCeiling() int64 { return max(s.B(), s.Soft(), s.ElasticCeiling) }

// Elastic reports whether the rule's ceiling depends on a spare signal.
func (s *Spec) Elastic() bool { return s.ElasticCeiling > 0 }

// reservable reports whether the rule can lend capacity that frees later.
func (s *Spec) reservable() bool {
	switch s.Kind {
	case TokenBucket, TokenBucketInterval, LeakyMeter, LeakyShaper, GCRA:
		return true
	}
	return false
}

func (s Spec) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%v L=%d", s.Kind, s.Limit)
	switch {
	case s.Cal != CalNone:
		fmt.Fprintf(&b, " cal=%s loc=%v weekstart=%v", [...]string{"", "day", "week", "month"}[s.Cal], s.Loc, s.WeekStart)
	default:
		fmt.Fprintf(&b, " P=%dus", s.Period)
	}
	if s.Burst > 0 {
		fmt.Fprintf(&b, " B=%d", s.Burst)
	}
	if s.Gran > 0 {
		fmt.Fprintf(&b, " G=%dus", s.Gran)
	}
	if s.CountRejected {
		b.WriteString(" count_rejected")
	}
	if s.SoftPercent > 0 {
		fmt.Fprintf(&b, " soft=%d%%(ceil %d)", s.SoftPercent, s.Soft())
	}
	if s.ElasticCeiling > 0 {
		fmt.Fprintf(&b, " elastic=%d", s.ElasticCeiling)
	}
	return b.String()
}

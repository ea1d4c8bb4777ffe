package floodgate

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/floodgate/floodgate/internal/algo"
)

// Algorithm names a limiting algorithm. The names are the ones used in
// configuration files.
type Algorithm string

// The algorithms. docs/ALGORITHMS.md defines each one's decisions exactly.
const (
	// TokenBucket holds Burst tokens, starts full, and refills Limit tokens
	// per Period: continuously by default, or all at once at the end of each
	// period with Refill set to RefillInterval.
	TokenBucket Algorithm = "token_bucket"
	// LeakyBucket is the leaky bucket as a meter: each request pours its
	// cost into a bucket of Burst that leaks Limit per Period; a request that
	// would overflow is denied. It decides exactly as TokenBucket does.
	LeakyBucket Algorithm = "leaky_bucket"
	// LeakyBucketShaper is the leaky bucket as a queue with a fixed outflow
	// of Limit per Period and room for Burst waiting requests: Wait queues a
	// request and returns when its turn to leave comes; Allow admits only
	// when the queue is empty; a request that finds the queue full is denied.
	LeakyBucketShaper Algorithm = "leaky_bucket_shaper"
	// GCRA is the generic cell rate algorithm (a theoretical arrival time
	// per key); it decides exactly as TokenBucket does.
	GCRA Algorithm = "gcra"
	// FixedWindow counts requests per window of Period aligned to the Unix
	// epoch, or per calendar day, week or month in a time zone.
	FixedWindow Algorithm = "fixed_window"
	// SlidingLog keeps the time of every admitted request and admits while
	// fewer than Limit fall in the last Period. Exact; its memory is one
	// word per request in the window, so Limit is capped at 10,000.
	SlidingLog Algorithm = "sliding_log"
	// SlidingWindow is the sliding window counter: the current window's
	// count plus the previous window's weighted by how much of it the
	// sliding window still overlaps, rounded down.
	SlidingWindow Algorithm = "sliding_window"
	// SlidingSubwindow counts requests per sub-window of Granularity and
	// admits while the last Period/Granularity sub-windows hold fewer than
	// Limit.
	SlidingSubwindow Algorithm = "sliding_subwindow"
)

// Refill is how a token bucket refills.
type Refill string

// Refill styles.
const (
	RefillContinuous Refill = "continuous" // Limit/Period tokens each instant (default)
	RefillInterval   Refill = "interval"   // Limit tokens at the end of each period
)

// Calendar aligns fixed windows to the calendar in Rule.Location.
type Calendar string

// Calendar units.
const (
	CalendarDay   Calendar = "day"   // from midnight to midnight
	CalendarWeek  Calendar = "week"  // from midnight of Rule.WeekStart for 7 days
	CalendarMonth Calendar = "month" // from midnight of the month's first day
)

// Mode is a rule's throttling mode.
type Mode string

// Throttling modes.
const (
	// Hard admits nothing beyond the limit (default).
	Hard Mode = "hard"
	// Soft admits up to SoftPercent beyond the limit and marks such
	// decisions with Excess.
	Soft Mode = "soft"
	// Elastic admits beyond the limit, up to ElasticCeiling, only while the
	// rule's Spare signal reports spare capacity, and marks such decisions
	// with Excess.
	Elastic Mode = "elastic"
)

// FailureMode is what a rule does while its store cannot answer.
type FailureMode string

// Failure modes.
const (
	FailOpen   FailureMode = "open"   // admit (default)
	FailClosed FailureMode = "closed" // deny
	FailLocal  FailureMode = "local"  // limit in process memory at LocalPercent of the limit
)

// Tier is how a store backed by Redis decides a rule (docs/REDIS.md). The
// memory store is exact whatever the tier.
type Tier string

// Tiers.
const (
	// TierExact asks Redis for every decision (default; "" too).
	TierExact Tier = "exact"
	// TierLocalShare takes a slice of the key's remaining quota from Redis,
	// spends it in process, and returns what is left: it never admits more
	// than exact, and may admit less while a slice is stranded. Fixed
	// windows only.
	TierLocalShare Tier = "local_share"
	// TierWriteBack decides from the last global count plus the process's
	// unsynced hits, and flushes them periodically: it may admit up to
	// Budget beyond the limit.
	TierWriteBack Tier = "write_back"
)

// A Rule is one limit: Limit requests per Period, by one algorithm.
// Rules are values; a Policy validates and compiles them.
type Rule struct {
	// Name identifies the rule within its policy. State is matched to rules
	// by name when a policy changes, so keep it stable. Defaults to
	// "LIMIT/PERIOD", e.g. "10/1m0s".
	Name      string
	Algorithm Algorithm     // default TokenBucket
	Limit     int64         // requests per Period; must be positive
	Period    time.Duration // the window, or the time a bucket takes to refill Limit
	// Burst is the bucket's capacity, the most admitted at once; defaults to
	// Limit. Window algorithms have no burst apart from the limit.
	Burst int64

	Refill      Refill        // TokenBucket only
	Granularity time.Duration // SlidingSubwindow: sub-window length, dividing Period
	// Calendar aligns a FixedWindow to calendar days, weeks or months in
	// Location (UTC if nil); Period is then ignored.
	Calendar  Calendar
	Location  *time.Location // the calendar's time zone (UTC if nil)
	WeekStart time.Weekday   // first day of a calendar week; the zero value is Sunday
	// CountRejected makes a SlidingLog record denied requests too, as the
	// classic Redis sorted-set limiter does, so a client that keeps trying
	// stays locked out.
	CountRejected bool

	// OnStoreFailure is what the rule does while its store cannot answer in
	// time (a remote store down or slow): FailOpen (the default) admits,
	// FailClosed denies, FailLocal limits in process memory at LocalPercent
	// of the limit (say, 100/instances), the "safe mode".
	OnStoreFailure FailureMode
	LocalPercent   int64 // FailLocal (and only then): the share of Limit each process admits, 1 to 100 percent

	// Tier is how a Redis store decides the rule: TierExact (default),
	// TierLocalShare or TierWriteBack. The memory store ignores it.
	Tier Tier
	// Budget is TierWriteBack's (and only its) accepted overshoot, a
	// fraction of the limit: 0 < Budget <= 0.5 (0.01 is 1%).
	Budget float64

	Mode           Mode        // default Hard
	SoftPercent    int64       // Soft: how far beyond the limit, in percent
	ElasticCeiling int64       // Elastic: most requests (capacity) while spare
	Spare          func() bool // Elastic: reports whether there is spare capacity
}

// RuleError reports an invalid rule, naming the rule and the field.
type RuleError struct {
	Rule  string // the rule's name, or its position as "rules[i]"; empty for the policy as a whole
	Field string // the field, as named in configuration files
	Msg   string // what is wrong
}

// Error returns the rule, the field and the message.
func (e *RuleError) Error() string {
	if e.Rule == "" { // the policy's, not one rule's
		return fmt.Sprintf("floodgate: policy: %s: %s", e.Field, e.Msg)
	}
	return fmt.Sprintf("floodgate: rule %s: %s: %s", e.Rule, e.Field, e.Msg)
}

// ErrCostTooLarge is returned by Wait when the cost exceeds what a rule can
// ever admit.
var ErrCostTooLarge = errors.New("floodgate: cost exceeds what the limit can ever admit")

func (r Rule) defaultName() string {
	if r.Calendar != "" {
		return fmt.Sprintf("%d/%s", r.Limit, r.Calendar)
	}
	return fmt.Sprintf("%d/%s", r.Limit, r.Period)
}

// compile validates r and returns its algorithm parameters, phase by
// phase: numbers, algorithm, window, mode, failure mode, tier, then the
// algorithm's own checks. The first error names the field.
func (r Rule) compile(name string) (algo.Params, error) {
	p := algo.Params{Limit: r.Limit, Burst: r.Burst, CountRejected: r.CountRejected}
	for _, phase := range []func(*algo.Params) (field, msg string){
		r.compileNumbers, r.compileAlgorithm, r.compileWindow, r.compileMode, r.compileFailure,
		r.compileTier,
	} {
		if field, msg := phase(&p); field != "" {
			return algo.Params{}, &RuleError{Rule: name, Field: field, Msg: msg}
		}
	}
	if msg := p.Prepare(); msg != "" {
		field, text, _ := strings.Cut(msg, ": ")
		return algo.Params{}, &RuleError{Rule: name, Field: field, Msg: text}
	}
	return p, nil
}

func (r Rule) compileNumbers(*algo.Params) (field, msg string) {
	if r.Limit <= 0 {
		return "limit", fmt.Sprintf("must be positive, got %d", r.Limit)
	}
	if r.Burst < 0 {
		return "burst", fmt.Sprintf("must not be negative, got %d", r.Burst)
	}
	return "", ""
}

// kinds maps each algorithm to its kind in internal/algo ("" is TokenBucket).
var kinds = map[Algorithm]algo.Kind{
	"": algo.TokenBucket, TokenBucket: algo.TokenBucket, LeakyBucket: algo.LeakyMeter,
	LeakyBucketShaper: algo.LeakyShaper, GCRA: algo.GCRA, FixedWindow: algo.FixedWindow,
	SlidingLog: algo.SlidingLog, SlidingWindow: algo.SlidingCounter, SlidingSubwindow: algo.SlidingSubwindow,
}

func (r Rule) compileAlgorithm(p *algo.Params) (field, msg string) {
	k, ok := kinds[r.Algorithm]
	if !ok {
		return "algorithm", fmt.Sprintf("unknown algorithm %q", r.Algorithm)
	}
	p.Kind = k
	switch {
	case r.Refill == "" || r.Refill == RefillContinuous && k == algo.TokenBucket:
	case r.Refill == RefillInterval && k == algo.TokenBucket:
		p.Kind = algo.TokenBucketInterval
	case k == algo.TokenBucket:
		return "refill", fmt.Sprintf("unknown refill %q (want continuous or interval)", r.Refill)
	default:
		return "refill", "only token_bucket has a refill style"
	}
	return "", ""
}

// calendars are the calendar windows, each with its longest period.
var calendars = map[Calendar]struct {
	cal    algo.CalUnit
	period time.Duration
}{
	CalendarDay: {algo.CalDay, 24 * time.Hour}, CalendarWeek: {algo.CalWeek, 7 * 24 * time.Hour}, CalendarMonth: {algo.CalMonth, 31 * 24 * time.Hour},
}

func (r Rule) compileWindow(p *algo.Params) (field, msg string) {
	if r.Calendar != "" {
		c, ok := calendars[r.Calendar]
		if !ok {
			return "calendar", fmt.Sprintf("unknown calendar %q (want day, week or month)", r.Calendar)
		}
		if r.Algorithm != FixedWindow {
			return "calendar", "only fixed_window windows follow the calendar"
		}
		p.Cal, p.Period = c.cal, c.period.Microseconds()
	} else {
		if r.Period < time.Microsecond {
			return "period", fmt.Sprintf("must be at least 1µs, got %s", r.Period)
		}
		if r.Period%time.Microsecond != 0 {
			return "period", fmt.Sprintf("must be a whole number of microseconds, got %s", r.Period)
		}
		p.Period = r.Period.Microseconds()
	}
	p.Loc, p.WeekDay0 = r.Location, r.WeekStart
	if r.Granularity < 0 || r.Granularity%time.Microsecond != 0 {
		return "granularity", fmt.Sprintf("must be a positive whole number of microseconds, got %s", r.Granularity)
	}
	p.Gran = r.Granularity.Microseconds()
	return "", ""
}

func (r Rule) compileMode(p *algo.Params) (field, msg string) {
	burst := r.Burst
	if burst == 0 {
		burst = r.Limit
	}
	switch r.Mode {
	case Hard, "":
		if r.SoftPercent != 0 || r.ElasticCeiling != 0 || r.Spare != nil {
			return "mode", "soft_percent, elastic_ceiling and spare need mode soft or elastic"
		}
	case Soft:
		if r.SoftPercent <= 0 || r.SoftPercent > 10000 {
			return "soft_percent", fmt.Sprintf("must be between 1 and 10000, got %d", r.SoftPercent)
		}
		p.Soft = max(burst+burst*r.SoftPercent/100, burst+1)
	case Elastic:
		if r.ElasticCeiling <= burst {
			return "elastic_ceiling", fmt.Sprintf("must exceed the limit (%d), got %d", burst, r.ElasticCeiling)
		}
		if r.Spare == nil {
			return "spare", "elastic mode needs a spare-capacity signal"
		}
		p.Elastic = r.ElasticCeiling
	default:
		return "mode", fmt.Sprintf("unknown mode %q (want hard, soft or elastic)", r.Mode)
	}
	return "", ""
}

func (r Rule) compileFailure(*algo.Params) (field, msg string) {
	switch r.OnStoreFailure {
	case FailOpen, FailClosed, "":
		if r.LocalPercent != 0 {
			return "local_percent", "needs on_store_failure local"
		}
	case FailLocal:
		if r.LocalPercent < 1 || r.LocalPercent > 100 {
			return "local_percent", fmt.Sprintf("must be between 1 and 100, got %d", r.LocalPercent)
		}
	default:
		return "on_store_failure", fmt.Sprintf("unknown failure mode %q (want open, closed or local)", r.OnStoreFailure)
	}
	return "", ""
}

func (r Rule) compileTier(p *algo.Params) (field, msg string) {
	switch r.Tier {
	case TierExact, "", TierLocalShare:
		if r.Budget != 0 {
			return "budget", "needs tier write_back"
		}
		if r.Tier == TierLocalShare && (p.Kind != algo.FixedWindow || p.Cal != algo.CalNone) {
			return "tier", "local_share needs algorithm fixed_window with a period (a slice is a number of requests of the current window); use exact or write_back"
		}
		if r.Tier == TierLocalShare && r.Mode != Hard && r.Mode != "" {
			return "tier", "local_share needs mode hard"
		}
	case TierWriteBack:
		// !(a && b) rather than a || b: NaN fails both comparisons.
		if !(r.Budget > 0 && r.Budget <= 0.5) {
			return "budget", fmt.Sprintf("must be above 0 and at most 0.5 (50%%), got %g", r.Budget)
		}
		if (p.Kind != algo.FixedWindow || p.Cal != algo.CalNone) && p.Kind != algo.SlidingCounter {
			return "tier", "write_back needs algorithm fixed_window with a period or sliding_window (a count per window that hits are added to); use exact or local_share"
		}
		if r.Mode != Hard && r.Mode != "" {
			return "tier", "write_back needs mode hard"
		}
	default:
		return "tier", fmt.Sprintf("unknown tier %q (want exact, local_share or write_back)", r.Tier)
	}
	return "", ""
}

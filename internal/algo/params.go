package algo

import (
	"math/big"
	"math/bits"
	"time"
)

// Kind selects an algorithm.
type Kind uint8

// The algorithms. TokenBucket, LeakyMeter and GCRA are the same algorithm
// seen three ways (a bucket that refills, a bucket that leaks, a theoretical
// arrival time); they share one implementation and make identical decisions.
const (
	TokenBucket         Kind = iota + 1 // continuous refill
	TokenBucketInterval                 // Limit tokens restored at the end of each period
	LeakyMeter                          // leaky bucket as a meter
	LeakyShaper                         // leaky bucket as a queue with fixed outflow
	GCRA                                // generic cell rate algorithm
	FixedWindow                         // counter per aligned window
	SlidingLog                          // exact log of timestamps
	SlidingCounter                      // previous window weighted by overlap
	SlidingSubwindow                    // ring of sub-window counters
)

// MaxLogSize caps the limit of a sliding-log rule: its state is one word
// (8 bytes) per admitted request in the window, so a log of 10,000 costs
// 80 KB per key.
const MaxLogSize = 10_000

// MaxSubwindows caps the number of sub-windows of a sliding sub-window rule.
const MaxSubwindows = 4096

// MaxExact is the largest magnitude any state word or intermediate sum may
// reach: 2^53, the largest integer a Lua double (Redis) holds exactly.
const MaxExact = 1 << 53

// CalUnit is a calendar window unit for fixed windows.
type CalUnit uint8

// Calendar units.
const (
	CalNone CalUnit = iota
	CalDay
	CalWeek
	CalMonth
)

// Params is one compiled rule: every number its algorithm needs.
type Params struct {
	Kind   Kind
	Limit  int64 // L: requests per period
	Period int64 // P: microseconds
	Burst  int64 // B: base capacity in requests; equals Limit for window algorithms

	// Bucket algorithms measure their level in units: a request is Unit
	// units, and the bucket drains Rate units per microsecond: exactly
	// L/P, or with Approx the nearest fraction whose units stay below
	// 2^51 (docs/ALGORITHMS.md).
	Unit   int64
	Rate   int64
	Approx bool

	Gran int64 // SlidingSubwindow: sub-window length in microseconds
	N    int64 // SlidingSubwindow: number of sub-windows (Period/Gran)
	// SlidingSubwindow: bits per counter, 16 when twice the largest ceiling
	// fits, else 32; counters are packed 4 or 2 to a word.
	CBits int64

	Cal      CalUnit        // FixedWindow: calendar alignment, CalNone for epoch
	Loc      *time.Location // FixedWindow: time zone of calendar windows
	WeekDay0 time.Weekday   // FixedWindow: first day of a calendar week

	Soft    int64 // soft mode: most requests admitted (> Burst); 0 when not soft
	Elastic int64 // elastic mode: most admitted while spare; 0 when not elastic

	CountRejected bool // SlidingLog: rejected requests enter the log too

	Off   int // offset of this rule's words in the key's state
	Width int // number of state words
}

// Ceiling is the capacity in requests that applies to one request: the soft
// ceiling, the elastic ceiling when spare capacity is signalled, else Burst.
func (p *Params) Ceiling(spare bool) int64 {
	switch {
	case p.Soft > 0:
		return p.Soft
	case p.Elastic > 0 && spare:
		return p.Elastic
	}
	return p.Burst
}

// MaxCeiling is the largest capacity the rule can ever apply.
func (p *Params) MaxCeiling() int64 {
	return max(p.Burst, p.Soft, p.Elastic)
}

// Bucket reports whether the rule is one of the bucket algorithms, whose
// level drains continuously and which can reserve future capacity.
func (p *Params) Bucket() bool {
	switch p.Kind {
	case TokenBucket, LeakyMeter, GCRA, LeakyShaper:
		return true
	}
	return false
}

// Reservable reports whether a request may be admitted now against
// capacity that frees later (Wait's reservation).
func (p *Params) Reservable() bool {
	return p.Bucket() || p.Kind == TokenBucketInterval
}

// WidthFor returns the number of state words the rule needs.
func (p *Params) WidthFor() int {
	switch p.Kind {
	case SlidingLog:
		if p.CountRejected { // one more: a full window told from an overfull one
			return 3 + int(p.MaxCeiling())
		}
		return 2 + int(p.MaxCeiling())
	case SlidingSubwindow:
		per := 64 / p.CBits
		return 2 + int((p.N+per-1)/per)
	}
	return 2
}

// Prepare fills the derived fields (Unit, Rate, N, Width) and reports a
// problem as a short message naming the field, or "" when the rule is sound.
func (p *Params) Prepare() string {
	msg := p.checkLimits()
	if msg == "" {
		msg = p.checkModes()
	}
	if msg == "" {
		msg = p.prepareKind()
	}
	if msg == "" {
		msg = p.prepareOptions()
	}
	if msg == "" {
		p.Width = p.WidthFor()
	}
	return msg
}

// checkLimits checks the limit, the period and the burst (0: the limit).
func (p *Params) checkLimits() string {
	switch {
	case p.Limit <= 0:
		return "limit: must be positive"
	case p.Period <= 0:
		return "period: must be at least one microsecond"
	case p.Period >= MaxExact/4:
		return "period: too long (at most 2^51 µs, about 71 years)"
	}
	if p.Burst == 0 {
		p.Burst = p.Limit
	}
	if p.Burst < 0 {
		return "burst: must not be negative"
	}
	return ""
}

// checkModes checks the soft and elastic ceilings.
func (p *Params) checkModes() string {
	switch {
	case p.Soft < 0 || p.Elastic < 0:
		return "mode: ceilings must not be negative"
	case p.Soft > 0 && p.Soft < p.Burst:
		return "soft: ceiling below the limit"
	case p.Elastic > 0 && p.Elastic < p.Burst:
		return "elastic: ceiling below the limit"
	case p.Soft > 0 && p.Elastic > 0:
		return "mode: soft and elastic exclude each other"
	}
	return ""
}

// prepareKind sets a bucket's units and checks each algorithm's bounds.
func (p *Params) prepareKind() string {
	switch p.Kind {
	case TokenBucket, LeakyMeter, GCRA, LeakyShaper:
		return p.prepareUnits()
	case TokenBucketInterval:
		if p.MaxCeiling() >= MaxExact/4 {
			return "burst: too large"
		}
	case FixedWindow, SlidingLog, SlidingCounter, SlidingSubwindow:
		if p.Burst != p.Limit {
			return "burst: only bucket algorithms have a burst apart from the limit"
		}
		// A fixed window's count is a word of its own; the sliding
		// windows pack theirs in 32 bits (and a count may pass its
		// ceiling by one cost before it is clamped).
		if p.Kind == FixedWindow && p.MaxCeiling() >= MaxExact/4 {
			return "limit: at most 2^51-1 for fixed_window"
		}
		if p.Kind != FixedWindow && p.MaxCeiling() >= 1<<31 {
			return "limit: at most 2^31-1 for sliding window algorithms"
		}
	default:
		return "algorithm: unknown"
	}
	return ""
}

// prepareUnits sets a bucket's Unit and Rate: exact, or approximated where
// a full bucket's exact units would pass 2^51.
func (p *Params) prepareUnits() string {
	g := gcd(p.Period, p.Limit)
	p.Unit, p.Rate, p.Approx = p.Period/g, p.Limit/g, false
	hi, lo := bits.Mul64(uint64(p.MaxCeiling()), uint64(p.Unit))
	if hi == 0 && lo < MaxExact/4 {
		return ""
	}
	umax := (MaxExact/4 - 1) / p.MaxCeiling()
	if umax >= 1 {
		p.Unit, p.Rate = approxRate(p.Period, p.Limit, umax)
	}
	if umax < 1 || p.Rate < 1 {
		return "burst: too large for the rate: a full bucket would take more than 2^51 units (make the burst smaller against the limit, or the period shorter)"
	}
	p.Approx = true
	return ""
}

// prepareOptions checks the fields only some algorithms have (calendar,
// granularity, count_rejected) and the log's size, and sets a sub-window
// rule's N and CBits.
func (p *Params) prepareOptions() string {
	if p.Kind != FixedWindow && p.Cal != CalNone {
		return "calendar: only fixed_window windows follow the calendar"
	}
	if p.Cal != CalNone && p.Loc == nil {
		p.Loc = time.UTC
	}
	if p.Kind == SlidingLog && p.MaxCeiling() > MaxLogSize {
		return "limit: a sliding_log keeps one timestamp per request and is capped at 10000; use sliding_window or sliding_subwindow for larger limits"
	}
	if p.Kind == SlidingSubwindow {
		if msg := p.prepareSubwindows(); msg != "" {
			return msg
		}
	}
	if p.Kind != SlidingSubwindow && p.Gran != 0 {
		return "granularity: only sliding_subwindow has sub-windows"
	}
	if p.Kind != SlidingLog && p.CountRejected {
		return "count_rejected: only sliding_log counts rejected requests"
	}
	return ""
}

// prepareSubwindows sets a sub-window rule's N and CBits.
func (p *Params) prepareSubwindows() string {
	if p.Gran <= 0 {
		return "granularity: must be set for sliding_subwindow"
	}
	if p.Period%p.Gran != 0 {
		return "granularity: must divide the period"
	}
	p.N = p.Period / p.Gran
	p.CBits = 32
	if 2*p.MaxCeiling() < 1<<16 {
		p.CBits = 16
	}
	if p.N < 1 || p.N > MaxSubwindows {
		return "granularity: the period must hold between 1 and 4096 sub-windows"
	}
	return ""
}

// approxRate returns unit <= umax and rate with rate/unit nearest
// l/period, from the continued fraction of l/period (docs/ALGORITHMS.md).
// rate may be 0 when l/period is below 1/(2·umax).
func approxRate(period, l, umax int64) (unit, rate int64) {
	p0, q0, p1, q1 := int64(0), int64(1), int64(1), int64(0)
	n, d := l, period
	for d != 0 {
		a := n / d
		if q1 != 0 && a > (umax-q0)/q1 { // q0 + a·q1 > umax
			break
		}
		p0, q0, p1, q1 = p1, q1, p0+a*p1, q0+a*q1
		n, d = d, n-a*d
	}
	if d == 0 { // exact within umax (not when called from Prepare)
		return q1, p1
	}
	k := (umax - q0) / q1
	sp, sq := p0+k*p1, q0+k*q1 // the semiconvergent
	// nearer: |sp/sq − l/period| against |p1/q1 − l/period|, exactly
	dist := func(p, q int64) *big.Int {
		x := new(big.Int).Mul(big.NewInt(p), big.NewInt(period))
		x.Sub(x, new(big.Int).Mul(big.NewInt(l), big.NewInt(q)))
		return x.Abs(x)
	}
	ds, dc := dist(sp, sq), dist(p1, q1)
	ds.Mul(ds, big.NewInt(q1))
	dc.Mul(dc, big.NewInt(sq))
	if ds.Cmp(dc) < 0 {
		return sq, sp
	}
	return q1, p1
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// ceilDiv returns ceil(a/b) for a >= 0, b > 0.
func ceilDiv(a, b int64) int64 {
	if a <= 0 {
		return 0
	}
	return (a + b - 1) / b
}

// floorDiv returns floor(a/b) for b > 0.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

// mulDiv returns floor(a*b/c) for a, b >= 0, c > 0, without overflow.
func mulDiv(a, b, c int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(c) {
		return 1<<63 - 1
	}
	q, _ := bits.Div64(hi, lo, uint64(c))
	return int64(q)
}

// mulDivCeil returns ceil(a*b/c) for a, b >= 0, c > 0, without overflow.
func mulDivCeil(a, b, c int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	lo, carry := bits.Add64(lo, uint64(c-1), 0)
	hi += carry
	if hi >= uint64(c) {
		return 1<<63 - 1
	}
	q, _ := bits.Div64(hi, lo, uint64(c))
	return int64(q)
}

package refmodel

import (
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/storekit"
)

// These pin the discrepancies the random traces found between the engine
// and the definitions, each with the model and the engine side by side.

type fixedCase struct {
	name  string
	specs []Spec
	steps []fixedStep
}

type fixedStep struct {
	at    time.Time
	op    Op
	cost  int64
	spare uint64
	want  floodgate.Decision
}

func runFixed(t *testing.T, c fixedCase) {
	t.Helper()
	var spare uint64
	rules := make([]floodgate.Rule, len(c.specs))
	for i, s := range c.specs {
		bit := uint64(1) << i
		rules[i] = toRule(i, s, func() bool { return spare&bit != 0 })
	}
	pol := floodgate.MustPolicy("", rules...)
	st := make([]int64, storekit.Width(pol))
	m := NewKey(c.specs)
	for i, s := range c.steps {
		spare = s.spare
		now := s.at.UnixMicro()
		model := toDecision(m.Do(now, s.op, s.cost, 0, s.spare))
		got := storekit.Apply(pol, st, now, floodgate.Op{Kind: engineOps[s.op], Cost: s.cost, Spare: s.spare})
		if model != s.want {
			t.Errorf("%s step %d (%v %d at %v): model %+v, want %+v", c.name, i, s.op, s.cost, s.at, model, s.want)
		}
		if got != s.want {
			t.Errorf("%s step %d (%v %d at %v): engine %+v, want %+v", c.name, i, s.op, s.cost, s.at, got, s.want)
		}
	}
}

var t0 = time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

// A charge above a rule's ceiling is recorded (clamped) but can never be
// admitted: it reports ReasonCostTooLarge and no retry. The engine used to
// report ReasonLimited with a retry computed for a negative room: about
// -54 years for a sliding log, 0 for a sub-window rule.
func TestChargeAboveCeiling(t *testing.T) {
	log := Spec{Kind: SlidingLog, Limit: 5, Period: 1e6, ElasticCeiling: 8}
	sub := Spec{Kind: SlidingSubwindow, Limit: 5, Period: 1e6, Gran: 1e5}
	tb := Spec{Kind: TokenBucket, Limit: 10, Period: 1e6}
	for _, c := range []fixedCase{
		{"sliding log alone", []Spec{log}, []fixedStep{
			{at(0), Charge, 6, 0, floodgate.Decision{Limit: 5, Remaining: 0, ResetAfter: time.Second, Rule: "r0", Reason: floodgate.ReasonCostTooLarge}},
			{at(time.Millisecond), Peek, 0, 0, floodgate.Decision{Limit: 5, Remaining: 0, ResetAfter: 999 * time.Millisecond, RetryAfter: 999 * time.Millisecond, Rule: "r0", Reason: floodgate.ReasonLimited}},
		}},
		{"sub-window beside a bucket", []Spec{tb, sub}, []fixedStep{
			{at(0), Charge, 7, 0, floodgate.Decision{Limit: 5, Remaining: 0, ResetAfter: time.Second, Rule: "r1", Reason: floodgate.ReasonCostTooLarge}},
			{at(0), Allow, 1, 0, floodgate.Decision{Limit: 5, Remaining: 0, ResetAfter: time.Second, RetryAfter: time.Second, Rule: "r1", Reason: floodgate.ReasonLimited}},
		}},
	} {
		runFixed(t, c)
	}
}

// A refund gives back the newest consumption that still counts. For the
// sliding window counter that is the current window's count and then the
// previous window's; the engine stopped at the current window, so a
// reservation cancelled just after a window boundary kept counting.
func TestSlidingWindowRefundReachesPreviousWindow(t *testing.T) {
	sw := Spec{Kind: SlidingWindow, Limit: 2, Period: 1e6}
	runFixed(t, fixedCase{"sliding window", []Spec{sw}, []fixedStep{
		// 2 in the window [0, 1s): in the next window they count
		// ⌊2·(P−e)/P⌋, which reaches 0 at e = P/2 + 1µs.
		{at(900 * time.Millisecond), Allow, 2, 0, floodgate.Decision{Allowed: true, Limit: 2, Remaining: 0, ResetAfter: 600*time.Millisecond + time.Microsecond, Rule: "r0"}},
		// At the boundary both are the previous window's: give one back,
		// and the other counts ⌊1·(P−e)/P⌋, 0 from e = 1µs.
		{at(time.Second), Refund, 1, 0, floodgate.Decision{Allowed: true, Limit: 2, Remaining: 1, ResetAfter: time.Microsecond, Rule: "r0"}},
		{at(time.Second), Refund, 5, 0, floodgate.Decision{Allowed: true, Limit: 2, Remaining: 2, Rule: "r0"}},
		{at(time.Second), Allow, 2, 0, floodgate.Decision{Allowed: true, Limit: 2, Remaining: 0, ResetAfter: 1500*time.Millisecond + time.Microsecond, Rule: "r0"}},
	}})
}

// A peek (cost 0) at a shaper whose elastic allowance has lapsed waits only
// for the queue to come down to the ceiling, not for it to empty: the
// engine admits it then, so that is its retry-after.
func TestShaperPeekRetry(t *testing.T) {
	q := Spec{Kind: LeakyShaper, Limit: 1, Period: 1e6, Burst: 2, ElasticCeiling: 4}
	runFixed(t, fixedCase{"shaper", []Spec{q}, []fixedStep{
		{at(0), Allow, 4, 1, floodgate.Decision{Allowed: true, Limit: 1, Remaining: 0, ResetAfter: 4 * time.Second, Rule: "r0", Excess: true}},
		{at(0), Peek, 0, 0, floodgate.Decision{Limit: 1, Remaining: 0, ResetAfter: 4 * time.Second, RetryAfter: 2 * time.Second, Rule: "r0", Reason: floodgate.ReasonLimited}},
		{at(2 * time.Second), Peek, 0, 0, floodgate.Decision{Allowed: true, Limit: 1, Remaining: 0, ResetAfter: 2 * time.Second, Rule: "r0"}},
	}})
}

// A calendar day begins at the first instant of its local date. time.Date
// misses it when a clock change skips midnight (it returns 23:00 of the day
// before, so the engine's window for that evening ended before it began and
// ResetAfter went negative), skips a whole date (Samoa, 2011-12-30), or
// repeats midnight (it returns the second one, an hour late).
func TestCalendarDayAcrossMidnightClockChanges(t *testing.T) {
	day := func(zone string) Spec {
		return Spec{Kind: FixedWindow, Limit: 3, Cal: CalDay, Loc: mustZone(zone)}
	}
	admit := func(when time.Time, reset time.Duration) fixedStep {
		return fixedStep{when, Allow, 1, 0, floodgate.Decision{Allowed: true, Limit: 3, Remaining: 2, ResetAfter: reset, Rule: "r0"}}
	}
	santiago, havana := mustZone("America/Santiago"), mustZone("America/Havana")
	apia, gaza := mustZone("Pacific/Apia"), mustZone("Asia/Gaza")
	for _, c := range []fixedCase{
		// 2016-08-14 00:00 -04 became 01:00 -03.
		{"Santiago", []Spec{day("America/Santiago")}, []fixedStep{
			admit(time.Date(2016, 8, 13, 23, 30, 0, 0, santiago), 30*time.Minute),
			admit(time.Date(2016, 8, 14, 1, 0, 0, 0, santiago), 23*time.Hour),
		}},
		// 2015-03-08 00:00 CST became 01:00 CDT.
		{"Havana", []Spec{day("America/Havana")}, []fixedStep{
			admit(time.Date(2015, 3, 7, 22, 45, 0, 0, havana), 75*time.Minute),
		}},
		// Samoa skipped 2011-12-30: the 29th ran into the 31st.
		{"Apia", []Spec{day("Pacific/Apia")}, []fixedStep{
			admit(time.Date(2011, 12, 29, 12, 0, 0, 0, apia), 12*time.Hour),
			admit(time.Date(2011, 12, 31, 0, 0, 0, 0, apia), 24*time.Hour),
		}},
		// 2012-09-21 01:00 EEST went back to 00:00 EET: midnight came twice,
		// and the 21st began at the first.
		{"Gaza", []Spec{day("Asia/Gaza")}, []fixedStep{
			admit(time.Date(2012, 9, 20, 23, 30, 0, 0, gaza), 30*time.Minute),
			admit(time.Date(2012, 9, 20, 21, 30, 0, 0, time.UTC), 25*time.Hour-30*time.Minute),
		}},
	} {
		runFixed(t, c)
	}
}

// The model follows the seed examples the documentation quotes.
func TestModelSeedExamples(t *testing.T) {
	minute := int64(60e6)
	sec := func(s int64) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	ok := func(d Decision) bool { return d.Allowed }

	// 3 per minute at 0, 10, 30, 55 s: interval refill throttles the last
	// (retry after 5 s); continuous refill admits it.
	for _, k := range []Kind{TokenBucketInterval, TokenBucket} {
		m := NewKey([]Spec{{Kind: k, Limit: 3, Period: minute}})
		var d Decision
		for _, s := range []int64{0, 10, 30, 55} {
			d = m.Do(sec(s).UnixMicro(), Allow, 1, 0, 0)
		}
		if k == TokenBucketInterval && (ok(d) || d.RetryAfter != 5e6) {
			t.Errorf("interval: last decision %v, want denied with retry 5s", d)
		}
		if k == TokenBucket && !ok(d) {
			t.Errorf("continuous: last decision %v, want admitted", d)
		}
	}

	// Shaper of 10 leaking 2 per second, a spike of 20: delays 0, 0.5 s, ...
	// 4.5 s, then 10 rejections.
	m := NewKey([]Spec{{Kind: LeakyShaper, Limit: 2, Period: 1e6, Burst: 10}})
	for i := range int64(20) {
		d := m.Do(t0.UnixMicro(), Reserve, 1, 1<<40, 0)
		if i < 10 && (!ok(d) || d.Delay != i*500_000) || i >= 10 && ok(d) {
			t.Errorf("shaper spike, request %d: %v", i, d)
		}
	}

	// Sliding window counter, 7 per minute, 5 in the previous window and 3
	// in the current at 30%: 3 + ⌊5·0.7⌋ = 6, so one more is admitted.
	m = NewKey([]Spec{{Kind: SlidingWindow, Limit: 7, Period: minute}})
	w := t0.Truncate(time.Minute)
	m.Do(w.Add(-time.Second).UnixMicro(), Allow, 5, 0, 0)
	m.Do(w.UnixMicro(), Allow, 3, 0, 0)
	if d := m.Do(w.Add(18*time.Second).UnixMicro(), Allow, 1, 0, 0); !ok(d) {
		t.Errorf("sliding window at 30%%: %v, want admitted", d)
	}

	// Sliding log, 2 per minute at 1:00:01, 1:00:30, 1:00:50, 1:01:40: the
	// third is rejected and the fourth admitted, with or without
	// CountRejected.
	for _, cr := range []bool{false, true} {
		m := NewKey([]Spec{{Kind: SlidingLog, Limit: 2, Period: minute, CountRejected: cr}})
		var got []bool
		for _, s := range []int64{1, 30, 50, 100} {
			got = append(got, ok(m.Do(sec(s).UnixMicro(), Allow, 1, 0, 0)))
		}
		if got[0] != true || got[1] != true || got[2] != false || got[3] != true {
			t.Errorf("sliding log (count rejected %v): %v", cr, got)
		}
	}
}

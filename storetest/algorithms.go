package storetest

import (
	"testing"
	"time"
	_ "time/tzdata" // calendar windows in America/New_York on any system

	"github.com/floodgate/floodgate"
)

// Each algorithm's decisions, with every field exact:
//
//   - Remaining: whole requests of cost 1 admissible now (up to the burst
//     for buckets), after the request when it was admitted;
//   - ResetAfter: until the key's state is fresh again if nothing arrives;
//   - RetryAfter: for a denial, until the same request would be admitted if
//     nothing else arrives, rounded up to the microsecond; 0 when admitted;
//   - Limit and Rule: the deciding rule's; Reason: why it was denied.
func testAlgorithms(t *testing.T, newStore NewStore) {
	// TokenBucket, LeakyBucket (the meter) and GCRA decide identically: 4
	// per second is one request per 250 ms of refill.
	for _, a := range []floodgate.Algorithm{floodgate.TokenBucket, floodgate.LeakyBucket, floodgate.GCRA} {
		t.Run(string(a), func(t *testing.T) {
			e := newEnv(t, newStore)
			l := e.limiter("p", floodgate.Rule{Name: "r", Algorithm: a, Limit: 4, Period: time.Second})
			ms := time.Millisecond
			e.script(l, "k", []step{
				{0, peek, 0, ok("r", 4, 4, 0)}, // a fresh key: full, nothing to reset
				{0, allow, 1, ok("r", 4, 3, 250*ms)},
				{0, allow, 3, ok("r", 4, 0, time.Second)},
				{0, allow, 1, no("r", 4, 0, time.Second, 250*ms)},
				{100 * ms, allow, 1, no("r", 4, 0, 900*ms, 150*ms)},
				{100 * ms, allow, 2, no("r", 4, 0, 900*ms, 400*ms)},
				{100 * ms, peek, 1, no("r", 4, 0, 900*ms, 150*ms)},
				{250 * ms, allow, 1, ok("r", 4, 0, time.Second)},
				{750 * ms, peek, 0, ok("r", 4, 2, 500*ms)},
				{750 * ms, peek, 2, ok("r", 4, 2, 500*ms)},
				{5 * time.Second, allow, 1, ok("r", 4, 3, 250*ms)},
			})
		})
		// A burst above the limit: 3 at once, then one per second.
		t.Run(string(a)+"/Burst", func(t *testing.T) {
			e := newEnv(t, newStore)
			l := e.limiter("p", floodgate.Rule{Name: "r", Algorithm: a, Limit: 1, Period: time.Second, Burst: 3})
			ms := time.Millisecond
			e.script(l, "k", []step{
				{0, allow, 3, ok("r", 1, 0, 3*time.Second)},
				{0, allow, 1, no("r", 1, 0, 3*time.Second, time.Second)},
				{1500 * ms, allow, 1, ok("r", 1, 0, 2500*ms)},
				{1500 * ms, allow, 1, no("r", 1, 0, 2500*ms, 500*ms)},
				{4 * time.Second, peek, 0, ok("r", 1, 3, 0)},
				{4 * time.Second, allow, 4, tooLarge("r", 1, 3, 0)},
			})
		})
		// 3 per second does not divide a second in microseconds: times
		// round up, so a client told to retry after RetryAfter is admitted.
		t.Run(string(a)+"/Rounding", func(t *testing.T) {
			e := newEnv(t, newStore)
			l := e.limiter("p", floodgate.Rule{Name: "r", Algorithm: a, Limit: 3, Period: time.Second})
			e.script(l, "k", []step{
				{0, allow, 1, ok("r", 3, 2, us(333334))},
				{0, allow, 2, ok("r", 3, 0, time.Second)},
				{0, allow, 1, no("r", 3, 0, time.Second, us(333334))},
				{us(333333), allow, 1, no("r", 3, 0, us(666667), us(1))},
				{us(333334), allow, 1, ok("r", 3, 0, time.Second)},
			})
		})
	}

	// The token bucket refilled at the end of each period: Limit tokens
	// at once, the period starting with the first request taken from a
	// full bucket.
	t.Run("token_bucket/Interval", func(t *testing.T) {
		e := newEnv(t, newStore)
		l := e.limiter("p", floodgate.Rule{Name: "r", Limit: 3, Period: time.Minute, Refill: floodgate.RefillInterval})
		s := time.Second
		e.script(l, "k", []step{
			{0, peek, 0, ok("r", 3, 3, 0)},
			{5 * s, allow, 1, ok("r", 3, 2, 60*s)},
			{10 * s, allow, 1, ok("r", 3, 1, 55*s)},
			{30 * s, allow, 2, no("r", 3, 1, 35*s, 35*s)},
			{30 * s, allow, 1, ok("r", 3, 0, 35*s)},
			{64 * s, allow, 1, no("r", 3, 0, us(1000000), us(1000000))},
			{65 * s, allow, 1, ok("r", 3, 2, 60*s)},
			// A full period with nothing taken: still a new period per
			// request taken from a full bucket.
			{200 * s, peek, 0, ok("r", 3, 3, 0)},
			{201 * s, allow, 3, ok("r", 3, 0, 60*s)},
		})
	})
	// A burst above the limit refills Limit per period, not all of it.
	t.Run("token_bucket/IntervalBurst", func(t *testing.T) {
		e := newEnv(t, newStore)
		l := e.limiter("p", floodgate.Rule{Name: "r", Limit: 2, Burst: 4, Period: time.Minute, Refill: floodgate.RefillInterval})
		s := time.Second
		e.script(l, "k", []step{
			{0, allow, 4, ok("r", 2, 0, 120*s)},
			{30 * s, allow, 1, no("r", 2, 0, 90*s, 30*s)},
			{30 * s, allow, 3, no("r", 2, 0, 90*s, 90*s)},
			{60 * s, peek, 0, ok("r", 2, 2, 60*s)},
			{60 * s, allow, 1, ok("r", 2, 1, 120*s)},
			{60 * s, allow, 1, ok("r", 2, 0, 120*s)},
			{180 * s, peek, 0, ok("r", 2, 4, 0)},
		})
	})

	// Fixed windows are aligned to the Unix epoch.
	t.Run("fixed_window", func(t *testing.T) {
		e := newEnv(t, newStore)
		l := e.limiter("p", floodgate.Rule{Name: "r", Algorithm: floodgate.FixedWindow, Limit: 3, Period: time.Minute})
		s := time.Second
		e.script(l, "k", []step{
			{0, peek, 0, ok("r", 3, 3, 0)},
			{20 * s, allow, 2, ok("r", 3, 1, 40*s)},
			{30 * s, allow, 2, no("r", 3, 1, 30*s, 30*s)},
			{30 * s, allow, 1, ok("r", 3, 0, 30*s)},
			{60*s - us(1), allow, 1, no("r", 3, 0, us(1), us(1))},
			{60 * s, allow, 1, ok("r", 3, 2, 60*s)},
			{60 * s, allow, 4, tooLarge("r", 3, 2, 60*s)},
		})
	})
	t.Run("fixed_window/Epoch", func(t *testing.T) {
		e := newEnv(t, newStore)
		// 11 s windows start at multiples of 11 s since 1970, not at the
		// first request.
		start := time.Unix(origin.Unix()/11*11, 0)
		e.from(start.Add(3 * time.Second))
		l := e.limiter("p", floodgate.Rule{Name: "r", Algorithm: floodgate.FixedWindow, Limit: 1, Period: 11 * time.Second})
		e.script(l, "k", []step{
			{0, allow, 1, ok("r", 1, 0, 8*time.Second)},
			{7 * time.Second, allow, 1, no("r", 1, 0, time.Second, time.Second)},
			{8 * time.Second, allow, 1, ok("r", 1, 0, 11*time.Second)},
		})
	})
	// Calendar windows: a day in New York the day clocks go forward is 23
	// hours long.
	t.Run("fixed_window/CalendarDay", func(t *testing.T) {
		e := newEnv(t, newStore)
		ny, err := time.LoadLocation("America/New_York")
		if err != nil {
			t.Fatal(err)
		}
		e.from(time.Date(2024, 3, 10, 0, 0, 0, 0, ny))
		l := e.limiter("p", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 2, Calendar: floodgate.CalendarDay, Location: ny})
		const r = "2/day"
		h := time.Hour
		noon := time.Date(2024, 3, 10, 12, 0, 0, 0, ny).Sub(e.origin) // 11 h after midnight
		e.script(l, "k", []step{
			{0, allow, 1, ok(r, 2, 1, 23*h)},
			{noon, allow, 1, ok(r, 2, 0, 12*h)},
			{noon, allow, 1, no(r, 2, 0, 12*h, 12*h)},
			{23*h - us(1), allow, 1, no(r, 2, 0, us(1), us(1))},
			{23 * h, allow, 1, ok(r, 2, 1, 24*h)},
		})
	})
	t.Run("fixed_window/CalendarWeek", func(t *testing.T) {
		e := newEnv(t, newStore)
		e.from(time.Date(2024, 1, 3, 10, 0, 0, 0, time.UTC)) // a Wednesday
		sunday := e.limiter("sunday", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 1, Calendar: floodgate.CalendarWeek})
		monday := e.limiter("monday", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 1, Calendar: floodgate.CalendarWeek, WeekStart: time.Monday})
		const r = "1/week"
		d := 24 * time.Hour
		e.script(sunday, "k", []step{
			{0, allow, 1, ok(r, 1, 0, 3*d+14*time.Hour)},
			{3*d + 13*time.Hour, allow, 1, no(r, 1, 0, time.Hour, time.Hour)},
			{3*d + 14*time.Hour, allow, 1, ok(r, 1, 0, 7*d)},
		})
		e.script(monday, "k", []step{
			{0, allow, 1, ok(r, 1, 0, 4*d+14*time.Hour)},
			{3*d + 14*time.Hour, allow, 1, no(r, 1, 0, d, d)}, // Sunday
			{4*d + 14*time.Hour, allow, 1, ok(r, 1, 0, 7*d)},
		})
	})
	t.Run("fixed_window/CalendarMonth", func(t *testing.T) {
		e := newEnv(t, newStore)
		e.from(time.Date(2024, 2, 15, 12, 0, 0, 0, time.UTC))
		l := e.limiter("p", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 2, Calendar: floodgate.CalendarMonth})
		const r = "2/month"
		d := 24 * time.Hour
		e.script(l, "k", []step{
			{0, allow, 2, ok(r, 2, 0, 14*d+12*time.Hour)}, // 2024 is a leap year
			{14 * d, allow, 1, no(r, 2, 0, 12*time.Hour, 12*time.Hour)},
			{14*d + 12*time.Hour, allow, 1, ok(r, 2, 1, 31*d)},
		})
	})

	// Months and weeks in a time zone with daylight saving time.
	t.Run("fixed_window/CalendarDST", func(t *testing.T) {
		e := newEnv(t, newStore)
		ny, err := time.LoadLocation("America/New_York")
		if err != nil {
			t.Fatal(err)
		}
		e.from(time.Date(2024, 3, 1, 0, 0, 0, 0, ny))
		month := e.limiter("month", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 1, Calendar: floodgate.CalendarMonth, Location: ny})
		e.expect("March", e.allow(month, "k"), ok("1/month", 1, 0, 31*24*time.Hour-time.Hour))
		// A week from Saturday, over the end of DST on Sunday 3 November.
		e.from(time.Date(2024, 11, 2, 12, 0, 0, 0, ny))
		week := e.limiter("week", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 1, Calendar: floodgate.CalendarWeek, Location: ny, WeekStart: time.Saturday})
		e.expect("week", e.allow(week, "k"), ok("1/week", 1, 0, 6*24*time.Hour+13*time.Hour))
	})

	// Where clocks change at midnight (Havana), a day starts at the first
	// instant of its date: 01:00 when midnight is skipped, the first of two
	// midnights when it repeats.
	t.Run("fixed_window/CalendarMidnightDST", func(t *testing.T) {
		e := newEnv(t, newStore)
		havana, err := time.LoadLocation("America/Havana")
		if err != nil {
			t.Fatal(err)
		}
		h := time.Hour
		l := e.limiter("p", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 1, Calendar: floodgate.CalendarDay, Location: havana})
		const r = "1/day"
		// 10 March 2024 begins at 01:00 CDT (05:00 UTC) and lasts 23 hours.
		e.from(time.Date(2024, 3, 9, 17, 0, 0, 0, time.UTC)) // 12:00 CST on the 9th
		e.script(l, "k", []step{
			{0, allow, 1, ok(r, 1, 0, 12*h)},
			{12*h - us(1), allow, 1, no(r, 1, 0, us(1), us(1))},
			{12 * h, allow, 1, ok(r, 1, 0, 23*h)},
		})
		// 3 November 2024 begins at the first midnight, 00:00 CDT (04:00
		// UTC), and lasts 25 hours.
		e.from(time.Date(2024, 11, 2, 16, 0, 0, 0, time.UTC)) // 12:00 CDT on the 2nd
		e.script(l, "k2", []step{
			{0, allow, 1, ok(r, 1, 0, 12*h)},
			{12 * h, allow, 1, ok(r, 1, 0, 25*h)},
			{13*h + 30*time.Minute, allow, 1, no(r, 1, 0, 23*h+30*time.Minute, 23*h+30*time.Minute)}, // the second 00:30
		})
	})

	// The sliding log admits while fewer than Limit admitted requests fall
	// in the last Period; a request leaves the window exactly Period later.
	t.Run("sliding_log", func(t *testing.T) {
		e := newEnv(t, newStore)
		l := e.limiter("p", floodgate.Rule{Name: "r", Algorithm: floodgate.SlidingLog, Limit: 3, Period: time.Minute})
		s := time.Second
		e.script(l, "k", []step{
			{0, peek, 0, ok("r", 3, 3, 0)},
			{0, allow, 1, ok("r", 3, 2, 60*s)},
			{10 * s, allow, 1, ok("r", 3, 1, 60*s)},
			{20 * s, allow, 1, ok("r", 3, 0, 60*s)},
			{30 * s, allow, 1, no("r", 3, 0, 50*s, 30*s)},
			{30 * s, allow, 2, no("r", 3, 0, 50*s, 40*s)},
			{60*s - us(1), allow, 1, no("r", 3, 0, 20*s+us(1), us(1))},
			{60 * s, allow, 1, ok("r", 3, 0, 60*s)},
			{60 * s, allow, 1, no("r", 3, 0, 60*s, 10*s)},
			{79 * s, allow, 2, no("r", 3, 1, 41*s, 1*s)},
			{80 * s, allow, 2, ok("r", 3, 0, 60*s)},
			{80 * s, allow, 4, tooLarge("r", 3, 0, 60*s)},
		})
	})
	// With CountRejected a client that keeps trying stays locked out.
	t.Run("sliding_log/CountRejected", func(t *testing.T) {
		e := newEnv(t, newStore)
		l := e.limiter("p", floodgate.Rule{Name: "r", Algorithm: floodgate.SlidingLog, Limit: 1, Period: time.Minute, CountRejected: true})
		s := time.Second
		e.script(l, "k", []step{
			{0, allow, 1, ok("r", 1, 0, 60*s)},
			{30 * s, allow, 1, no("r", 1, 0, 60*s, 60*s)},
			{60 * s, allow, 1, no("r", 1, 0, 60*s, 60*s)},
			// Peeking records nothing.
			{90 * s, peek, 1, no("r", 1, 0, 30*s, 30*s)},
			{120 * s, allow, 1, ok("r", 1, 0, 60*s)},
			// Nor does a cost that can never fit.
			{150 * s, allow, 2, tooLarge("r", 1, 0, 30*s)},
			{180 * s, allow, 1, ok("r", 1, 0, 60*s)},
		})
	})

	// A recorded rejection is an entry like any other: the window holds
	// three where two fit, so even a peek of cost 0 is refused until the
	// oldest ages out (issue 18).
	t.Run("sliding_log/CountRejectedPeek", func(t *testing.T) {
		e := newEnv(t, newStore)
		l := e.limiter("p", floodgate.Rule{Name: "r", Algorithm: floodgate.SlidingLog, Limit: 2, Period: time.Minute, CountRejected: true})
		s := time.Second
		e.script(l, "k", []step{
			{0, allow, 1, ok("r", 2, 1, 60*s)},
			{1 * s, allow, 1, ok("r", 2, 0, 60*s)},
			{2 * s, allow, 1, no("r", 2, 0, 60*s, 59*s)},
			{2 * s, peek, 0, no("r", 2, 0, 60*s, 58*s)},
			{60 * s, peek, 0, ok("r", 2, 0, 2*s)},
			{60 * s, allow, 1, no("r", 2, 0, 60*s, 2*s)},
			// four in the window where two fit: a peek waits for the
			// older two
			{60 * s, allow, 1, no("r", 2, 0, 60*s, 60*s)},
			{61 * s, peek, 0, no("r", 2, 0, 59*s, 1*s)},
			{62 * s, peek, 0, ok("r", 2, 0, 58*s)},
		})
	})

	// The sliding window counter's basic arithmetic; the seed example in
	// Seeds/SlidingWindow7PerMinute has the weighting and rounding.
	t.Run("sliding_window", func(t *testing.T) {
		e := newEnv(t, newStore)
		l := e.limiter("p", floodgate.Rule{Name: "r", Algorithm: floodgate.SlidingWindow, Limit: 4, Period: time.Minute})
		s := time.Second
		e.script(l, "k", []step{
			{0, peek, 0, ok("r", 4, 4, 0)},
			// Four in the window at 0 s are forgotten when
			// floor(4(60-e)/60) = 0 in the next window: e > 45 s.
			{0, allow, 4, ok("r", 4, 0, 105*s+us(1))},
			{30 * s, allow, 1, no("r", 4, 0, 75*s+us(1), 30*s+us(1))},
			// At 15 s into the next window floor(4×45/60) = 3 count.
			// The one request of this window is forgotten 1 µs into the next.
			{75 * s, allow, 1, ok("r", 4, 0, 45*s+us(1))},
			// 1 + 3 = 4 count until floor(4(60-e)/60) <= 2, e > 15 s.
			{75 * s, allow, 1, no("r", 4, 0, 45*s+us(1), us(1))},
			{75*s + us(1), allow, 1, ok("r", 4, 0, 75*s)},
			// Two windows later nothing counts.
			{180 * s, peek, 0, ok("r", 4, 4, 0)},
			{180 * s, allow, 5, tooLarge("r", 4, 4, 0)},
		})
	})

	// Sub-windows of 15 s: a request counts until its sub-window is a
	// whole period old.
	t.Run("sliding_subwindow", func(t *testing.T) {
		e := newEnv(t, newStore)
		l := e.limiter("p", floodgate.Rule{Name: "r", Algorithm: floodgate.SlidingSubwindow, Limit: 4, Period: time.Minute, Granularity: 15 * time.Second})
		s := time.Second
		e.script(l, "k", []step{
			{0, peek, 0, ok("r", 4, 4, 0)},
			{0, allow, 2, ok("r", 4, 2, 60*s)},
			{20 * s, allow, 1, ok("r", 4, 1, 55*s)},
			{40 * s, allow, 1, ok("r", 4, 0, 50*s)},
			{50 * s, allow, 1, no("r", 4, 0, 40*s, 10*s)},
			{50 * s, allow, 3, no("r", 4, 0, 40*s, 25*s)},
			{60 * s, allow, 2, ok("r", 4, 0, 60*s)},
			{75*s - us(1), allow, 1, no("r", 4, 0, 45*s+us(1), us(1))},
			{75 * s, allow, 1, ok("r", 4, 0, 60*s)},
			{75 * s, allow, 5, tooLarge("r", 4, 0, 60*s)},
			{300 * s, peek, 0, ok("r", 4, 4, 0)},
		})
	})

	// The shaper queues up to Burst requests leaving Limit per Period.
	// Allow admits only into an empty queue (no wait); Reserve queues with
	// a Delay; Remaining is the room left in the queue.
	t.Run("leaky_bucket_shaper", func(t *testing.T) {
		e := newEnv(t, newStore)
		l := e.limiter("p", floodgate.Rule{Name: "r", Algorithm: floodgate.LeakyBucketShaper, Limit: 2, Period: time.Second, Burst: 3})
		ms := time.Millisecond
		e.script(l, "k", []step{
			{0, peek, 0, ok("r", 2, 3, 0)},
			{0, allow, 1, ok("r", 2, 2, 500*ms)},
			{0, allow, 1, no("r", 2, 2, 500*ms, 500*ms)},
			{0, reserve, 1, delayed(ok("r", 2, 1, time.Second), 500*ms)},
			{0, reserve, 1, delayed(ok("r", 2, 0, 1500*ms), time.Second)},
			{0, reserve, 1, no("r", 2, 0, 1500*ms, 1500*ms)},
			{200 * ms, reserve, 1, no("r", 2, 0, 1300*ms, 1300*ms)},
			{500 * ms, reserve, 1, delayed(ok("r", 2, 0, 1500*ms), time.Second)},
			{2 * time.Second, allow, 1, ok("r", 2, 2, 500*ms)},
			{2 * time.Second, reserve, 4, tooLarge("r", 2, 2, 500*ms)},
			{3 * time.Second, allow, 3, ok("r", 2, 0, 1500*ms)},
		})
	})
}

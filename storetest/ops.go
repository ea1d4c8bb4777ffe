package storetest

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
)

// algoCase is one rule of every algorithm and mode, for the tests that run
// on all of them. Each rule is named "r" and limits to 10 per minute.
type algoCase struct {
	name    string
	rule    floodgate.Rule
	burst   int64 // how many requests Allow admits at once on a fresh key
	room    int64 // Remaining of a fresh key
	ceiling int64 // the largest cost ever admitted
	bucket  bool  // Wait and Reserve lend future capacity
}

func algoCases() []algoCase {
	m := time.Minute
	rule := func(a floodgate.Algorithm) floodgate.Rule {
		return floodgate.Rule{Name: "r", Algorithm: a, Limit: 10, Period: m}
	}
	tbBurst := rule(floodgate.TokenBucket)
	tbBurst.Burst = 20
	interval := rule(floodgate.TokenBucket)
	interval.Refill = floodgate.RefillInterval
	calendar := rule(floodgate.FixedWindow)
	calendar.Period, calendar.Calendar = 0, floodgate.CalendarDay
	logCR := rule(floodgate.SlidingLog)
	logCR.CountRejected = true
	sub := rule(floodgate.SlidingSubwindow)
	sub.Granularity = 10 * time.Second
	soft := rule(floodgate.FixedWindow)
	soft.Mode, soft.SoftPercent = floodgate.Soft, 50
	elastic := rule(floodgate.TokenBucket)
	elastic.Mode, elastic.ElasticCeiling, elastic.Spare = floodgate.Elastic, 15, func() bool { return true }
	return []algoCase{
		{"token_bucket", rule(floodgate.TokenBucket), 10, 10, 10, true},
		{"token_bucket_burst", tbBurst, 20, 20, 20, true},
		{"token_bucket_interval", interval, 10, 10, 10, true},
		{"leaky_bucket", rule(floodgate.LeakyBucket), 10, 10, 10, true},
		{"leaky_bucket_shaper", rule(floodgate.LeakyBucketShaper), 1, 10, 10, true},
		{"gcra", rule(floodgate.GCRA), 10, 10, 10, true},
		{"fixed_window", rule(floodgate.FixedWindow), 10, 10, 10, false},
		{"fixed_window_day", calendar, 10, 10, 10, false},
		{"sliding_log", rule(floodgate.SlidingLog), 10, 10, 10, false},
		{"sliding_log_count_rejected", logCR, 10, 10, 10, false},
		{"sliding_window", rule(floodgate.SlidingWindow), 10, 10, 10, false},
		{"sliding_subwindow", sub, 10, 10, 10, false},
		{"soft_fixed_window", soft, 15, 10, 15, false},
		{"elastic_token_bucket", elastic, 15, 10, 15, true},
	}
}

// exhaust admits requests of cost 1 until one is denied and returns how
// many were admitted.
func (e *env) exhaust(l *floodgate.Limiter, key string) int64 {
	e.t.Helper()
	for n := int64(0); ; n++ {
		if d := e.allow(l, key); !d.Allowed {
			if d.Reason != floodgate.ReasonLimited || d.RetryAfter <= 0 {
				e.t.Errorf("denial after %d admitted: %s", n, show(d))
			}
			return n
		}
		if n > 1000 {
			e.t.Fatal("no denial after 1000 requests")
		}
	}
}

func testOps(t *testing.T, newStore NewStore) {
	// AllowN takes its whole cost or nothing; PeekN and AllowN(0) report
	// without consuming.
	t.Run("Cost", func(t *testing.T) {
		e := newEnv(t, newStore)
		l := e.limiter("p", floodgate.Rule{Name: "r", Limit: 10, Period: time.Second})
		ms := time.Millisecond
		e.script(l, "k", []step{
			{0, allow, 4, ok("r", 10, 6, 400*ms)},
			{0, allow, 7, no("r", 10, 6, 400*ms, 100*ms)},
			{0, peek, 7, no("r", 10, 6, 400*ms, 100*ms)},
			{0, peek, 6, ok("r", 10, 6, 400*ms)},
			{0, peek, 0, ok("r", 10, 6, 400*ms)},
			{0, allow, 6, ok("r", 10, 0, time.Second)},
			// Cost 0 always fits: it reports the state, never denied.
			{0, peek, 0, ok("r", 10, 0, time.Second)},
			{0, peek, 1, no("r", 10, 0, time.Second, 100*ms)},
			{0, peek, 11, tooLarge("r", 10, 0, time.Second)},
		})
		// AllowN(0) is a peek.
		d, err := l.AllowN(e.ctx, "k", 0)
		if err != nil {
			t.Fatal(err)
		}
		e.expect("AllowN(0)", d, ok("r", 10, 0, time.Second))
		e.expect("AllowN(0) on a fresh key", e.peek(l, "fresh", 0), ok("r", 10, 10, 0))
	})

	// Peeks of any cost, and AllowN(0), consume nothing on any algorithm.
	for _, c := range algoCases() {
		t.Run("PeekConsumesNothing/"+c.name, func(t *testing.T) {
			e := newEnv(t, newStore)
			l := e.limiter("p", c.rule)
			for n := range c.ceiling + 2 {
				e.peek(l, "k", n)
				if d, err := l.AllowN(e.ctx, "k", 0); err != nil || !d.Allowed || d.Remaining != c.room {
					t.Fatalf("AllowN(0) on a fresh key: %s, %v; want allowed with %d remaining", show(d), err, c.room)
				}
			}
			if n := e.exhaust(l, "k"); n != c.burst {
				t.Errorf("admitted %d after peeks, want %d", n, c.burst)
			}
			before := e.peek(l, "k", 1)
			// exhausting ends with a refusal, which a log counting
			// rejections records: it holds more than fits, and even cost
			// 0 waits
			fits := !c.rule.CountRejected
			for n := range c.ceiling + 2 {
				e.peek(l, "k", n)
				d, err := l.AllowN(e.ctx, "k", 0)
				if err != nil || d.Allowed != fits || fits && (d.RetryAfter != 0 || d.Reason != floodgate.ReasonNone) {
					t.Fatalf("AllowN(0) on a spent key: %s, %v; want allowed %v", show(d), err, fits)
				}
			}
			e.expect("peek after peeks", e.peek(l, "k", 1), before)
		})
	}

	// Charge records its cost whether or not it fits, clamped at what the
	// rule can ever hold; Allowed reports whether it fitted.
	t.Run("Charge", func(t *testing.T) {
		e := newEnv(t, newStore)
		l := e.limiter("p", floodgate.Rule{Name: "r", Algorithm: floodgate.FixedWindow, Limit: 10, Period: time.Minute})
		m := time.Minute
		e.script(l, "k", []step{
			{0, allow, 8, ok("r", 10, 2, m)},
			{0, charge, 5, no("r", 10, 0, m, m)},
			// Clamped at 10: giving back 3 leaves 7, not 10.
			{0, refund, 3, ok("r", 10, 3, m)},
			{0, charge, 2, ok("r", 10, 1, m)},
			// More than the rule can ever admit: recorded, clamped, and
			// reported as too large (no wait helps).
			{0, charge, 50, tooLarge("r", 10, 0, m)},
			{0, refund, 1, ok("r", 10, 1, m)},
			{m, charge, 1, ok("r", 10, 9, m)},
		})
	})
	for _, c := range algoCases() {
		t.Run("ChargeClamped/"+c.name, func(t *testing.T) {
			e := newEnv(t, newStore)
			l := e.limiter("p", c.rule)
			d := e.do(l, "k", charge, 3)
			if !d.Allowed || d.Remaining != c.room-3 || d.Reason != floodgate.ReasonNone {
				t.Errorf("Charge(3) on a fresh key: %s; want allowed with %d remaining", show(d), c.room-3)
			}
			d = e.do(l, "k", charge, c.ceiling)
			if d.Allowed || d.Remaining != 0 || d.Reason != floodgate.ReasonLimited || d.RetryAfter <= 0 {
				t.Errorf("Charge(%d) over the ceiling: %s; want denied, limited, 0 remaining", c.ceiling, show(d))
			}
			d = e.do(l, "k", charge, c.ceiling+5)
			if d.Allowed || d.Remaining != 0 || d.Reason != floodgate.ReasonCostTooLarge || d.RetryAfter != 0 {
				t.Errorf("Charge(%d), more than can ever fit: %s; want denied, cost_too_large, 0 remaining", c.ceiling+5, show(d))
			}
			if d := e.peek(l, "k", 1); d.Allowed {
				t.Errorf("after an overcharge: %s; want denied", show(d))
			}
			// The count was clamped at the ceiling: refunding the ceiling
			// leaves a fresh key.
			e.do(l, "k", refund, c.ceiling)
			e.expect("after refunding the ceiling", e.peek(l, "k", 0), ok("r", 10, c.room, 0))
			if n := e.exhaust(l, "k"); n != c.burst {
				t.Errorf("admitted %d after the refund, want %d", n, c.burst)
			}
		})
	}

	// Refund gives back the newest consumption first, never below zero.
	t.Run("Refund/SlidingLog", func(t *testing.T) {
		e := newEnv(t, newStore)
		l := e.limiter("p", floodgate.Rule{Name: "r", Algorithm: floodgate.SlidingLog, Limit: 3, Period: time.Minute})
		s := time.Second
		e.script(l, "k", []step{
			{0, allow, 1, ok("r", 3, 2, 60*s)},
			{10 * s, allow, 1, ok("r", 3, 1, 60*s)},
			{20 * s, allow, 1, ok("r", 3, 0, 60*s)},
			// The request of 20 s is given back: the newest left is 10 s.
			{25 * s, refund, 1, ok("r", 3, 1, 45*s)},
			{25 * s, allow, 1, ok("r", 3, 0, 60*s)},
			{30 * s, refund, 100, ok("r", 3, 3, 0)},
			{30 * s, allow, 3, ok("r", 3, 0, 60*s)},
		})
	})
	t.Run("Refund/SlidingSubwindow", func(t *testing.T) {
		e := newEnv(t, newStore)
		l := e.limiter("p", floodgate.Rule{Name: "r", Algorithm: floodgate.SlidingSubwindow, Limit: 4, Period: time.Minute, Granularity: 15 * time.Second})
		s := time.Second
		e.script(l, "k", []step{
			{0, allow, 1, ok("r", 4, 3, 60*s)},
			{20 * s, allow, 2, ok("r", 4, 1, 55*s)},
			// Both of the sub-window at 15 s go back; the one at 0 s stays.
			{25 * s, refund, 2, ok("r", 4, 3, 35*s)},
			{25 * s, allow, 3, ok("r", 4, 0, 50*s)},
			{30 * s, refund, 100, ok("r", 4, 4, 0)},
		})
	})
	// The sliding window counter gives back the current window's requests
	// first, then the previous window's.
	t.Run("Refund/SlidingWindow", func(t *testing.T) {
		e := newEnv(t, newStore)
		l := e.limiter("p", floodgate.Rule{Name: "r", Algorithm: floodgate.SlidingWindow, Limit: 4, Period: time.Minute})
		s := time.Second
		e.script(l, "k", []step{
			{50 * s, allow, 3, ok("r", 4, 1, 50*s+us(1))},
			// 10 s into the next window: 0 + floor(3×50/60) = 2 counted.
			{70 * s, allow, 1, ok("r", 4, 1, 50*s+us(1))},
			// One back from this window, one from the previous: 0 +
			// floor(2×50/60) = 1 counted.
			{70 * s, refund, 2, ok("r", 4, 3, 20*s+us(1))},
			{70 * s, refund, 5, ok("r", 4, 4, 0)},
		})
	})
	t.Run("Refund/Buckets", func(t *testing.T) {
		e := newEnv(t, newStore)
		l := e.limiter("p", floodgate.Rule{Name: "r", Limit: 10, Period: time.Second})
		ms := time.Millisecond
		e.script(l, "k", []step{
			{0, refund, 5, ok("r", 10, 10, 0)}, // a fresh key stays fresh
			{0, allow, 10, ok("r", 10, 0, time.Second)},
			{0, refund, 3, ok("r", 10, 3, 700*ms)},
			{0, refund, 30, ok("r", 10, 10, 0)},
			{0, allow, 10, ok("r", 10, 0, time.Second)},
		})
	})

	// Reset forgets the key.
	for _, c := range algoCases() {
		t.Run("Reset/"+c.name, func(t *testing.T) {
			e := newEnv(t, newStore)
			l := e.limiter("p", c.rule)
			e.at(5 * time.Second)
			if n := e.exhaust(l, "k"); n != c.burst {
				t.Errorf("admitted %d, want %d", n, c.burst)
			}
			if err := l.Reset(e.ctx, "k"); err != nil {
				t.Fatal(err)
			}
			e.expect("after Reset", e.peek(l, "k", 0), ok("r", 10, c.room, 0))
			if n := e.exhaust(l, "k"); n != c.burst {
				t.Errorf("admitted %d after Reset, want %d", n, c.burst)
			}
			// Resetting a key never seen is harmless.
			if err := l.Reset(e.ctx, "other"); err != nil {
				t.Fatal(err)
			}
			e.expect("a key never seen, after Reset", e.peek(l, "other", 0), ok("r", 10, c.room, 0))
		})
	}

	// A cost beyond what a rule can ever admit is denied for good, not
	// limited: no RetryAfter, and Wait returns ErrCostTooLarge at once.
	for _, c := range algoCases() {
		t.Run("CostTooLarge/"+c.name, func(t *testing.T) {
			e := newEnv(t, newStore)
			l := e.limiter("p", c.rule)
			want := tooLarge("r", 10, c.room, 0)
			e.expect("AllowN", e.allowN(l, "k", c.ceiling+1), want)
			e.expect("PeekN", e.peek(l, "k", c.ceiling+1), want)
			e.expect("Reserve", e.do(l, "k", reserve, c.ceiling+1), want)
			d, err := l.WaitN(e.ctx, "k", c.ceiling+1)
			if !errors.Is(err, floodgate.ErrCostTooLarge) {
				t.Errorf("WaitN: %v, want ErrCostTooLarge", err)
			}
			e.expect("WaitN", d, want)
			if n := e.clk.Sleepers(); n != 0 {
				t.Errorf("%d sleepers after WaitN", n)
			}
			// Nothing was consumed, and the ceiling itself is admitted.
			e.expect("after", e.peek(l, "k", 0), ok("r", 10, c.room, 0))
			if d := e.do(l, "k", reserve, c.ceiling); !d.Allowed || d.Delay != 0 {
				t.Errorf("Reserve(%d): %s; want allowed at once", c.ceiling, show(d))
			}
		})
	}
	// Costs near the int64 limit overflow nothing: too large to admit,
	// recorded clamped, refunded to zero.
	for _, c := range algoCases() {
		t.Run("HugeCost/"+c.name, func(t *testing.T) {
			e := newEnv(t, newStore)
			l := e.limiter("p", c.rule)
			const huge = math.MaxInt64
			e.allow(l, "k")
			for _, op := range []floodgate.OpKind{allow, peek, reserve} {
				if d := e.do(l, "k", op, huge); d.Allowed || d.Reason != floodgate.ReasonCostTooLarge || d.Remaining != c.room-1 {
					t.Errorf("%s(MaxInt64): %s; want cost_too_large with %d remaining", op, show(d), c.room-1)
				}
			}
			if d := e.do(l, "k", charge, huge); d.Allowed || d.Reason != floodgate.ReasonCostTooLarge || d.Remaining != 0 {
				t.Errorf("Charge(MaxInt64): %s; want cost_too_large, 0 remaining", show(d))
			}
			e.expect("Refund(MaxInt64)", e.do(l, "k", refund, huge), ok("r", 10, c.room, 0))
			if n := e.exhaust(l, "k"); n != c.burst {
				t.Errorf("admitted %d after the refund, want %d", n, c.burst)
			}
		})
	}

	// In a policy of several rules, the rule that cannot admit the cost
	// reports it.
	t.Run("CostTooLarge/Policy", func(t *testing.T) {
		e := newEnv(t, newStore)
		l := e.limiter("p",
			floodgate.Rule{Name: "big", Limit: 100, Period: time.Second},
			floodgate.Rule{Name: "small", Algorithm: floodgate.FixedWindow, Limit: 10, Period: time.Minute},
			floodgate.Rule{Name: "other", Algorithm: floodgate.SlidingLog, Limit: 50, Period: time.Minute})
		e.expect("AllowN(11)", e.allowN(l, "k", 11), tooLarge("small", 10, 10, 0))
		e.expect("AllowN(10)", e.allowN(l, "k", 10), ok("small", 10, 0, time.Minute))
	})

	// A negative cost is a caller's error, named, and consumes nothing.
	t.Run("NegativeCost", func(t *testing.T) {
		e := newEnv(t, newStore)
		l := e.limiter("p", floodgate.Rule{Name: "r", Limit: 10, Period: time.Second})
		calls := map[string]func() error{
			"AllowN": func() error { _, err := l.AllowN(e.ctx, "k", -1); return err },
			"PeekN":  func() error { _, err := l.PeekN(e.ctx, "k", -1); return err },
			"Charge": func() error { _, err := l.Charge(e.ctx, "k", -1); return err },
			"Refund": func() error { _, err := l.Refund(e.ctx, "k", -1); return err },
			"Reserve": func() error {
				r, err := l.Reserve(e.ctx, "k", -1)
				if r != nil && r.OK() {
					t.Error("Reserve(-1) is OK")
				}
				return err
			},
			"WaitN": func() error { _, err := l.WaitN(e.ctx, "k", -1); return err },
		}
		e.allowN(l, "k", 4)
		for name, call := range calls {
			var pe *floodgate.ParamError
			if err := call(); !errors.As(err, &pe) || pe.Field != "cost" {
				t.Errorf("%s(-1): %v; want a *ParamError for cost", name, err)
			}
			e.expect(name+"(-1) consumed nothing", e.peek(l, "k", 0), ok("r", 10, 6, 400*time.Millisecond))
		}
		var pe *floodgate.ParamError
		out := make([]floodgate.Decision, 2)
		err := floodgate.AllowBatch(e.ctx, []floodgate.Item{{Limiter: l, Key: "k", Cost: 1}, {Limiter: l, Key: "k", Cost: -1}}, out)
		if !errors.As(err, &pe) || pe.Field != "items[1].Cost" {
			t.Errorf("AllowBatch with a negative cost: %v; want a *ParamError for items[1].Cost", err)
		}
		e.expect("AllowBatch with a negative cost consumed nothing", e.peek(l, "k", 0), ok("r", 10, 6, 400*time.Millisecond))
	})

	// A store answers an error for an op it cannot perform, rather than
	// panicking or deciding.
	t.Run("NoPolicy", func(t *testing.T) {
		e := newEnv(t, newStore)
		if _, err := e.store.Do(context.Background(), e.clk.NowMicro(), floodgate.Op{Key: "k", Kind: floodgate.OpAllow, Cost: 1}); err == nil {
			t.Error("Do without a policy: no error")
		}
	})
}

package storetest

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
)

// Throttling modes: hard admits nothing beyond the limit (every other
// test); soft admits SoftPercent beyond it; elastic admits beyond it, up to
// ElasticCeiling, only while Spare reports spare capacity. Admissions
// beyond the limit are marked Excess; Remaining never counts the allowance.
func testModes(t *testing.T, newStore NewStore) {
	t.Run("Soft/FixedWindow", func(t *testing.T) {
		e := newEnv(t, newStore)
		// 100 a minute with 10% over admits 110 (seed 001); here 10 + 20%.
		l := e.limiter("p", floodgate.Rule{Name: "r", Algorithm: floodgate.FixedWindow, Limit: 10, Period: time.Minute, Mode: floodgate.Soft, SoftPercent: 20})
		m := time.Minute
		var steps []step
		for i := range 10 {
			steps = append(steps, step{0, allow, 1, ok("r", 10, int64(9-i), m)})
		}
		steps = append(steps,
			step{0, allow, 1, excess(ok("r", 10, 0, m))},
			step{0, allow, 1, excess(ok("r", 10, 0, m))},
			step{0, allow, 1, no("r", 10, 0, m, m)},
			step{0, allow, 13, tooLarge("r", 10, 0, m)},
			step{m, allow, 12, excess(ok("r", 10, 0, m))},
			step{2 * m, allow, 10, ok("r", 10, 0, m)},
		)
		e.script(l, "k", steps)
	})
	t.Run("Soft/TokenBucket", func(t *testing.T) {
		e := newEnv(t, newStore)
		l := e.limiter("p", floodgate.Rule{Name: "r", Limit: 10, Period: time.Second, Mode: floodgate.Soft, SoftPercent: 50})
		ms := time.Millisecond
		e.script(l, "k", []step{
			{0, allow, 10, ok("r", 10, 0, time.Second)},
			{0, allow, 1, excess(ok("r", 10, 0, 1100*ms))},
			{0, allow, 4, excess(ok("r", 10, 0, 1500*ms))},
			{0, allow, 1, no("r", 10, 0, 1500*ms, 100*ms)},
			{0, allow, 16, tooLarge("r", 10, 0, 1500*ms)},
			{600 * ms, peek, 0, ok("r", 10, 1, 900*ms)},
			{600 * ms, allow, 1, ok("r", 10, 0, time.Second)},
			{600 * ms, allow, 1, excess(ok("r", 10, 0, 1100*ms))},
		})
	})
	// A percentage too small for one request still allows one more.
	t.Run("Soft/AtLeastOne", func(t *testing.T) {
		e := newEnv(t, newStore)
		l := e.limiter("p", floodgate.Rule{Name: "r", Algorithm: floodgate.FixedWindow, Limit: 3, Period: time.Minute, Mode: floodgate.Soft, SoftPercent: 10})
		m := time.Minute
		e.script(l, "k", []step{
			{0, allow, 3, ok("r", 3, 0, m)},
			{0, allow, 1, excess(ok("r", 3, 0, m))},
			{0, allow, 1, no("r", 3, 0, m, m)},
		})
	})

	t.Run("Elastic/FixedWindow", func(t *testing.T) {
		e := newEnv(t, newStore)
		var spare atomic.Bool
		l := e.limiter("p", floodgate.Rule{Name: "r", Algorithm: floodgate.FixedWindow, Limit: 10, Period: time.Minute,
			Mode: floodgate.Elastic, ElasticCeiling: 15, Spare: spare.Load})
		m := time.Minute
		e.script(l, "k", []step{
			{0, allow, 10, ok("r", 10, 0, m)},
			{0, allow, 1, no("r", 10, 0, m, m)},
		})
		spare.Store(true)
		steps := []step{}
		for range 5 {
			steps = append(steps, step{0, allow, 1, excess(ok("r", 10, 0, m))})
		}
		steps = append(steps, step{0, allow, 1, no("r", 10, 0, m, m)})
		e.script(l, "k", steps)
		spare.Store(false)
		e.script(l, "k", []step{
			{30 * time.Second, allow, 1, no("r", 10, 0, 30*time.Second, 30*time.Second)},
			{m, allow, 10, ok("r", 10, 0, m)},
			{m, allow, 1, no("r", 10, 0, m, m)},
		})
		spare.Store(true)
		e.script(l, "k", []step{
			{2 * m, allow, 12, excess(ok("r", 10, 0, m))},
			{2 * m, allow, 3, excess(ok("r", 10, 0, m))},
			{2 * m, allow, 1, no("r", 10, 0, m, m)},
			{2 * m, allow, 16, tooLarge("r", 10, 0, m)},
		})
	})
	// Each elastic rule of a policy reads its own signal, here the second
	// rule's.
	t.Run("Elastic/SecondRule", func(t *testing.T) {
		e := newEnv(t, newStore)
		var spare atomic.Bool
		m := time.Minute
		l := e.limiter("p",
			floodgate.Rule{Name: "hard", Algorithm: floodgate.FixedWindow, Limit: 100, Period: m},
			floodgate.Rule{Name: "el", Algorithm: floodgate.FixedWindow, Limit: 10, Period: m, Mode: floodgate.Elastic, ElasticCeiling: 15, Spare: spare.Load},
			floodgate.Rule{Name: "soft", Algorithm: floodgate.FixedWindow, Limit: 50, Period: m, Mode: floodgate.Soft, SoftPercent: 10})
		e.script(l, "k", []step{
			{0, allow, 10, ok("el", 10, 0, m)},
			{0, allow, 1, no("el", 10, 0, m, m)},
		})
		spare.Store(true)
		e.script(l, "k", []step{
			{0, allow, 5, excess(ok("el", 10, 0, m))},
			{0, allow, 1, no("el", 10, 0, m, m)},
		})
		// In a batch too.
		out := make([]floodgate.Decision, 1)
		if err := floodgate.AllowBatch(e.ctx, []floodgate.Item{{Limiter: l, Key: "b", Cost: 12}}, out); err != nil {
			t.Fatal(err)
		}
		e.expect("batch", out[0], excess(ok("el", 10, 0, m)))
	})
	// The log of an elastic rule holds up to the elastic ceiling.
	t.Run("Elastic/SlidingLog", func(t *testing.T) {
		e := newEnv(t, newStore)
		var spare atomic.Bool
		spare.Store(true)
		l := e.limiter("p", floodgate.Rule{Name: "r", Algorithm: floodgate.SlidingLog, Limit: 3, Period: time.Minute,
			Mode: floodgate.Elastic, ElasticCeiling: 5, Spare: spare.Load})
		s := time.Second
		e.script(l, "k", []step{
			{0, allow, 1, ok("r", 3, 2, 60*s)},
			{10 * s, allow, 2, ok("r", 3, 0, 60*s)},
			{20 * s, allow, 2, excess(ok("r", 3, 0, 60*s))},
			{20 * s, allow, 1, no("r", 3, 0, 60*s, 40*s)},
		})
		spare.Store(false)
		e.script(l, "k", []step{
			// Back to the limit: 3 of the 5 must leave first, the third
			// (logged at 10 s) at 70 s.
			{30 * s, allow, 1, no("r", 3, 0, 50*s, 40*s)},
			{70 * s, allow, 1, ok("r", 3, 0, 60*s)},
			{70 * s, allow, 1, no("r", 3, 0, 60*s, 10*s)},
			{80 * s, allow, 1, ok("r", 3, 1, 60*s)},
		})
	})
}

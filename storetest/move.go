package storetest

import (
	"testing"
	"time"

	"github.com/floodgate/floodgate"
)

// testMove checks floodgate.Mover, on stores that are one: a key's state
// carried from one policy to another keeps what each rule (matched by
// name) has used, converted to the new rule's numbers and algorithm.
func testMove(t *testing.T, newStore NewStore) {
	e := newEnv(t, newStore)
	mv, isMover := e.store.(floodgate.Mover)
	if !isMover {
		t.Skip("not a floodgate.Mover")
	}
	move := func(from, to *floodgate.Policy, key string) {
		t.Helper()
		if err := mv.Move(e.ctx, e.clk.NowMicro(), from, to, key); err != nil {
			t.Fatalf("Move(%s → %s, %q): %v", from.Name(), to.Name(), key, err)
		}
	}
	m, h := time.Minute, time.Hour
	rules := func(perMinute int64, hourly floodgate.Algorithm) []floodgate.Rule {
		return []floodgate.Rule{
			{Name: "minute", Algorithm: floodgate.FixedWindow, Limit: perMinute, Period: m},
			{Name: "hour", Algorithm: hourly, Limit: 10, Period: h},
		}
	}
	base := e.policy("base", rules(100, floodgate.FixedWindow)...)
	over := e.policy("override", rules(50, floodgate.FixedWindow)...)
	lower := e.policy("lower", rules(2, floodgate.FixedWindow)...)
	logs := e.policy("logs", rules(50, floodgate.SlidingLog)...)
	lim := func(p *floodgate.Policy) *floodgate.Limiter {
		return floodgate.NewLimiter(p, e.store, floodgate.WithClock(e.clk))
	}
	e.at(10 * time.Second)
	e.allowN(lim(base), "k", 3)
	move(base, over, "k")
	e.expect("k under the override", e.peek(lim(over), "k", 0), ok("hour", 10, 7, h-10*time.Second))
	e.expect("k under the base, after the move", e.peek(lim(base), "k", 0), ok("hour", 10, 10, 0))
	// A lower per-minute limit: the minute's 3 are clamped to its 2.
	move(over, lower, "k")
	e.expect("k under the lower limit", e.peek(lim(lower), "k", 0), ok("minute", 2, 0, 50*time.Second))
	// Another algorithm: what was used counts as used now (and the hour
	// kept its 3 through the lower limit).
	move(lower, logs, "k")
	if d := e.peek(lim(logs), "k", 0); d.Remaining != 7 || d.Rule != "hour" {
		t.Errorf("k under sliding logs: %s, want the hour's 7 left", show(d))
	}
	// A key with nothing under from keeps what it has under to.
	e.allowN(lim(over), "z", 1)
	move(base, over, "z")
	e.expect("z under the override", e.peek(lim(over), "z", 0), ok("hour", 10, 9, h-10*time.Second))
	// Requests decided under to before the move (the override already
	// visible, the key's count not yet carried) are kept: added to what is
	// carried, each rule clamped to its capacity.
	e.allowN(lim(base), "r", 3)
	e.allowN(lim(over), "r", 2)
	move(base, over, "r")
	e.expect("r under the override", e.peek(lim(over), "r", 0), ok("hour", 10, 5, h-10*time.Second))
	e.allowN(lim(lower), "r2", 1)
	e.allowN(lim(base), "r2", 3)
	move(base, lower, "r2") // the minute's 3 + 1, clamped to its 2
	e.expect("r2 under the lower limit", e.peek(lim(lower), "r2", 0), ok("minute", 2, 0, 50*time.Second))
	e.allowN(lim(logs), "r3", 2)
	e.allowN(lim(base), "r3", 3)
	move(base, logs, "r3") // the hourly log holds its 2 and gets the 3
	if d := e.peek(lim(logs), "r3", 0); d.Remaining != 5 || d.Rule != "hour" {
		t.Errorf("r3 under sliding logs: %s, want the hour's 5 left", show(d))
	}
	// Buckets add their levels exactly, fractions of a request included.
	tb10 := e.policy("tb10", floodgate.Rule{Name: "tb", Limit: 10, Period: m})
	tb20 := e.policy("tb20", floodgate.Rule{Name: "tb", Limit: 20, Period: m})
	e.allowN(lim(tb10), "b", 3)
	e.allowN(lim(tb20), "b", 2)
	move(tb10, tb20, "b")
	e.expect("b under 20 a minute", e.peek(lim(tb20), "b", 0), ok("tb", 20, 15, 15*time.Second))
	e.allowN(lim(tb20), "b2", 19)
	e.allowN(lim(tb10), "b2", 4)
	move(tb10, tb20, "b2") // 4 + 19, clamped to the 20
	e.expect("b2 under 20 a minute", e.peek(lim(tb20), "b2", 0), ok("tb", 20, 0, m))
	// Back to the base two minutes on: the minute's window has passed, the
	// hour's count stays.
	e.at(2*m + 10*time.Second)
	move(over, base, "z")
	e.expect("z back under the base", e.peek(lim(base), "z", 0), ok("hour", 10, 9, h-2*m-10*time.Second))
	e.expect("z left under the override", e.peek(lim(over), "z", 0), ok("hour", 10, 10, 0))
}

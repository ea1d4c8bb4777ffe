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
	// Back to the base two minutes on: the minute's window has passed, the
	// hour's count stays.
	e.at(2*m + 10*time.Second)
	move(over, base, "z")
	e.expect("z back under the base", e.peek(lim(base), "z", 0), ok("hour", 10, 9, h-2*m-10*time.Second))
	e.expect("z left under the override", e.peek(lim(over), "z", 0), ok("hour", 10, 10, 0))
}

package storetest

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
)

// testGroup checks all-or-nothing groups (floodgate.AllowAll and
// floodgate.DoGroup): their decisions on every store, and, on a store that
// decides groups atomically (floodgate.GroupStore), that no concurrent
// request ever sees part of a group applied.
func testGroup(t *testing.T, newStore NewStore) {
	t.Run("AllOrNothing", func(t *testing.T) {
		e := newEnv(t, newStore)
		m := time.Minute
		ip := e.limiter("ip", floodgate.Rule{Name: "ip", Algorithm: floodgate.FixedWindow, Limit: 3, Period: m})
		user := e.limiter("user", floodgate.Rule{Name: "user", Algorithm: floodgate.FixedWindow, Limit: 2, Period: m})
		all := func(items []floodgate.Item, admitted bool, want ...floodgate.Decision) {
			t.Helper()
			out := make([]floodgate.Decision, len(items))
			got, err := floodgate.AllowAll(e.ctx, items, out)
			if err != nil {
				t.Fatal(err)
			}
			if got != admitted {
				t.Errorf("AllowAll at %s admitted %v, want %v", e.now(), got, admitted)
			}
			for i := range items {
				e.expect(fmt.Sprintf("item %d (%s)", i, items[i].Key), out[i], want[i])
			}
		}
		both := []floodgate.Item{{Limiter: ip, Key: "10.0.0.1", Cost: 1}, {Limiter: user, Key: "alice", Cost: 1}}
		e.at(10 * time.Second)
		all(both, true, ok("ip", 3, 2, 50*time.Second), ok("user", 2, 1, 50*time.Second))
		all(both, true, ok("ip", 3, 1, 50*time.Second), ok("user", 2, 0, 50*time.Second))
		// alice is spent: the IP would admit on its own, and gives nothing.
		all(both, false, ok("ip", 3, 1, 50*time.Second), no("user", 2, 0, 50*time.Second, 50*time.Second))
		all(both, false, ok("ip", 3, 1, 50*time.Second), no("user", 2, 0, 50*time.Second, 50*time.Second))
		e.expect("the IP after two refusals", e.peek(ip, "10.0.0.1", 0), ok("ip", 3, 1, 50*time.Second))
		// One key twice is admitted only if both fit together: 2+1 of 3
		// does, 2+2 is more than the whole limit.
		twice := func(key string, a, b int64) []floodgate.Item {
			return []floodgate.Item{{Limiter: ip, Key: key, Cost: a}, {Limiter: ip, Key: key, Cost: b}}
		}
		all(twice("k", 2, 1), true, ok("ip", 3, 0, 50*time.Second), ok("ip", 3, 0, 50*time.Second))
		all(twice("k2", 2, 2), false, tooLarge("ip", 3, 3, 0), tooLarge("ip", 3, 3, 0))
		e.expect("k2 after", e.peek(ip, "k2", 0), ok("ip", 3, 3, 0))
		// A peek in a group reports and neither consumes nor blocks.
		bob := []floodgate.Item{{Limiter: user, Key: "bob", Cost: 1}, {Limiter: ip, Key: "k", Cost: 0}}
		all(bob, true, ok("user", 2, 1, 50*time.Second), ok("ip", 3, 0, 50*time.Second))
		e.at(m)
		all(both, true, ok("ip", 3, 2, m), ok("user", 2, 1, m))
	})

	t.Run("Mixed", func(t *testing.T) {
		// DoGroup with members and others in one batch: the others are
		// decided on their own, whatever the group's fate.
		e := newEnv(t, newStore)
		p := e.policy("p", floodgate.Rule{Name: "r", Algorithm: floodgate.FixedWindow, Limit: 1, Period: time.Minute})
		ops := []floodgate.Op{
			p.Op(floodgate.OpAllow, "free", 1, 0),
			p.Op(floodgate.OpAllow, "a", 1, 0),
			p.Op(floodgate.OpAllow, "b", 2, 0),
			p.Op(floodgate.OpAllow, "other", 1, 0),
		}
		group := []bool{false, true, true, false}
		out := make([]floodgate.Decision, len(ops))
		admitted, err := floodgate.DoGroup(e.ctx, e.store, e.clk.NowMicro(), ops, group, out)
		if err != nil {
			t.Fatal(err)
		}
		if admitted || !out[0].Allowed || !out[1].Allowed || out[2].Allowed || out[2].Reason != floodgate.ReasonCostTooLarge || !out[3].Allowed {
			t.Fatalf("admitted %v, decisions %v", admitted, out)
		}
		e.expect("a, untouched", e.do(floodgate.NewLimiter(p, e.store, floodgate.WithClock(e.clk)), "a", floodgate.OpPeek, 1), ok("r", 1, 1, 0))
		// Members need not be side by side: one that cannot fit refuses
		// the group across the others in between.
		ops = []floodgate.Op{
			p.Op(floodgate.OpAllow, "c", 1, 0),
			p.Op(floodgate.OpAllow, "free2", 1, 0),
			p.Op(floodgate.OpAllow, "d", 1, 0),
			p.Op(floodgate.OpAllow, "free", 1, 0), // spent above
			p.Op(floodgate.OpAllow, "other", 1, 0),
		}
		group = []bool{true, false, true, false, true}
		admitted, err = floodgate.DoGroup(e.ctx, e.store, e.clk.NowMicro(), ops, group, out[:0:0])
		if err == nil {
			t.Fatal("DoGroup with a short out: no error")
		}
		out = make([]floodgate.Decision, len(ops))
		if admitted, err = floodgate.DoGroup(e.ctx, e.store, e.clk.NowMicro(), ops, group, out); err != nil {
			t.Fatal(err)
		}
		if admitted || !out[0].Allowed || !out[1].Allowed || !out[2].Allowed || out[3].Allowed || out[4].Allowed {
			t.Fatalf("interleaved: admitted %v, decisions %v", admitted, out)
		}
		lim := floodgate.NewLimiter(p, e.store, floodgate.WithClock(e.clk))
		e.expect("c, untouched", e.do(lim, "c", floodgate.OpPeek, 1), ok("r", 1, 1, 0))
		e.expect("d, untouched", e.do(lim, "d", floodgate.OpPeek, 1), ok("r", 1, 1, 0))
		e.expect("free2, decided alone", e.do(lim, "free2", floodgate.OpPeek, 0), ok("r", 1, 0, time.Minute))
		if _, err := floodgate.DoGroup(e.ctx, e.store, e.clk.NowMicro(), []floodgate.Op{p.Op(floodgate.OpRefund, "a", 1, 0)}, []bool{true}, out); err == nil {
			t.Error("a refund in a group: no error")
		}
	})

	t.Run("Atomic", func(t *testing.T) {
		// Requests for a shared key A with a fresh key of their own
		// (always admitted by it) race requests for A with a spent key
		// (always refused). If a refused group ever held A's capacity,
		// even for a moment, some of the first kind would be refused: an
		// atomic store admits exactly A's limit of them.
		e := newEnv(t, newStore)
		probe := e.policy("probe", floodgate.Rule{Name: "r", Limit: 1, Period: time.Minute})
		if gs, ok := e.store.(floodgate.GroupStore); !ok {
			t.Skip("not a floodgate.GroupStore: AllowAll compensates")
		} else if err := gs.DoGroup(e.ctx, e.clk.NowMicro(), []floodgate.Op{probe.Op(floodgate.OpPeek, "x", 1, 0)}, []bool{true}, make([]floodgate.Decision, 1)); errors.Is(err, errors.ErrUnsupported) {
			t.Skip("this store compensates: ", err)
		}
		const limit = 200
		shared := e.limiter("shared", floodgate.Rule{Name: "shared", Algorithm: floodgate.FixedWindow, Limit: limit, Period: time.Hour})
		own := e.limiter("own", floodgate.Rule{Name: "own", Algorithm: floodgate.FixedWindow, Limit: 1, Period: time.Hour})
		e.allow(own, "spent")
		var admitted, wrong atomic.Int64
		var wg sync.WaitGroup
		const workers = 8
		for w := range workers {
			wg.Go(func() {
				out := make([]floodgate.Decision, 2)
				for i := range limit / (workers / 2) {
					spent := w%2 == 1
					key := fmt.Sprintf("fresh-%d-%d", w, i)
					if spent {
						key = "spent"
					}
					ok, err := floodgate.AllowAll(e.ctx, []floodgate.Item{{Limiter: shared, Key: "A", Cost: 1}, {Limiter: own, Key: key, Cost: 1}}, out)
					switch {
					case err != nil:
						t.Error(err)
						return
					case ok && spent:
						wrong.Add(1)
					case ok:
						admitted.Add(1)
					}
				}
			})
		}
		wg.Wait()
		if wrong.Load() != 0 || admitted.Load() != limit {
			t.Errorf("admitted %d of the %d requests with a fresh key (and %d with the spent key): a refused group held A's capacity", admitted.Load(), limit, wrong.Load())
		}
		e.expect("A after", e.peek(shared, "A", 1), no("shared", limit, 0, time.Hour, time.Hour))
	})
}

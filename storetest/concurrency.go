package storetest

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
)

// A clock that goes backwards (another server's skew, an NTP step) never
// frees capacity: each rule works at the latest time its state has seen.
func testClockBackwards(t *testing.T, newStore NewStore) {
	for _, c := range algoCases() {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, newStore)
			l := e.limiter("p", c.rule)
			T := 30 * time.Second
			e.at(T)
			// "skew" sees the clock go back; "control" does not, and gets
			// the same requests at T instead.
			for _, k := range []string{"skew", "control"} {
				if n := e.exhaust(l, k); n != c.burst {
					t.Fatalf("%s: admitted %d, want %d", k, n, c.burst)
				}
			}
			for _, back := range []time.Duration{time.Second, 45 * time.Second, time.Hour, 25 * time.Hour, 40 * 24 * time.Hour} {
				e.at(T - back)
				if d := e.allow(l, "skew"); d.Allowed || d.Reason != floodgate.ReasonLimited {
					t.Errorf("%s back: %s; want denied", back, show(d))
				}
				if d := e.do(l, "skew", reserve, 1); d.Allowed && d.Delay == 0 {
					t.Errorf("%s back, Reserve: %s; want refused or delayed", back, show(d))
				} else if d.Allowed {
					e.do(l, "skew", refund, 1)
				}
				e.at(T)
				e.allow(l, "control")
				if d := e.do(l, "control", reserve, 1); d.Allowed {
					e.do(l, "control", refund, 1)
				}
			}
			// From T on, the two keys are one.
			for _, d := range []time.Duration{0, time.Second, 20 * time.Second, 31 * time.Second, 61 * time.Second, 10 * time.Minute} {
				e.at(T + d)
				e.expect("skew versus control, peek", e.peek(l, "skew", 1), e.peek(l, "control", 1))
			}
			e.expect("skew versus control, allow", e.allow(l, "skew"), e.allow(l, "control"))
		})
	}
}

// The observer sees every decision, with the op, cost, key and policy.
func testObserver(t *testing.T, newStore NewStore) {
	t.Run("Every", func(t *testing.T) { testObserverEvery(t, newStore) })
	// Giving a reservation back is an operation on the key like Refund:
	// an observer that sums consumption must see it.
	t.Run("Cancel", func(t *testing.T) {
		e := newEnv(t, newStore)
		var (
			mu     sync.Mutex
			events []floodgate.Event
		)
		l := floodgate.NewLimiter(e.policy("p", floodgate.Rule{Name: "r", Limit: 1, Period: time.Second}), e.store,
			floodgate.WithClock(e.clk), floodgate.WithObserver(func(ev floodgate.Event) {
				mu.Lock()
				events = append(events, ev)
				mu.Unlock()
			}))
		r, err := l.Reserve(e.ctx, "k", 1)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Cancel(e.ctx); err != nil {
			t.Fatal(err)
		}
		e.allow(l, "k")
		ctx, cancel := context.WithCancel(e.ctx)
		ch := e.goWait(ctx, l, "k", 1)
		e.sleepers(1)
		cancel()
		e.result(ch)
		mu.Lock()
		defer mu.Unlock()
		var ops []floodgate.OpKind
		for _, ev := range events {
			ops = append(ops, ev.Op)
		}
		want := []floodgate.OpKind{reserve, refund, allow, reserve, refund}
		if !slices.Equal(ops, want) {
			t.Errorf("observed %v, want %v", ops, want)
		}
	})
}

func testObserverEvery(t *testing.T, newStore NewStore) {
	e := newEnv(t, newStore)
	var (
		mu     sync.Mutex
		events []floodgate.Event
	)
	obs := func(ev floodgate.Event) {
		mu.Lock()
		events = append(events, ev)
		mu.Unlock()
	}
	rule := floodgate.Rule{Name: "r", Algorithm: floodgate.FixedWindow, Limit: 3, Period: time.Minute}
	p := e.policy("p", rule)
	l := floodgate.NewLimiter(p, e.store, floodgate.WithClock(e.clk), floodgate.WithObserver(obs))
	l2 := floodgate.NewLimiter(e.policy("p2", rule), e.store, floodgate.WithClock(e.clk), floodgate.WithObserver(obs))
	type call struct {
		l    *floodgate.Limiter
		key  string
		op   floodgate.OpKind
		cost int64
		d    floodgate.Decision
	}
	var calls []call
	record := func(l *floodgate.Limiter, key string, op floodgate.OpKind, cost int64, d floodgate.Decision, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		calls = append(calls, call{l, key, op, cost, d})
	}
	d, err := l.Allow(e.ctx, "k")
	record(l, "k", allow, 1, d, err)
	d, err = l.AllowN(e.ctx, "k", 2)
	record(l, "k", allow, 2, d, err)
	d, err = l.AllowN(e.ctx, "k", 1) // denied
	record(l, "k", allow, 1, d, err)
	d, err = l.AllowN(e.ctx, "k", 0)
	record(l, "k", peek, 0, d, err)
	d, err = l.PeekN(e.ctx, "k", 4)
	record(l, "k", peek, 4, d, err)
	d, err = l.Charge(e.ctx, "k", 1)
	record(l, "k", charge, 1, d, err)
	d, err = l.Refund(e.ctx, "k", 2)
	record(l, "k", refund, 2, d, err)
	r, err := l.Reserve(e.ctx, "k", 1)
	record(l, "k", reserve, 1, r.Decision, err)
	err = l.Reset(e.ctx, "k")
	record(l, "k", reset, 0, floodgate.Decision{}, err)
	out := make([]floodgate.Decision, 2)
	err = floodgate.AllowBatch(e.ctx, []floodgate.Item{{Limiter: l, Key: "a", Cost: 3}, {Limiter: l2, Key: "b", Cost: 0}}, out)
	record(l, "a", allow, 3, out[0], err)
	record(l2, "b", peek, 0, out[1], err)
	// A Wait on a spent window is seen twice: the denial it sleeps on, and
	// the admission when it wakes.
	e.at(10 * time.Second)
	ch := e.goWait(e.ctx, l, "a", 1)
	e.sleepers(1)
	e.clk.Advance(50 * time.Second)
	res := e.returned(ch, 0)
	if res.err != nil {
		t.Fatal(res.err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(events) != len(calls)+2 {
		t.Fatalf("%d events for %d decisions", len(events), len(calls)+2)
	}
	for i, c := range calls {
		ev := events[i]
		if ev.Policy != c.l.Policy() || ev.Key != c.key || ev.Op != c.op || ev.Cost != c.cost || ev.Err != nil {
			t.Errorf("event %d: %v %q %s(%d) err %v; want %v %q %s(%d)", i, ev.Policy.Name(), ev.Key, ev.Op, ev.Cost, ev.Err, c.l.Policy().Name(), c.key, c.op, c.cost)
		}
		if c.op != reset {
			e.expect("event "+c.op.String(), ev.Decision, c.d)
		}
	}
	wait := events[len(calls):]
	if ev := wait[0]; ev.Op != reserve || ev.Key != "a" || ev.Decision.Allowed || ev.Decision.RetryAfter != 50*time.Second {
		t.Errorf("Wait's first event: %s(%d) on %q, %s; want a denied reservation", ev.Op, ev.Cost, ev.Key, show(ev.Decision))
	}
	if ev := wait[1]; ev.Op != reserve || ev.Key != "a" || ev.Decision != res.d {
		t.Errorf("Wait's second event: %s(%d) on %q, %s; want %s", ev.Op, ev.Cost, ev.Key, show(ev.Decision), show(res.d))
	}
}

// Concurrent callers on one key never get more than the limit allows, for
// every algorithm: at one instant exactly the burst is admitted. The
// observer sees every decision.
func testConcurrency(t *testing.T, newStore NewStore) {
	const workers, each = 16, 200
	hammer := func(e *env, l *floodgate.Limiter, key string, each int, tick func(i int)) (admitted int64) {
		var n atomic.Int64
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				for i := range each {
					if w == 0 && tick != nil {
						tick(i)
					}
					d, err := l.Allow(e.ctx, key)
					if err != nil {
						t.Error(err)
						return
					}
					if d.Allowed {
						n.Add(1)
					}
				}
			})
		}
		wg.Wait()
		return n.Load()
	}
	for _, c := range algoCases() {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, newStore)
			var seen, seenAdmitted atomic.Int64
			p := e.policy("p", c.rule)
			l := floodgate.NewLimiter(p, e.store, floodgate.WithClock(e.clk), floodgate.WithObserver(func(ev floodgate.Event) {
				seen.Add(1)
				if ev.Decision.Allowed {
					seenAdmitted.Add(1)
				}
			}))
			if n := hammer(e, l, "k", each, nil); n != c.burst {
				t.Errorf("admitted %d of %d at one instant, want %d", n, workers*each, c.burst)
			}
			if seen.Load() != workers*each || seenAdmitted.Load() != c.burst {
				t.Errorf("observer saw %d decisions, %d admissions; want %d, %d", seen.Load(), seenAdmitted.Load(), workers*each, c.burst)
			}
			// With the clock moving under the callers (each reads it at its
			// own time, so the store sees time jitter back and forth), no
			// more than the ceiling per period passes: 10 steps of 15 s
			// touch at most 4 periods of 1 minute.
			const moving = 50
			n := hammer(e, l, "moving", moving, func(i int) {
				if i%(moving/10) == 0 {
					e.clk.Advance(15 * time.Second)
				}
			})
			if n < c.burst || n > 4*c.ceiling {
				t.Errorf("admitted %d with the clock moving, want between %d and %d", n, c.burst, 4*c.ceiling)
			}
		})
	}
	// A policy of several rules under concurrency: all or nothing holds, so
	// each phase admits exactly what its tightest rule has left.
	t.Run("Policy", func(t *testing.T) {
		e := newEnv(t, newStore)
		m := time.Minute
		l := e.limiter("p",
			floodgate.Rule{Name: "tb", Limit: 100, Period: m, Burst: 50},
			floodgate.Rule{Name: "fw", Algorithm: floodgate.FixedWindow, Limit: 40, Period: 30 * time.Second},
			floodgate.Rule{Name: "sl", Algorithm: floodgate.SlidingLog, Limit: 45, Period: m},
			floodgate.Rule{Name: "sw", Algorithm: floodgate.SlidingWindow, Limit: 60, Period: m},
			floodgate.Rule{Name: "ssw", Algorithm: floodgate.SlidingSubwindow, Limit: 70, Period: m, Granularity: 10 * time.Second},
		)
		for _, ph := range []struct {
			at   time.Duration
			want int64
			rule string // the tightest rule
		}{
			{0, 40, "fw"},                // fw: 40 of 40
			{30 * time.Second, 5, "sl"},  // sl: 40 of 45 in the last minute
			{60 * time.Second, 15, "sw"}, // sw: 45 from the previous minute, all weighted in
		} {
			e.at(ph.at)
			if n := hammer(e, l, "k", each, nil); n != ph.want {
				t.Errorf("at %s: admitted %d, want %d", ph.at, n, ph.want)
			}
			if d := e.peek(l, "k", 1); d.Allowed || d.Rule != ph.rule {
				t.Errorf("at %s: %s; want denied by %s", ph.at, show(d), ph.rule)
			}
		}
	})
	// Many keys at once: each gets exactly its own limit.
	t.Run("ManyKeys", func(t *testing.T) {
		e := newEnv(t, newStore)
		l := e.limiter("p", floodgate.Rule{Name: "r", Algorithm: floodgate.SlidingLog, Limit: 5, Period: time.Minute})
		const keys = 64
		var admitted [keys]atomic.Int64
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				for i := range each {
					k := (w*each + i) % keys
					d, err := l.Allow(e.ctx, string(rune('A'+k%26))+string(rune('a'+k/26)))
					if err != nil {
						t.Error(err)
						return
					}
					if d.Allowed {
						admitted[k].Add(1)
					}
				}
			})
		}
		wg.Wait()
		for k := range admitted {
			if n := admitted[k].Load(); n != 5 {
				t.Errorf("key %d: admitted %d, want 5", k, n)
			}
		}
	})
}

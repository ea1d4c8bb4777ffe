package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
)

// waitCase is a rule of 1 request per second whose reservations lend
// future capacity; after one request at 0 s, a reservation at 0 s waits
// 1 s and leaves the rule with no room and a reset of 2 s.
type waitCase struct {
	name  string
	rule  floodgate.Rule
	after floodgate.Decision // Peek(1) at 1 s, after the request and the reservation
}

func waitCases() []waitCase {
	s := time.Second
	r := func(a floodgate.Algorithm) floodgate.Rule {
		return floodgate.Rule{Name: "r", Algorithm: a, Limit: 1, Period: s}
	}
	interval := r(floodgate.TokenBucket)
	interval.Refill = floodgate.RefillInterval
	shaper := r(floodgate.LeakyBucketShaper)
	shaper.Burst = 2
	return []waitCase{
		{"token_bucket", r(floodgate.TokenBucket), no("r", 1, 0, s, s)},
		{"token_bucket_interval", interval, no("r", 1, 0, s, s)},
		{"leaky_bucket", r(floodgate.LeakyBucket), no("r", 1, 0, s, s)},
		{"gcra", r(floodgate.GCRA), no("r", 1, 0, s, s)},
		// The reserved request is in the queue until 2 s: room for one.
		{"leaky_bucket_shaper", shaper, no("r", 1, 1, s, s)},
	}
}

func testWait(t *testing.T, newStore NewStore) {
	s := time.Second
	// Reservations on bucket rules lend future capacity, each later than
	// the one before; Cancel gives it back, once.
	for _, a := range []floodgate.Algorithm{floodgate.TokenBucket, floodgate.LeakyBucket, floodgate.GCRA} {
		t.Run("Reserve/"+string(a), func(t *testing.T) {
			e := newEnv(t, newStore)
			l := e.limiter("p", floodgate.Rule{Name: "r", Algorithm: a, Limit: 1, Period: s, Burst: 2})
			var rs []*floodgate.Reservation
			for i, want := range []floodgate.Decision{
				ok("r", 1, 1, s),
				ok("r", 1, 0, 2*s),
				delayed(ok("r", 1, 0, 3*s), s),
				delayed(ok("r", 1, 0, 4*s), 2*s),
			} {
				r, err := l.Reserve(e.ctx, "k", 1)
				if err != nil {
					t.Fatal(err)
				}
				if !r.OK() {
					t.Errorf("reservation %d not OK", i)
				}
				e.expect(fmt.Sprintf("reservation %d", i), r.Decision, want)
				rs = append(rs, r)
			}
			for range 2 { // the second Cancel gives nothing back
				if err := rs[3].Cancel(e.ctx); err != nil {
					t.Fatal(err)
				}
				e.expect("after Cancel", e.peek(l, "k", 1), no("r", 1, 0, 3*s, 2*s))
			}
			// Cancelling a refused reservation gives nothing back.
			r, err := l.Reserve(e.ctx, "k", 3)
			if err != nil || r.OK() {
				t.Fatalf("Reserve(3): %v, OK %v", err, r != nil && r.OK())
			}
			e.expect("Reserve(3)", r.Decision, tooLarge("r", 1, 0, 3*s))
			if err := r.Cancel(e.ctx); err != nil {
				t.Fatal(err)
			}
			e.expect("after cancelling a refused reservation", e.peek(l, "k", 1), no("r", 1, 0, 3*s, 2*s))
			e.clk.Advance(3 * s)
			e.expect("3 s later", e.peek(l, "k", 0), ok("r", 1, 2, 0))
		})
	}
	t.Run("Reserve/token_bucket_interval", func(t *testing.T) {
		e := newEnv(t, newStore)
		l := e.limiter("p", floodgate.Rule{Name: "r", Limit: 2, Period: time.Minute, Refill: floodgate.RefillInterval})
		e.script(l, "k", []step{
			{0, reserve, 1, ok("r", 2, 1, 60*s)},
			{0, reserve, 1, ok("r", 2, 0, 60*s)},
			{0, reserve, 1, delayed(ok("r", 2, 0, 120*s), 60*s)},
			{0, reserve, 1, delayed(ok("r", 2, 0, 120*s), 60*s)},
			{0, reserve, 1, delayed(ok("r", 2, 0, 180*s), 120*s)},
			// At 60 s two tokens come back, both already lent: the key still
			// counts 3 of 2, so even a peek waits for the next refill.
			{60 * s, peek, 0, no("r", 2, 0, 120*s, 60*s)},
		})
	})
	// Window rules cannot lend: a reservation is made now or not at all.
	t.Run("Reserve/Window", func(t *testing.T) {
		e := newEnv(t, newStore)
		l := e.limiter("p", floodgate.Rule{Name: "r", Algorithm: floodgate.FixedWindow, Limit: 1, Period: time.Minute})
		e.script(l, "k", []step{
			{10 * s, reserve, 1, ok("r", 1, 0, 50*s)},
			{10 * s, reserve, 1, no("r", 1, 0, 50*s, 50*s)},
			{10 * s, peek, 0, ok("r", 1, 0, 50*s)},
		})
	})
	// In a policy, a window rule that cannot admit now refuses the
	// reservation and the bucket rule lends nothing.
	t.Run("Reserve/Policy", func(t *testing.T) {
		e := newEnv(t, newStore)
		l := e.limiter("p",
			floodgate.Rule{Name: "tb", Limit: 1, Period: s},
			floodgate.Rule{Name: "fw", Algorithm: floodgate.FixedWindow, Limit: 3, Period: s})
		e.script(l, "k", []step{
			{0, reserve, 1, ok("tb", 1, 0, s)},
			{0, reserve, 1, delayed(ok("tb", 1, 0, 2*s), s)},
			{0, reserve, 1, delayed(ok("tb", 1, 0, 3*s), 2*s)},
			// The fixed window is full: refused. The bucket, which could
			// lend for 3 s, has the longer wait and reports; its state is
			// as before (it would read 4 s had it lent).
			{0, reserve, 1, no("tb", 1, 0, 3*s, 3*s)},
			{s, reserve, 1, delayed(ok("tb", 1, 0, 3*s), 2*s)},
		})
	})

	// Wait reserves and sleeps on the limiter's clock until its time.
	for _, c := range waitCases() {
		t.Run("Wait/"+c.name, func(t *testing.T) {
			e := newEnv(t, newStore)
			l := e.limiter("p", c.rule)
			e.allow(l, "k")
			ch := e.goWait(e.ctx, l, "k", 1)
			e.sleepers(1)
			e.asleep(ch)
			e.clk.Advance(s - us(1))
			e.asleep(ch)
			e.clk.Advance(us(1))
			r := e.returned(ch, 0)
			if r.err != nil {
				t.Fatalf("Wait: %v", r.err)
			}
			want := delayed(ok("r", 1, 0, 2*s), s)
			e.expect("Wait", r.d, want)
			e.expect("after Wait", e.peek(l, "k", 1), c.after)
		})
		// A deadline too close fails at once, consuming nothing.
		t.Run("WaitDeadline/"+c.name, func(t *testing.T) {
			e := newEnv(t, newStore)
			rule := c.rule
			rule.Period = 24 * time.Hour
			l := e.limiter("p", rule)
			e.allow(l, "k")
			before := e.peek(l, "k", 1)
			ctx, cancel := context.WithTimeout(e.ctx, time.Hour)
			defer cancel()
			d, err := l.WaitN(ctx, "k", 1)
			if !errors.Is(err, floodgate.ErrDeadline) {
				t.Fatalf("WaitN with an hour for a day's wait: %v, want ErrDeadline", err)
			}
			e.expect("WaitN's decision", d, before)
			if n := e.clk.Sleepers(); n != 0 {
				t.Errorf("%d sleepers", n)
			}
			r, err := l.Reserve(ctx, "k", 1)
			if err != nil || r.OK() {
				t.Errorf("Reserve with an hour for a day's wait: %v, %s; want refused", err, show(r.Decision))
			}
			e.expect("after", e.peek(l, "k", 1), before)
			// With half an hour to go, the hour is enough: Wait sleeps.
			e.clk.Advance(23*time.Hour + 30*time.Minute)
			ch := e.goWait(ctx, l, "k", 1)
			e.sleepers(1)
			e.clk.Advance(30 * time.Minute)
			if r := e.returned(ch, 0); r.err != nil || r.d.Delay != 30*time.Minute {
				t.Fatalf("Wait: %s, %v; want a delay of 30m", show(r.d), r.err)
			}
		})
		// A context ending while Wait sleeps gives the reservation back.
		t.Run("WaitCancelled/"+c.name, func(t *testing.T) {
			e := newEnv(t, newStore)
			l := e.limiter("p", c.rule)
			e.allow(l, "k")
			before := e.peek(l, "k", 1)
			ctx, cancel := context.WithCancel(e.ctx)
			ch := e.goWait(ctx, l, "k", 1)
			e.sleepers(1)
			cancel()
			r := e.result(ch)
			if !errors.Is(r.err, context.Canceled) {
				t.Fatalf("Wait: %v, want context.Canceled", r.err)
			}
			if n := e.clk.Sleepers(); n != 0 {
				t.Errorf("%d sleepers after the cancellation", n)
			}
			e.expect("after the cancellation", e.peek(l, "k", 1), before)
			// A context already done: nothing happens.
			if _, err := l.WaitN(ctx, "k", 1); !errors.Is(err, context.Canceled) {
				t.Errorf("WaitN with a cancelled context: %v", err)
			}
			e.expect("after a cancelled WaitN", e.peek(l, "k", 1), before)
		})
	}

	// On window rules Wait sleeps until RetryAfter and tries again, once:
	// RetryAfter is exact, so the retry is admitted.
	windows := []struct {
		name  string
		rule  floodgate.Rule
		setup []step        // requests before the Wait
		at    time.Duration // when Wait is called
		sleep time.Duration // how long it sleeps
		want  floodgate.Decision
	}{
		{"fixed_window", floodgate.Rule{Name: "r", Algorithm: floodgate.FixedWindow, Limit: 1, Period: time.Minute},
			[]step{{10 * s, allow, 1, ok("r", 1, 0, 50*s)}}, 10 * s, 50 * s, ok("r", 1, 0, 60*s)},
		{"sliding_log", floodgate.Rule{Name: "r", Algorithm: floodgate.SlidingLog, Limit: 2, Period: time.Minute},
			[]step{{0, allow, 1, ok("r", 2, 1, 60*s)}, {30 * s, allow, 1, ok("r", 2, 0, 60*s)}}, 40 * s, 20 * s, ok("r", 2, 0, 60*s)},
		{"sliding_log_count_rejected", floodgate.Rule{Name: "r", Algorithm: floodgate.SlidingLog, Limit: 2, Period: time.Minute, CountRejected: true},
			[]step{{0, allow, 1, ok("r", 2, 1, 60*s)}, {30 * s, allow, 1, ok("r", 2, 0, 60*s)}}, 40 * s, 20 * s, ok("r", 2, 0, 60*s)},
		{"sliding_window", floodgate.Rule{Name: "r", Algorithm: floodgate.SlidingWindow, Limit: 2, Period: time.Minute},
			[]step{{0, allow, 2, ok("r", 2, 0, 90*s+us(1))}}, 30 * s, 30*s + us(1), ok("r", 2, 0, 60*s)},
		{"sliding_subwindow", floodgate.Rule{Name: "r", Algorithm: floodgate.SlidingSubwindow, Limit: 2, Period: time.Minute, Granularity: 30 * s},
			[]step{{0, allow, 2, ok("r", 2, 0, 60*s)}}, 40 * s, 20 * s, ok("r", 2, 1, 60*s)},
	}
	for _, c := range windows {
		t.Run("WaitWindow/"+c.name, func(t *testing.T) {
			e := newEnv(t, newStore)
			l := e.limiter("p", c.rule)
			e.script(l, "k", c.setup)
			e.at(c.at)
			ch := e.goWait(e.ctx, l, "k", 1)
			e.sleepers(1)
			e.clk.Advance(c.sleep - us(1))
			e.asleep(ch)
			e.clk.Advance(us(1))
			r := e.returned(ch, 0)
			if r.err != nil {
				t.Fatalf("Wait: %v", r.err)
			}
			e.expect("Wait", r.d, c.want)
			// What Wait took is taken.
			if d := e.peek(l, "k", 0); d.Remaining != c.want.Remaining {
				t.Errorf("after Wait: %s; want %d remaining", show(d), c.want.Remaining)
			}
		})
	}
	// A window Wait cancelled while it sleeps held nothing.
	t.Run("WaitWindowCancelled", func(t *testing.T) {
		e := newEnv(t, newStore)
		l := e.limiter("p", floodgate.Rule{Name: "r", Algorithm: floodgate.FixedWindow, Limit: 1, Period: time.Minute})
		e.allow(l, "k")
		ctx, cancel := context.WithCancel(e.ctx)
		ch := e.goWait(ctx, l, "k", 1)
		e.sleepers(1)
		cancel()
		if r := e.result(ch); !errors.Is(r.err, context.Canceled) {
			t.Fatalf("Wait: %v, want context.Canceled", r.err)
		}
		e.at(time.Minute)
		e.expect("next window", e.peek(l, "k", 0), ok("r", 1, 1, 0))
	})

	// Concurrent reservations each get their own slot.
	for _, c := range []struct {
		name string
		rule floodgate.Rule
		step time.Duration
	}{
		{"token_bucket", floodgate.Rule{Name: "r", Limit: 1, Period: s}, s},
		{"gcra", floodgate.Rule{Name: "r", Algorithm: floodgate.GCRA, Limit: 1, Period: s}, s},
		{"leaky_bucket_shaper", floodgate.Rule{Name: "r", Algorithm: floodgate.LeakyBucketShaper, Limit: 2, Period: s, Burst: 50}, s / 2},
	} {
		t.Run("ConcurrentReserve/"+c.name, func(t *testing.T) {
			e := newEnv(t, newStore)
			l := e.limiter("p", c.rule)
			const n = 50
			delays := make([]time.Duration, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					r, err := l.Reserve(e.ctx, "k", 1)
					if err != nil || !r.OK() {
						t.Errorf("Reserve: %v, OK %v", err, r != nil && r.OK())
						return
					}
					delays[i] = r.Delay
				})
			}
			wg.Wait()
			slices.Sort(delays)
			for i, d := range delays {
				if d != time.Duration(i)*c.step {
					t.Fatalf("sorted delays %v: the %dth is not %s", delays, i, time.Duration(i)*c.step)
				}
			}
		})
	}
	// Concurrent Waits leave one at a time as the clock advances.
	t.Run("ConcurrentWait", func(t *testing.T) {
		e := newEnv(t, newStore)
		l := e.limiter("p", floodgate.Rule{Name: "r", Limit: 1, Period: s})
		const n = 8
		ch := make(chan waitResult, n)
		for range n {
			go func() {
				d, err := l.WaitN(e.ctx, "k", 1)
				ch <- waitResult{d, err}
			}()
		}
		e.sleepers(n - 1)
		for k := range n {
			if k > 0 {
				e.clk.Advance(s)
			}
			r := e.returned(ch, n-1-k)
			if r.err != nil || r.d.Delay != time.Duration(k)*s {
				t.Fatalf("Wait %d: %s, %v; want a delay of %s", k, show(r.d), r.err, time.Duration(k)*s)
			}
			if got := e.clk.Sleepers(); got != n-1-k {
				t.Fatalf("after Wait %d: %d sleepers, want %d", k, got, n-1-k)
			}
		}
	})
}

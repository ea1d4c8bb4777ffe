// Package storetest is the conformance suite of floodgate.Store: every
// store (the in-memory store, a Redis store) must pass Run.
//
// The suite drives stores through floodgate.Limiter on a clock.Manual, so
// that every decision is exact and no test sleeps: the worked examples of
// the design articles the project grew from, each algorithm's decisions and
// the meaning of every Decision field, the throttling modes, every
// operation, Wait and Reserve, limit and policy changes, batches and
// all-or-nothing groups, a clock that goes backwards, concurrent callers
// and observers.
//
// Use it from a store's tests:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) floodgate.Store {
//			s := newStore()
//			t.Cleanup(func() { s.Close() })
//			return s
//		})
//	}
//
// newStore is called once per subtest and must return a store holding no
// keys (a fresh namespace or an emptied database). A store must not expire
// or evict keys on its own clock during the suite: the suite's clock is in
// 2017 and 2024, and state fresh by the wall clock is not fresh by the
// suite's clock.
package storetest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/clock"
)

// NewStore returns an empty store for one subtest.
type NewStore = func(t *testing.T) floodgate.Store

// Run runs the conformance suite against the stores newStore returns.
func Run(t *testing.T, newStore func(t *testing.T) floodgate.Store) {
	t.Helper()
	groups := []struct {
		name string
		run  func(*testing.T, NewStore)
	}{
		{"Seeds", testSeeds},
		{"Algorithms", testAlgorithms},
		{"Modes", testModes},
		{"Ops", testOps},
		{"Wait", testWait},
		{"Change", testChange},
		{"Batch", testBatch},
		{"Group", testGroup},
		{"Move", testMove},
		{"Approx", testApprox},
		{"ClockBackwards", testClockBackwards},
		{"Observer", testObserver},
		{"Concurrency", testConcurrency},
	}
	for _, g := range groups {
		t.Run(g.name, func(t *testing.T) { g.run(t, newStore) })
	}
}

// origin is 2017-07-12 03:00:00 UTC, Unix time 1499828400: the StartTime of
// the "Kristie" example in the seed articles. It is aligned to the minute
// and the hour.
var origin = time.Unix(1499828400, 0).UTC()

// guard bounds how long the suite waits, in real time, for a goroutine it
// expects to make progress. It is only a failure guard: no assertion
// depends on real time passing.
const guard = 10 * time.Second

// env is one subtest's store, clock and helpers.
type env struct {
	t      *testing.T
	store  floodgate.Store
	clk    *clock.Manual
	ctx    context.Context
	origin time.Time // e.at measures from here
	shadow map[*floodgate.Limiter]*floodgate.Limiter
}

func newEnv(t *testing.T, newStore NewStore) *env {
	t.Helper()
	s := newStore(t)
	if s == nil {
		t.Fatal("newStore returned nil")
	}
	return &env{t: t, store: s, clk: clock.NewManual(origin), ctx: t.Context(), origin: origin,
		shadow: map[*floodgate.Limiter]*floodgate.Limiter{}}
}

// from sets the origin e.at measures from and moves the clock there.
func (e *env) from(t time.Time) {
	e.origin = t
	e.clk.Set(t)
}

// at sets the clock to d after the origin.
func (e *env) at(d time.Duration) { e.clk.Set(e.origin.Add(d)) }

// policy compiles rules into a policy whose name is unique to the subtest.
func (e *env) policy(name string, rules ...floodgate.Rule) *floodgate.Policy {
	e.t.Helper()
	p, err := floodgate.NewPolicy(e.t.Name()+"|"+name, rules...)
	if err != nil {
		e.t.Fatalf("NewPolicy(%s): %v", name, err)
	}
	return p
}

// limiter returns a limiter on the env's store and clock applying a policy
// of rules named name.
func (e *env) limiter(name string, rules ...floodgate.Rule) *floodgate.Limiter {
	e.t.Helper()
	return floodgate.NewLimiter(e.policy(name, rules...), e.store, floodgate.WithClock(e.clk))
}

// do performs one operation through the limiter's API and fails the test on
// an error.
func (e *env) do(l *floodgate.Limiter, key string, op floodgate.OpKind, cost int64) floodgate.Decision {
	e.t.Helper()
	var (
		d   floodgate.Decision
		err error
	)
	switch op {
	case floodgate.OpAllow:
		if cost == 0 {
			e.t.Fatal("suite bug: AllowN(0) peeks; use OpPeek")
		}
		d, err = l.AllowN(e.ctx, key, cost)
	case floodgate.OpPeek:
		d, err = l.PeekN(e.ctx, key, cost)
	case floodgate.OpCharge:
		d, err = l.Charge(e.ctx, key, cost)
	case floodgate.OpRefund:
		d, err = l.Refund(e.ctx, key, cost)
	case floodgate.OpReset:
		err = l.Reset(e.ctx, key)
	case floodgate.OpReserve:
		var r *floodgate.Reservation
		r, err = l.Reserve(e.ctx, key, cost)
		if r != nil {
			d = r.Decision
		}
	default:
		e.t.Fatalf("suite bug: op %v", op)
	}
	if err != nil {
		e.t.Fatalf("%s(%q, %d) at %s: %v", op, key, cost, e.now(), err)
	}
	return d
}

func (e *env) allow(l *floodgate.Limiter, key string) floodgate.Decision {
	e.t.Helper()
	return e.do(l, key, floodgate.OpAllow, 1)
}

func (e *env) allowN(l *floodgate.Limiter, key string, n int64) floodgate.Decision {
	e.t.Helper()
	return e.do(l, key, floodgate.OpAllow, n)
}

func (e *env) peek(l *floodgate.Limiter, key string, n int64) floodgate.Decision {
	e.t.Helper()
	return e.do(l, key, floodgate.OpPeek, n)
}

// now describes the clock as an offset from the origin.
func (e *env) now() string {
	return "+" + e.clk.Now().Sub(e.origin).String()
}

// expect compares a whole decision.
func (e *env) expect(what string, got, want floodgate.Decision) {
	e.t.Helper()
	if got != want {
		e.t.Errorf("%s at %s:\n got  %s\n want %s", what, e.now(), show(got), show(want))
	}
}

// step is one operation of a script and the decision it must get.
type step struct {
	at   time.Duration // clock, from the origin
	op   floodgate.OpKind
	cost int64
	want floodgate.Decision
}

// script runs steps on one key.
//
// When l's policy has a single rule, each step also runs on a shadow
// limiter whose policy adds a rule that never constrains: a store (or the
// engine) may decide single-rule policies on a path of their own, and both
// paths must decide alike.
func (e *env) script(l *floodgate.Limiter, key string, steps []step) {
	e.t.Helper()
	ls := []*floodgate.Limiter{l}
	if sh := e.shadowOf(l); sh != nil {
		ls = append(ls, sh)
	}
	for i, s := range steps {
		e.at(s.at)
		for j, l := range ls {
			got := e.do(l, key, s.op, s.cost)
			if s.op == floodgate.OpReset {
				continue
			}
			what := fmt.Sprintf("step %d: %s(%d)", i, s.op, s.cost)
			if j > 0 {
				what += " with a loose second rule"
			}
			e.expect(what, got, s.want)
		}
	}
}

// shadowOf returns the shadow of a single-rule limiter: its rule and a rule
// that never decides.
func (e *env) shadowOf(l *floodgate.Limiter) *floodgate.Limiter {
	e.t.Helper()
	if sh, ok := e.shadow[l]; ok {
		return sh
	}
	var sh *floodgate.Limiter
	if p := l.Policy(); len(p.Rules()) == 1 {
		loose := floodgate.Rule{Name: "loose", Algorithm: floodgate.FixedWindow, Limit: 1 << 30, Period: time.Minute}
		q, err := floodgate.NewPolicy(p.Name()+"+loose", append(p.Rules(), loose)...)
		if err != nil {
			e.t.Fatalf("shadow policy: %v", err)
		}
		sh = floodgate.NewLimiter(q, e.store, floodgate.WithClock(e.clk))
	}
	e.shadow[l] = sh
	return sh
}

func show(d floodgate.Decision) string {
	var b strings.Builder
	if d.Allowed {
		b.WriteString("allowed")
	} else {
		b.WriteString("denied")
	}
	fmt.Fprintf(&b, " rule=%q limit=%d remaining=%d reset=%s retry=%s delay=%s reason=%s",
		d.Rule, d.Limit, d.Remaining, d.ResetAfter, d.RetryAfter, d.Delay, d.Reason)
	if d.Excess {
		b.WriteString(" excess")
	}
	return b.String()
}

// ok is an admission by rule.
func ok(rule string, limit, remaining int64, reset time.Duration) floodgate.Decision {
	return floodgate.Decision{Allowed: true, Rule: rule, Limit: limit, Remaining: remaining, ResetAfter: reset}
}

// no is a denial by rule.
func no(rule string, limit, remaining int64, reset, retry time.Duration) floodgate.Decision {
	return floodgate.Decision{Rule: rule, Limit: limit, Remaining: remaining, ResetAfter: reset, RetryAfter: retry, Reason: floodgate.ReasonLimited}
}

// tooLarge is a denial of a cost rule can never admit.
func tooLarge(rule string, limit, remaining int64, reset time.Duration) floodgate.Decision {
	return floodgate.Decision{Rule: rule, Limit: limit, Remaining: remaining, ResetAfter: reset, Reason: floodgate.ReasonCostTooLarge}
}

// excess marks an admission beyond the limit.
func excess(d floodgate.Decision) floodgate.Decision {
	d.Excess = true
	return d
}

// delayed gives a reservation's delay.
func delayed(d floodgate.Decision, delay time.Duration) floodgate.Decision {
	d.Delay = delay
	return d
}

// us is n microseconds.
func us(n int64) time.Duration { return time.Duration(n) * time.Microsecond }

// waitResult is what a Wait in a goroutine returned.
type waitResult struct {
	d   floodgate.Decision
	err error
}

// goWait runs l.WaitN in a goroutine.
func (e *env) goWait(ctx context.Context, l *floodgate.Limiter, key string, n int64) <-chan waitResult {
	ch := make(chan waitResult, 1)
	go func() {
		d, err := l.WaitN(ctx, key, n)
		ch <- waitResult{d, err}
	}()
	return ch
}

// sleepers blocks until n goroutines sleep on the clock.
func (e *env) sleepers(n int) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, guard)
	defer cancel()
	if err := e.clk.WaitForSleepers(ctx, n); err != nil {
		e.t.Fatalf("waiting for %d goroutines to sleep on the clock: %v (%d sleep)", n, err, e.clk.Sleepers())
	}
}

// asleep checks that a Wait has not returned. Called when its wake time
// has not come, it cannot have returned: the check is exact, not timed.
func (e *env) asleep(ch <-chan waitResult) {
	e.t.Helper()
	select {
	case r := <-ch:
		e.t.Fatalf("Wait returned at %s before its time: %s, %v", e.now(), show(r.d), r.err)
	default:
	}
}

// result receives the result of a Wait whose context was cancelled (it
// leaves the clock's sleepers on its own time, so returned cannot be used).
func (e *env) result(ch <-chan waitResult) waitResult {
	e.t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(guard):
		e.t.Fatalf("Wait did not return after its context was cancelled")
	}
	return waitResult{}
}

// returned receives a Wait's result after the clock reached its wake time.
// others is how many other goroutines still sleep on the clock: if the Wait
// goes back to sleep instead of returning, the test fails at once.
func (e *env) returned(ch <-chan waitResult, others int) waitResult {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, guard)
	defer cancel()
	slept := make(chan struct{})
	go func() {
		if e.clk.WaitForSleepers(ctx, others+1) == nil {
			close(slept)
		}
	}()
	select {
	case r := <-ch:
		return r
	case <-slept:
		// A goroutine is sleeping again. It is the Wait, unless the Wait
		// returned just now and something else sleeps: look once more.
		select {
		case r := <-ch:
			return r
		default:
		}
		e.t.Fatalf("Wait went back to sleep at %s instead of returning", e.now())
	case <-ctx.Done():
		e.t.Fatalf("Wait did not return at %s", e.now())
	}
	return waitResult{}
}

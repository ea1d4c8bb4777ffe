package throttle

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate/floodgate/clock"
)

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func route(name string) RouteKey { return RouteKey{"GET", name} }

// train teaches the model that route k costs c (one measured completion
// at weight 1).
func train(t *testing.T, th *Throttler, k RouteKey, c time.Duration) {
	t.Helper()
	tk, err := th.Enter(k, CriticalPlus, 0)
	if err != nil || !tk.Admitted() {
		t.Fatalf("training %v: %v", k, err)
	}
	tk.DoneCost(c)
}

func newManual(t *testing.T, c Config) (*Throttler, *clock.Manual) {
	m := clock.NewManual(epoch)
	c.Clock = m
	c.Cost.Weight = 1 // the last measurement is the prediction: exact costs in the tests
	return New(c), m
}

func enter(t *testing.T, th *Throttler, k RouteKey, c Criticality) *Ticket {
	t.Helper()
	tk, err := th.Enter(k, c, 0)
	if err != nil {
		t.Fatalf("Enter(%v, %v): %v", k, c, err)
	}
	return tk
}

func state(tk *Ticket) uint8 {
	tk.th.mu.Lock()
	defer tk.th.mu.Unlock()
	return tk.state
}

func TestEvictionOrder(t *testing.T) {
	th, _ := newManual(t, Config{Limit: 1, MaxQueueCost: 10 * time.Millisecond})
	r := route("/r")
	train(t, th, r, 3*time.Millisecond)
	run := enter(t, th, r, Sheddable)
	if !run.Admitted() {
		t.Fatal("first request not admitted")
	}
	s1 := enter(t, th, r, Sheddable)
	s2 := enter(t, th, r, Sheddable)
	sp := enter(t, th, r, SheddablePlus) // 9 ms queued
	if st := th.Stats(); st.Queued != 3 || st.QueuedCost != 9*time.Millisecond {
		t.Fatalf("queued %d (%v), want 3 (9ms)", st.Queued, st.QueuedCost)
	}
	// Each CRITICAL arrival evicts the least critical, newest first.
	c1 := enter(t, th, r, Critical)
	wantState(t, "s2", s2, evicted)
	wantState(t, "s1", s1, waiting)
	c2 := enter(t, th, r, Critical)
	wantState(t, "s1", s1, evicted)
	c3 := enter(t, th, r, Critical)
	wantState(t, "sheddable_plus", sp, evicted)
	// Nothing less critical left: CRITICAL and below are refused; the queue is untouched.
	for _, c := range []Criticality{Sheddable, Critical} {
		if _, err := th.Enter(r, c, 0); !errors.Is(err, ErrQueueFull) {
			t.Errorf("%v into a full queue of CRITICAL: %v, want ErrQueueFull", c, err)
		}
	}
	for _, tk := range []*Ticket{c1, c2, c3} {
		wantState(t, "critical", tk, waiting)
	}
	if err := s2.Wait(context.Background()); !errors.Is(err, ErrEvicted) {
		t.Errorf("evicted ticket's Wait: %v", err)
	}
	st := th.Stats()
	if st.Evicted != [4]uint64{2, 1, 0, 0} || st.Refused != [4]uint64{1, 0, 1, 0} {
		t.Errorf("evicted %v refused %v", st.Evicted, st.Refused)
	}
	if st.QueuedCost != 9*time.Millisecond {
		t.Errorf("queued cost %v, want 9ms", st.QueuedCost)
	}
}

// An arrival evicts nothing unless evicting makes it fit: a CRITICAL
// arrival that would need more room than the SHEDDABLE requests hold
// leaves them queued and is refused.
func TestNoUselessEviction(t *testing.T) {
	th, _ := newManual(t, Config{Limit: 1, MaxQueueCost: 10 * time.Millisecond})
	cheap, dear, mid := route("/cheap"), route("/dear"), route("/mid")
	train(t, th, cheap, time.Millisecond)
	train(t, th, dear, 8*time.Millisecond)
	train(t, th, mid, 5*time.Millisecond)
	enter(t, th, cheap, Critical) // runs
	s := enter(t, th, cheap, Sheddable)
	c := enter(t, th, dear, Critical) // 9 ms queued
	if _, err := th.Enter(mid, Critical, 0); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("needs 4 ms, 1 ms evictable: %v", err)
	}
	wantState(t, "sheddable", s, waiting)
	// CRITICAL_PLUS may evict both (9 ms ≥ 4 ms needed), least critical first.
	cp := enter(t, th, mid, CriticalPlus)
	wantState(t, "sheddable", s, evicted)
	wantState(t, "critical", c, evicted)
	wantState(t, "critical_plus", cp, waiting)
	// A request that could never fit is refused, evicting nothing.
	huge := route("/huge")
	th2, _ := newManual(t, Config{Limit: 1, MaxQueueCost: 10 * time.Millisecond})
	train(t, th2, huge, 11*time.Millisecond)
	train(t, th2, cheap, time.Millisecond)
	enter(t, th2, cheap, Critical)
	s2 := enter(t, th2, cheap, Sheddable)
	if _, err := th2.Enter(huge, CriticalPlus, 0); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("11 ms into a 10 ms queue: %v", err)
	}
	wantState(t, "sheddable", s2, waiting)
}

func wantState(t *testing.T, name string, tk *Ticket, want uint8) {
	t.Helper()
	if got := state(tk); got != want {
		t.Errorf("%s: state %d, want %d", name, got, want)
	}
}

// The queue serves the most critical first, FIFO within a level.
func TestDispatchOrder(t *testing.T) {
	th, _ := newManual(t, Config{Limit: 1, MaxQueueCost: time.Second})
	r := route("/r")
	train(t, th, r, time.Millisecond)
	run := enter(t, th, r, Sheddable)
	order := []Criticality{Sheddable, Critical, SheddablePlus, CriticalPlus, Critical, Sheddable}
	tks := make([]*Ticket, len(order))
	for i, c := range order {
		tks[i] = enter(t, th, r, c)
	}
	want := []int{3, 1, 4, 2, 0, 5}
	for _, i := range want {
		run.DoneCost(time.Millisecond)
		if !tks[i].Admitted() {
			t.Fatalf("expected ticket %d (%v) next", i, order[i])
		}
		if err := tks[i].Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
		run = tks[i]
	}
}

func TestDeadlineDrops(t *testing.T) {
	th, m := newManual(t, Config{Limit: 1, MaxQueueCost: time.Second, MaxWait: 100 * time.Millisecond})
	r := route("/r")
	train(t, th, r, time.Millisecond)
	run := enter(t, th, r, Critical)
	old := enter(t, th, r, CriticalPlus) // MaxWait: until +100ms
	m.Advance(50 * time.Millisecond)
	own, err := th.Enter(r, Critical, m.NowMicro()+10_000) // its own deadline: +10ms
	if err != nil {
		t.Fatal(err)
	}
	young := enter(t, th, r, Sheddable) // until +150ms
	m.Advance(70 * time.Millisecond)    // t=120ms: old and own expired
	run.DoneCost(time.Millisecond)
	wantState(t, "old", old, expired)
	wantState(t, "own deadline", own, expired)
	if !young.Admitted() {
		t.Fatal("the request within its deadline must run")
	}
	if err := old.Wait(context.Background()); !errors.Is(err, ErrExpired) {
		t.Errorf("Wait: %v", err)
	}
	// Done on a dropped ticket gives nothing back: in flight stays 1 (young).
	old.Done()
	if st := th.Stats(); st.InFlight != 1 || st.Expired[CriticalPlus] != 1 || st.Expired[Critical] != 1 || st.Queued != 0 || st.QueuedCost != 0 {
		t.Errorf("stats %+v", st)
	}
	// A full queue drops its expired requests before refusing or evicting.
	th2, m2 := newManual(t, Config{Limit: 1, MaxQueueCost: 2 * time.Millisecond, MaxWait: 10 * time.Millisecond})
	train(t, th2, r, time.Millisecond)
	enter(t, th2, r, Critical)
	a := enter(t, th2, r, Critical)
	m2.Advance(5 * time.Millisecond)
	b := enter(t, th2, r, Critical)
	m2.Advance(6 * time.Millisecond) // a's deadline passed, b's not
	c := enter(t, th2, r, Sheddable)
	wantState(t, "a", a, expired)
	wantState(t, "b", b, waiting)
	wantState(t, "c", c, waiting)
}

func TestWithdrawAndDoubleDone(t *testing.T) {
	th, _ := newManual(t, Config{Limit: 1, MaxQueueCost: time.Second})
	r := route("/r")
	train(t, th, r, 5*time.Millisecond)
	run := enter(t, th, r, Critical)
	q := enter(t, th, r, Critical)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := q.Wait(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait: %v", err)
	}
	if st := th.Stats(); st.Queued != 0 || st.QueuedCost != 0 || st.Withdrawn[Critical] != 1 {
		t.Fatalf("withdrawn ticket still counted: %+v", st)
	}
	run.Done()
	run.Done()
	if st := th.Stats(); st.InFlight != 0 {
		t.Fatalf("in flight %d after double Done", st.InFlight)
	}
	a, b := enter(t, th, r, Critical), enter(t, th, r, Critical)
	if !a.Admitted() || b.Admitted() {
		t.Fatal("double Done freed two slots")
	}
}

// The cost bound and the limit hold at every instant under concurrent
// use (run with -race): an invariant checked under the lock after each
// change, not only at the end.
func TestConcurrentBounds(t *testing.T) {
	const limit, maxCost = 4, 20_000 // µs
	var violations atomic.Int64
	invariant = func(th *Throttler) {
		var sum int64
		n := 0
		for l := range th.queue {
			for tk := th.queue[l].head; tk != nil; tk = tk.next {
				sum += tk.predicted
				n++
			}
		}
		if th.queuedCost > th.maxCost || sum != th.queuedCost || n != th.queued || th.inflight > th.limit || th.inflight < 0 {
			violations.Add(1)
		}
	}
	defer func() { invariant = nil }()
	for _, rate := range []float64{0, 20_000} {
		th := New(Config{Limit: limit, Rate: rate, MaxQueueCost: maxCost * time.Microsecond, MaxWait: 2 * time.Millisecond})
		concurrentLoad(t, th, &violations)
	}
}

func concurrentLoad(t *testing.T, th *Throttler, violations *atomic.Int64) {
	var wg sync.WaitGroup
	var ran, shed atomic.Int64
	for g := range 16 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for range 400 {
				k := route([]string{"/a", "/b", "/c"}[rng.IntN(3)])
				tk, err := th.Enter(k, Criticality(rng.IntN(4)), 0)
				if err != nil {
					shed.Add(1)
					continue
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rng.IntN(3000))*time.Microsecond)
				if err := tk.Wait(ctx); err != nil {
					cancel()
					shed.Add(1)
					continue
				}
				cancel()
				ran.Add(1)
				time.Sleep(time.Duration(rng.IntN(200)) * time.Microsecond)
				tk.DoneCost(time.Duration(1+rng.IntN(8000)) * time.Microsecond)
			}
		})
	}
	wg.Wait()
	if v := violations.Load(); v > 0 {
		t.Fatalf("%d instants with the cost bound, the limit or the queue's books broken", v)
	}
	st := th.Stats()
	if st.InFlight != 0 || st.Queued != 0 || st.QueuedCost != 0 {
		t.Fatalf("after the load: %+v", st)
	}
	if ran.Load() == 0 || shed.Load() == 0 {
		t.Fatalf("ran %d shed %d: the test did not exercise both paths", ran.Load(), shed.Load())
	}
	t.Logf("ran %d, shed %d", ran.Load(), shed.Load())
}

// The cost model on a synthetic workload with known costs: each route's
// cost is drawn around a known mean (±30% uniform noise); the mean
// absolute error of the predictions after a warm-up is within 20% of the
// mean cost, and after a route's cost steps up 4× the prediction follows
// within 20 completions.
func TestPredictionError(t *testing.T) {
	m := clock.NewManual(epoch)
	th := New(Config{Clock: m, Limit: 1 << 20, MaxQueueCost: time.Second}) // default weight 0.2
	means := map[RouteKey]float64{route("/cheap"): 500, route("/mid"): 3000, route("/dear"): 20000}
	keys := []RouteKey{route("/cheap"), route("/mid"), route("/dear")}
	rng := rand.New(rand.NewPCG(7, 7))
	var absErr, total float64
	for i := range 6000 {
		k := keys[rng.IntN(3)]
		actual := means[k] * (0.7 + 0.6*rng.Float64())
		pred := float64(th.Predict(k).Microseconds())
		if i >= 300 {
			absErr += math.Abs(pred - actual)
			total += actual
		}
		tk, _ := th.Enter(k, Critical, 0)
		tk.DoneCost(time.Duration(actual) * time.Microsecond)
	}
	rel := absErr / total
	// The noise alone gives 15% (the mean of |U(-0.3,0.3)|); a model that
	// ignored the route would be off by more than 60%.
	if rel > 0.20 {
		t.Errorf("mean absolute error %.1f%% of the cost", 100*rel)
	}
	t.Logf("mean absolute prediction error: %.1f%% of the actual cost", 100*rel)
	k := route("/mid")
	for i := range 20 {
		tk, _ := th.Enter(k, Critical, 0)
		tk.DoneCost(12 * time.Millisecond)
		_ = i
	}
	if p := th.Predict(k); p < 11*time.Millisecond {
		t.Errorf("after 20 completions at 12 ms the prediction is %v", p)
	}
}

// A flood of distinct routes does not grow the model past MaxRoutes.
func TestRouteTableBounded(t *testing.T) {
	th, _ := newManual(t, Config{Limit: 1 << 20, Cost: CostConfig{MaxRoutes: 16}})
	for i := range 10000 {
		tk, _ := th.Enter(RouteKey{"GET", string(rune('a'+i%26)) + time.Duration(i).String()}, Critical, 0)
		tk.DoneCost(time.Millisecond)
	}
	if n := len(th.model.routes); n != 16 {
		t.Fatalf("%d routes tracked", n)
	}
}

// Without a measured cost, a request is charged the process's CPU time
// over its run shared among those in flight (the count at its start and
// end averaged), at most its wall time: two requests running together
// 10 ms while the process burns 10 ms of CPU are charged 10 ms over 1.5
// (the first started alone); a request running 10 ms while the process burns
// nothing (a stall, or waiting on I/O alone) costs nothing.
func TestWallCostSharesProcessCPU(t *testing.T) {
	m := clock.NewManual(epoch)
	var cpu atomic.Int64 // µs
	th := New(Config{Clock: m, Limit: 8, CPUs: 2, Cost: CostConfig{Weight: 1},
		ProcessCPU: func() time.Duration { return time.Duration(cpu.Load()) * time.Microsecond }})
	k := route("/r")
	a, b := enter(t, th, k, Critical), enter(t, th, k, Critical)
	m.Advance(10 * time.Millisecond)
	cpu.Add(10_000)
	a.Done() // load (1 at its start + 2 now)/2 = 1.5
	if p := th.Predict(k); p != 6666*time.Microsecond {
		t.Fatalf("charged %v, want 6.666ms", p)
	}
	b.Done()
	c := enter(t, th, k, Critical)
	m.Advance(20 * time.Millisecond)
	c.Done()
	if p := th.Predict(k); p > time.Microsecond { // the model's floor
		t.Fatalf("a request during which the process used no CPU charged %v", p)
	}
	// Never more than the wall time, however much the process burned.
	d := enter(t, th, k, Critical)
	m.Advance(20 * time.Millisecond)
	cpu.Add(500_000)
	d.Done()
	if p := th.Predict(k); p != 20*time.Millisecond {
		t.Fatalf("charged %v for 20 ms of wall time", p)
	}
}

// With a Rate the throttler is a shaper: requests start one every
// 1/Rate, queued ones on the clock's time, the most critical first, and
// expired ones are dropped, not started.
func TestFixedOutflow(t *testing.T) {
	m := clock.NewManual(epoch)
	th := New(Config{Clock: m, Rate: 10, MaxQueueCost: time.Second, MaxWait: 250 * time.Millisecond, Cost: CostConfig{Initial: time.Millisecond}})
	k := route("/r")
	first := enter(t, th, k, Sheddable)
	if !first.Admitted() {
		t.Fatal("the first request waits")
	}
	s := enter(t, th, k, Sheddable)
	c := enter(t, th, k, Critical)
	late := enter(t, th, k, Sheddable)
	if s.Admitted() || c.Admitted() {
		t.Fatal("two starts in the same 100 ms")
	}
	waitSleeper(t, m)
	m.Advance(99 * time.Millisecond)
	waitSleeper(t, m)
	if c.Admitted() {
		t.Fatal("started before its turn")
	}
	m.Advance(time.Millisecond) // t=100ms: the CRITICAL one's turn
	if err := c.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	if s.Admitted() {
		t.Fatal("two started at 100 ms")
	}
	waitSleeper(t, m)
	m.Advance(100 * time.Millisecond) // t=200ms
	if err := s.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitSleeper(t, m)
	m.Advance(100 * time.Millisecond) // t=300ms: late's deadline (250ms) passed
	if err := late.Wait(context.Background()); !errors.Is(err, ErrExpired) {
		t.Fatalf("late: %v", err)
	}
	first.Done()
	c.Done()
	s.Done()
	// The pacer ends with the queue: no goroutine stays behind.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for {
		th.mu.Lock()
		p := th.pacing
		th.mu.Unlock()
		if !p {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the pacer still runs with an empty queue")
		}
		time.Sleep(time.Millisecond)
	}
	if st := th.Stats(); st.Admitted != 3 || st.Expired[Sheddable] != 1 || st.InFlight != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// One queued request is started on time too (the pacer starts with the
// first request queued).
func TestFixedOutflowOne(t *testing.T) {
	m := clock.NewManual(epoch)
	th := New(Config{Clock: m, Rate: 10, MaxQueueCost: time.Second})
	k := route("/r")
	enter(t, th, k, Critical).Done()
	q := enter(t, th, k, Critical)
	waitSleeper(t, m)
	m.Advance(100 * time.Millisecond)
	if err := q.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	q.Done()
}

func waitSleeper(t *testing.T, m *clock.Manual) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := m.WaitForSleepers(ctx, 1); err != nil {
		t.Fatal("the pacer is not sleeping on the clock:", err)
	}
}

// A request whose predicted wait exceeds its deadline is refused at
// arrival, not after waiting to its deadline; but never before the drain
// rate was measured under saturation (the onset of a burst after an idle
// spell must not be refused on an idle server's throughput), and never
// for a level whose own queue ahead is short (dispatch starts the more
// critical first).
func TestFailFastOnPredictedWait(t *testing.T) {
	th, m := newManual(t, Config{Limit: 1, MaxQueueCost: 10 * time.Second, MaxWait: time.Second})
	r := route("/r")
	// An idle server: one 100 ms request every second, nothing waits.
	for range 3 {
		tk := enter(t, th, r, Sheddable)
		m.Advance(100 * time.Millisecond)
		tk.DoneCost(100 * time.Millisecond)
		m.Advance(900 * time.Millisecond)
	}
	if th.drain.rate != 0 {
		t.Fatalf("drain rate %v measured while nothing waited", th.drain.rate)
	}
	// A burst: 15 requests, 1.5 s of predicted cost against a wait of
	// 1 s. The rate is unknown: all are queued (the cost bound, 10 s, is
	// far).
	run := enter(t, th, r, Sheddable)
	var q []*Ticket
	for i := range 15 {
		tk, err := th.Enter(r, Sheddable, 0)
		if err != nil {
			t.Fatalf("burst request %d refused before the rate was known: %v", i, err)
		}
		q = append(q, tk)
	}
	// Saturated: three completions of 100 ms, 100 ms apart, give a rate
	// of 1 CPU.
	for range 3 {
		m.Advance(100 * time.Millisecond)
		run.DoneCost(100 * time.Millisecond)
		run, q = q[0], q[1:]
		if !run.Admitted() {
			t.Fatal("the queue's head did not run")
		}
	}
	if got := th.drain.rate; math.Abs(got-1) > 0.01 {
		t.Fatalf("drain rate %v, want 1", got)
	}
	// 12 queued, 1.2 s ahead of a SHEDDABLE arrival that must start
	// within 1 s: refused at once, the queue's cost bound far away.
	st := th.Stats()
	if _, err := th.Enter(r, Sheddable, 0); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("SHEDDABLE arrival with 1.2 s of work ahead and 1 s to wait: %v", err)
	}
	if st2 := th.Stats(); st2.Refused[Sheddable] != st.Refused[Sheddable]+1 || st2.Queued != st.Queued {
		t.Errorf("refusal not booked or queue changed: %+v -> %+v", st, st2)
	}
	// A CRITICAL arrival has nothing ahead at its level: queued, and
	// runs next.
	crit := enter(t, th, r, Critical)
	m.Advance(100 * time.Millisecond)
	run.DoneCost(100 * time.Millisecond)
	if !crit.Admitted() {
		t.Fatal("the CRITICAL request did not run next")
	}
	// CRITICAL and above are never refused on the prediction (on a shared
	// host the rate swings 2-3× within seconds; a CRITICAL request waits
	// to its deadline rather than be refused on an estimate): one whose
	// own deadline is 50 ms away, behind 100 ms of CRITICAL work, is
	// queued; a SHEDDABLE_PLUS one in the same place is refused.
	enter(t, th, r, Critical)
	late, err := th.Enter(r, Critical, m.NowMicro()+50_000)
	if err != nil {
		t.Fatalf("CRITICAL with 50 ms to live behind 100 ms of CRITICAL work: %v", err)
	}
	wantState(t, "late CRITICAL", late, waiting)
	if _, err := th.Enter(r, SheddablePlus, m.NowMicro()+50_000); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("SHEDDABLE_PLUS with 50 ms to live behind 200 ms of CRITICAL work: %v", err)
	}
	// Once the queue is short enough, SHEDDABLE arrivals are queued
	// again: withdraw all but 5 (0.7 s ahead with the two CRITICAL).
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tk := range q[5:] {
		tk.Wait(ctx) //nolint:errcheck
	}
	if _, err := th.Enter(r, Sheddable, 0); err != nil {
		t.Fatalf("SHEDDABLE arrival with 0.7 s ahead: %v", err)
	}
}

// A CRITICAL arrival that pushes queued SHEDDABLE requests past their
// deadline evicts them at once (their callers hear it now, not at the
// deadline), the newest first and only those: not before the drain rate
// is measured, and not those that still fit.
func TestDropPushedBack(t *testing.T) {
	th, m := newManual(t, Config{Limit: 1, MaxQueueCost: 10 * time.Second, MaxWait: time.Second})
	r, dear := route("/r"), route("/dear")
	train(t, th, dear, 150*time.Millisecond)
	train(t, th, r, 100*time.Millisecond)
	run := enter(t, th, r, Sheddable)
	var q []*Ticket
	for range 12 {
		q = append(q, enter(t, th, r, Sheddable))
	}
	// Before the rate is known a CRITICAL arrival pushes 1.2 s of
	// SHEDDABLE work back (deadline 1 s) and evicts nothing.
	c0 := enter(t, th, dear, Critical)
	if st := th.Stats(); st.Evicted[Sheddable] != 0 {
		t.Fatalf("evicted %d before the drain rate was measured", st.Evicted[Sheddable])
	}
	// Saturated completions at 1 CPU: at 100 ms, the CRITICAL one
	// runs first, to 250 ms, then two SHEDDABLE ones of 100 ms.
	m.Advance(100 * time.Millisecond)
	run.DoneCost(100 * time.Millisecond)
	if !c0.Admitted() {
		t.Fatal("CRITICAL not dispatched first")
	}
	m.Advance(150 * time.Millisecond)
	c0.DoneCost(150 * time.Millisecond)
	run, q = q[0], q[1:]
	for range 2 {
		m.Advance(100 * time.Millisecond)
		run.DoneCost(100 * time.Millisecond)
		run, q = q[0], q[1:]
	}
	if got := th.drain.rate; math.Abs(got-1) > 0.01 {
		t.Fatalf("drain rate %v, want 1", got)
	}
	// t = 450 ms, 550 ms left to the SHEDDABLE ones' deadline. Keep 4
	// queued: the newest has 0.3 s ahead.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tk := range q[4:] {
		tk.Wait(ctx) //nolint:errcheck
	}
	q = q[:4]
	// A CRITICAL arrival of 150 ms: the newest has 0.45 s ahead, fits.
	enter(t, th, dear, Critical)
	for i, tk := range q {
		wantState(t, fmt.Sprintf("q[%d] after one CRITICAL", i), tk, waiting)
	}
	// Another: 0.6 s ahead of the newest (evicted), 0.5 s of the next
	// (kept).
	enter(t, th, dear, Critical)
	for i, tk := range q {
		want := waiting
		if i == 3 {
			want = evicted
		}
		wantState(t, fmt.Sprintf("q[%d] after two CRITICAL", i), tk, want)
	}
	if err := q[3].Wait(ctx); !errors.Is(err, ErrEvicted) {
		t.Errorf("Wait of the evicted: %v", err)
	}
	if st := th.Stats(); st.Evicted[Sheddable] != 1 || st.Queued != 5 {
		t.Errorf("stats: %+v", st)
	}
}

// The predicted wait of a request counts the more critical work that
// keeps arriving (it is dispatched first): with the server draining
// 1 CPU and CRITICAL work joining at 0.5 CPU, a SHEDDABLE arrival with
// 0.6 s ahead and 1 s to live is refused at once (it gets 0.5 s of the
// server by then), where the drain rate alone would queue it.
func TestPredictedWaitCountsMoreCritical(t *testing.T) {
	th, m := newManual(t, Config{Limit: 1, MaxQueueCost: 10 * time.Second, MaxWait: time.Second})
	r, half := route("/r"), route("/half")
	train(t, th, half, 50*time.Millisecond)
	train(t, th, r, 100*time.Millisecond)
	all := []*Ticket{enter(t, th, r, Sheddable)}
	for range 6 {
		all = append(all, enter(t, th, r, Sheddable))
	}
	for range 2 { // every 100 ms: 50 ms of CRITICAL work joins, 100 ms completes
		m.Advance(100 * time.Millisecond)
		all = append(all, enter(t, th, half, Critical))
		for _, tk := range all {
			if state(tk) == admitted {
				tk.DoneCost(100 * time.Millisecond)
				break
			}
		}
	}
	if d := th.drain; math.Abs(d.rate-1) > 0.01 || math.Abs(d.arrival[Critical]-0.5) > 0.01 || d.arrival[Sheddable] != 0 {
		t.Fatalf("drain %v, CRITICAL joining %v, SHEDDABLE joining %v; want 1, 0.5, 0", d.rate, d.arrival[Critical], d.arrival[Sheddable])
	}
	if st := th.Stats(); st.Queued != 6 || st.QueuedCost != 600*time.Millisecond {
		t.Fatalf("queue %+v, want the 6 SHEDDABLE", st)
	}
	if _, err := th.Enter(r, Sheddable, 0); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("SHEDDABLE with 0.6 s ahead, 1 s to live, 0.5 CPU for its level: %v", err)
	}
}

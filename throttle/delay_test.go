package throttle

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate/floodgate/clock"
)

// TestSuspendResume: Suspend gives an admitted ticket's slot back with
// no completion (another request takes it at once); Resume enters it
// again as an arrival: refused (ErrQueueFull, counted as a refusal) when
// the slot is held and there is no queue, the ticket then finished (Done
// counts nothing); admitted at once when the slot is free, counted in
// Readmitted, never twice in Admitted. Suspend of a ticket not admitted,
// and Resume of one not suspended, change nothing.
func TestSuspendResume(t *testing.T) {
	th, _ := newManual(t, Config{Limit: 1})
	r := route("/d")
	a := enter(t, th, r, Sheddable)
	if !a.Suspend() {
		t.Fatal("Suspend of an admitted ticket: false")
	}
	if a.Suspend() {
		t.Error("Suspend twice: true")
	}
	if st := th.Stats(); st.InFlight != 0 || st.Suspended != 1 || st.Completions != 0 {
		t.Fatalf("after Suspend: %+v; want the slot free, 1 suspended, no completion", st)
	}
	b := enter(t, th, r, Critical)
	if !b.Admitted() {
		t.Fatal("the slot a suspended ticket gave back was not free")
	}
	if err := a.Resume(); err != ErrQueueFull || !IsShed(err) {
		t.Fatalf("Resume with the slot held and no queue: %v, want ErrQueueFull", err)
	}
	if err := a.Resume(); err != ErrNotSuspended {
		t.Errorf("Resume of a shed ticket: %v, want ErrNotSuspended", err)
	}
	a.Done()
	if st := th.Stats(); st.InFlight != 1 || st.Completions != 0 || st.Refused[Sheddable] != 1 || st.Admitted != 2 || st.Readmitted != 0 {
		t.Fatalf("after the shed Resume: %+v; want b alone in flight, 1 refused, 2 admitted, no completion", st)
	}
	b.Done()

	c := enter(t, th, r, Critical)
	if err := c.Resume(); err != ErrNotSuspended {
		t.Errorf("Resume of an admitted ticket: %v", err)
	}
	c.Suspend()
	if err := c.Resume(); err != nil || !c.Admitted() {
		t.Fatalf("Resume with the slot free: %v, admitted %v", err, c.Admitted())
	}
	if err := c.Wait(context.Background()); err != nil {
		t.Fatalf("Wait after an admitting Resume: %v", err)
	}
	if st := th.Stats(); st.InFlight != 1 || st.Admitted != 3 || st.Suspended != 2 || st.Readmitted != 1 {
		t.Fatalf("after the admitting Resume: %+v; want 1 in flight, 3 admitted (each once), 2 suspended, 1 readmitted", st)
	}
	c.Done()
	if st := th.Stats(); st.InFlight != 0 || st.Completions != 2 {
		t.Fatalf("after c.Done: %+v; want 2 completions (b, c)", st)
	}
	if Predicted := c.Predicted(); Predicted != 0 {
		t.Errorf("a ticket admitted at once on Resume has a prediction %v", Predicted)
	}
}

// TestSuspendDispatchesQueued: the slot a ticket suspends goes to the
// head of the queue at once, as Release's and Done's do.
func TestSuspendDispatchesQueued(t *testing.T) {
	th, _ := newManual(t, Config{Limit: 1, MaxQueueCost: time.Second})
	r := route("/d")
	a := enter(t, th, r, Critical)
	b := enter(t, th, r, Critical)
	if b.Admitted() {
		t.Fatal("b admitted over the limit")
	}
	a.Suspend()
	if !b.Admitted() {
		t.Fatal("the queued ticket was not admitted when the slot was suspended")
	}
	b.Done()
	a.Release() // its client left during the delay
	if st := th.Stats(); st.InFlight != 0 || st.Queued != 0 || st.Completions != 1 {
		t.Fatalf("%+v; want nothing in flight or queued, 1 completion (b)", st)
	}
	if err := a.Resume(); err != ErrNotSuspended {
		t.Errorf("Resume after Release: %v", err)
	}
	a.Recycle() // a finished ticket: no panic, nothing held
}

// TestResumeQueuedWaits: a Resume that finds the slot held queues the
// ticket (with its own predicted cost), which Wait admits when the slot
// frees. Its deadline is the one it entered with, MaxWait counted from
// the Resume: a delay longer than MaxWait does not drop it at once.
func TestResumeQueuedWaits(t *testing.T) {
	th, clk := newManual(t, Config{Limit: 1, MaxQueueCost: time.Second, MaxWait: time.Second})
	r := route("/d")
	a := enter(t, th, r, Critical)
	a.Suspend()
	clk.Advance(time.Hour) // the delay, far past MaxWait
	b := enter(t, th, r, Critical)
	if err := a.Resume(); err != nil || a.Admitted() {
		t.Fatalf("Resume with the slot held: %v, admitted %v; want queued", err, a.Admitted())
	}
	if st := th.Stats(); st.Queued != 1 || st.QueuedCost == 0 {
		t.Fatalf("%+v; want a queued with its predicted cost", st)
	}
	clk.Advance(500 * time.Millisecond)
	b.Done()
	if err := a.Wait(context.Background()); err != nil {
		t.Fatalf("Wait: %v (dropped at the deadline of its first entry?)", err)
	}
	a.Done()
	if st := th.Stats(); st.Admitted != 2 || st.Readmitted != 1 || st.Expired != [numLevels]uint64{} || st.InFlight != 0 {
		t.Fatalf("%+v", st)
	}

	// past MaxWait after the Resume, it is dropped as any arrival
	c := enter(t, th, r, Critical)
	c.Suspend()
	d := enter(t, th, r, Critical)
	if err := c.Resume(); err != nil {
		t.Fatal(err)
	}
	clk.Advance(2 * time.Second)
	d.Done()
	if err := c.Wait(context.Background()); err != ErrExpired {
		t.Fatalf("Wait past MaxWait after Resume: %v, want ErrExpired", err)
	}
	c.Recycle()
	if st := th.Stats(); st.InFlight != 0 || st.Queued != 0 || st.Expired[Critical] != 1 {
		t.Fatalf("%+v", st)
	}
}

// sleepOn runs clock's Sleep(ctx, d) in the background.
func sleepOn(c interface {
	Sleep(context.Context, time.Duration) error
}, ctx context.Context, d time.Duration) chan error {
	ch := make(chan error, 1)
	go func() { ch <- c.Sleep(ctx, d) }()
	return ch
}

func waitSleepers(t *testing.T, clk *clock.Manual, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := clk.WaitForSleepers(ctx, n); err != nil {
		t.Fatalf("%d sleepers, want %d", clk.Sleepers(), n)
	}
}

// TestDelayClock: a sleep whose context carries an admitted ticket holds
// no slot while it lasts; when it ends the ticket is admitted again if
// there is room (Sleep returns nil), shed if not (the throttler's error,
// IsShed), or waits its turn in the queue, leaving it with its context
// (ctx's error, withdrawn). A sleep whose context ends leaves the ticket
// suspended, for the caller to end. A context without a ticket, or a
// sleep of 0, sleeps as base does and suspends nothing.
func TestDelayClock(t *testing.T) {
	th, clk := newManual(t, Config{Limit: 1, MaxQueueCost: time.Second})
	dc := DelayClock(clk)
	if dc.NowMicro() != clk.NowMicro() {
		t.Fatal("DelayClock's time is not base's")
	}
	if DelayClock(dc) != dc {
		t.Error("DelayClock of a DelayClock wraps it again")
	}
	r := route("/d")

	// shed: the slot taken while it slept, the queue full of critical work
	a := enter(t, th, r, Sheddable)
	done := sleepOn(dc, a.Context(context.Background()), time.Hour)
	waitSleepers(t, clk, 1)
	if st := th.Stats(); st.InFlight != 0 || st.Suspended != 1 {
		t.Fatalf("during the sleep: %+v; want the slot free", st)
	}
	b := enter(t, th, r, Critical)
	q := make([]*Ticket, 0, 1000)
	for range 1000 { // fill the queue (1 ms predicted each) with CRITICAL
		tk, err := th.Enter(r, Critical, 0)
		if err != nil {
			break
		}
		q = append(q, tk)
	}
	clk.Advance(time.Hour)
	if err := <-done; err != ErrQueueFull || !IsShed(err) {
		t.Fatalf("a sleep ending at a full queue: %v, want ErrQueueFull", err)
	}
	b.Done()
	for _, tk := range q {
		if err := tk.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
		tk.Done()
	}

	// admitted again: the slot free
	a = enter(t, th, r, Critical)
	done = sleepOn(dc, a.Context(context.Background()), time.Hour)
	waitSleepers(t, clk, 1)
	clk.Advance(time.Hour)
	if err := <-done; err != nil || !a.Admitted() {
		t.Fatalf("a sleep ending with the slot free: %v, admitted %v", err, a.Admitted())
	}
	a.Done()

	// queued when it ends, then its context ends: withdrawn
	a = enter(t, th, r, Critical)
	ctx, cancel := context.WithCancel(context.Background())
	done = sleepOn(dc, a.Context(ctx), time.Hour)
	waitSleepers(t, clk, 1)
	b = enter(t, th, r, Critical)
	clk.Advance(time.Hour)
	for th.Stats().Queued != 1 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) || IsShed(err) {
		t.Fatalf("queued after the sleep, context canceled: %v", err)
	}
	b.Done()
	a.Done() // withdrawn: nothing
	a.Recycle()

	// the context ends during the sleep: suspended, ended by Release
	a = enter(t, th, r, Critical)
	ctx, cancel = context.WithCancel(context.Background())
	done = sleepOn(dc, a.Context(ctx), time.Hour)
	waitSleepers(t, clk, 1)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled during the sleep: %v", err)
	}
	if st := state(a); st != suspended {
		t.Fatalf("canceled during the sleep: state %d, want suspended", st)
	}
	a.Release()
	if st := th.Stats(); st.InFlight != 0 || st.Queued != 0 || st.Withdrawn[Critical] != 1 {
		t.Fatalf("%+v; want nothing in flight or queued, 1 withdrawn", st)
	}

	// no ticket, or no sleep: nothing suspended
	susp := th.Stats().Suspended
	done = sleepOn(dc, context.WithValue(context.Background(), ticketKey{}, "not a ticket"), time.Minute)
	waitSleepers(t, clk, 1)
	clk.Advance(time.Minute)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	a = enter(t, th, r, Critical)
	if err := dc.Sleep(a.Context(context.Background()), 0); err != nil || !a.Admitted() {
		t.Fatalf("a sleep of 0: %v, admitted %v", err, a.Admitted())
	}
	a.Done()
	if th.Stats().Suspended != susp {
		t.Error("a sleep without a ticket, or of 0, suspended one")
	}
}

// TestTicketContext: the ticket's context is its parent's (values,
// deadline, cancellation) with the ticket, found through contexts
// derived from it.
func TestTicketContext(t *testing.T) {
	th, _ := newManual(t, Config{Limit: 1})
	tk := enter(t, th, route("/c"), Critical)
	type k struct{}
	parent, cancel := context.WithCancel(context.WithValue(context.Background(), k{}, "v"))
	ctx := context.WithValue(tk.Context(parent), struct{ n int }{1}, 2)
	if ctx.Value(k{}) != "v" || ctx.Value(ticketKey{}) != tk {
		t.Fatal("a value lost")
	}
	cancel()
	if ctx.Err() == nil {
		t.Fatal("the parent's cancellation lost")
	}
	if n := testing.AllocsPerRun(100, func() { _ = tk.Context(parent) }); n != 0 {
		t.Errorf("Ticket.Context allocates %v times", n)
	}
	tk.Done()
	if DelayClock(nil).NowMicro() == 0 {
		t.Error("DelayClock(nil) has no time")
	}
}

// TestConcurrentSuspendResume: 16 goroutines enter, suspend, resume and
// finish tickets at random, with the throttler's invariant checked under
// the lock after every change (run with -race): the limit and the queue's
// cost bound hold at every instant, and at the end nothing is in flight
// or queued, every request was admitted once, and each suspension ended
// in a readmission or a shed counted as such.
func TestConcurrentSuspendResume(t *testing.T) {
	var violations atomic.Int64
	invariant = func(th *Throttler) {
		var sum int64
		for l := range th.queue {
			for tk := th.queue[l].head; tk != nil; tk = tk.next {
				sum += tk.predicted
			}
		}
		if th.queuedCost > th.maxCost || sum != th.queuedCost || th.inflight > th.limit || th.inflight < 0 {
			violations.Add(1)
		}
	}
	defer func() { invariant = nil }()
	th := New(Config{Limit: 3, MaxQueueCost: 5 * time.Millisecond})
	var wg sync.WaitGroup
	var admitted, resumed, shedAfter atomic.Int64
	for g := range 16 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 2))
			for range 300 {
				tk, err := th.Admit(context.Background(), route("/x"), Criticality(rng.IntN(4)), 0)
				if err != nil {
					continue
				}
				admitted.Add(1)
				if rng.IntN(2) == 0 && tk.Suspend() {
					if err := tk.Resume(); err == nil {
						ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rng.IntN(500))*time.Microsecond)
						err = tk.Wait(ctx)
						cancel()
						if err != nil {
							shedAfter.Add(1)
							tk.Recycle()
							continue
						}
					} else {
						shedAfter.Add(1)
						tk.Recycle()
						continue
					}
					resumed.Add(1)
				}
				tk.DoneCost(time.Duration(1+rng.IntN(1000)) * time.Microsecond)
				tk.Recycle()
			}
		})
	}
	wg.Wait()
	if v := violations.Load(); v > 0 {
		t.Fatalf("%d invariant violations", v)
	}
	st := th.Stats()
	if st.InFlight != 0 || st.Queued != 0 || st.QueuedCost != 0 {
		t.Fatalf("after: %+v", st)
	}
	if int64(st.Admitted) != admitted.Load() || int64(st.Readmitted) != resumed.Load() || int64(st.Suspended) != resumed.Load()+shedAfter.Load() {
		t.Fatalf("stats %+v; the callers saw %d admitted, %d resumed, %d shed after", st, admitted.Load(), resumed.Load(), shedAfter.Load())
	}
	if int64(st.Completions) != admitted.Load()-shedAfter.Load() {
		t.Errorf("%d completions, want %d", st.Completions, admitted.Load()-shedAfter.Load())
	}
}

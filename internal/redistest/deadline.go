package redistest

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// SlowestWithBaseline runs Slowest's load (workers goroutines calling
// call again and again for d, each under a context of timeout) and, at the
// same time, as many goroutines doing the same with a call that only waits
// for its context to end. It returns the longest call of each.
//
// The second is the test's baseline: how long past a deadline this
// machine, at this moment, lets a goroutine that merely waits for it run
// again. On an idle machine it is the deadline plus a millisecond or two;
// on a starved one (CI on 2 shared cores) tens of milliseconds more. A test
// whose subject is answering by a deadline allows its calls
// DeadlineBudget of it, not a fixed margin that a busy machine overruns.
func SlowestWithBaseline(workers int, d, timeout time.Duration, call func(ctx context.Context)) (worst, baseline time.Duration) {
	var wg sync.WaitGroup
	wg.Go(func() {
		baseline = Slowest(workers, d, timeout, func(ctx context.Context) { <-ctx.Done() })
	})
	worst = Slowest(workers, d, timeout, call)
	wg.Wait()
	return worst, baseline
}

// DeadlineBudget is how long a call with deadline may take, given the
// baseline SlowestWithBaseline measured beside it: the deadline, margin
// (what the call may take past it on an idle machine), and three times
// the baseline's own lateness, for a call that fails by its deadline runs
// again after about three wake-ups (its timer, the client's connection
// goroutine, its caller), each of which may come as late as the
// baseline's one. On an idle machine that is the deadline plus the margin
// and a few milliseconds.
func DeadlineBudget(deadline, margin, baseline time.Duration) time.Duration {
	return deadline + margin + 3*max(0, baseline-deadline)
}

// A Starvation watches, while a test runs, how late this process's
// goroutines wake up: a goroutine sleeps 5 ms again and again and records
// how far past its time each sleep ends. On an idle host that is under a
// millisecond; on a starved one (2 shared cores beside stress-ng and other
// test binaries) it reached a fifth of a second. A test whose subject is a
// time limit allows its steps a multiple of the worst seen (Allow), so the
// limit stays the subject and a busy host does not fail the test.
type Starvation struct {
	worst atomic.Int64
}

// WatchStarvation starts watching, until the test ends. It returns after
// a first measure of 300 ms, for limits set before the test's steps (a
// store's timeout).
func WatchStarvation(t testing.TB) *Starvation {
	s := &Starvation{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		const step = 5 * time.Millisecond
		for {
			at := time.Now().Add(step)
			select {
			case <-stop:
				return
			case <-time.After(step):
			}
			late := int64(time.Since(at))
			for {
				old := s.worst.Load()
				if late <= old || s.worst.CompareAndSwap(old, late) {
					break
				}
			}
		}
	})
	t.Cleanup(func() { close(stop); wg.Wait() })
	time.Sleep(300 * time.Millisecond)
	return s
}

// Worst returns the latest wake-up seen so far.
func (s *Starvation) Worst() time.Duration { return time.Duration(max(0, s.worst.Load())) }

// Allow returns limit plus wakeups times the worst lateness seen so far:
// the budget of a step that takes limit on an idle host and needs about
// wakeups goroutine wake-ups (a timer, a connection's reader, the
// caller...), each of which may come that late.
func (s *Starvation) Allow(limit time.Duration, wakeups int) time.Duration {
	return limit + time.Duration(wakeups)*s.Worst()
}

package redistest

import (
	"context"
	"sync"
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

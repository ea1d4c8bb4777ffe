package adaptive_test

import (
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate/floodgate/adaptive"
	"github.com/floodgate/floodgate/clock"
)

func newThrottle(t *testing.T, clk *clock.Manual, o adaptive.Options) *adaptive.Throttle {
	t.Helper()
	o.Clock = clk
	if o.Rand == nil {
		r := rand.New(rand.NewPCG(1, 2))
		o.Rand = r.Float64
	}
	th, err := adaptive.New(o)
	if err != nil {
		t.Fatal(err)
	}
	return th
}

// The formula, and the window sliding the counts out.
func TestFormulaAndWindow(t *testing.T) {
	clk := clock.NewManual(time.Unix(1000, 0))
	th := newThrottle(t, clk, adaptive.Options{Window: 10 * time.Second, Buckets: 10})
	if p := th.DropProbability("a"); p != 0 {
		t.Fatalf("a fresh target: p = %v", p)
	}
	for i := range 10 {
		th.Admit("a", false)
		th.Done("a", i < 5) // 5 of 10 accepted: K·accepts = requests
	}
	if p := th.DropProbability("a"); p != 0 {
		t.Fatalf("half accepted with K=2: p = %v, want 0", p)
	}
	for range 10 {
		th.Admit("a", false)
		th.Done("a", false)
	}
	// 20 requests, 5 accepts: (20 − 10) / 21
	if p, want := th.DropProbability("a"), 10.0/21; math.Abs(p-want) > 1e-12 {
		t.Fatalf("p = %v, want %v", p, want)
	}
	if p := th.DropProbability("b"); p != 0 {
		t.Fatalf("another target: p = %v", p)
	}
	clk.Advance(10 * time.Second) // the window has moved past all of it
	if r, a, _, _ := th.Counts("a"); r != 0 || a != 0 {
		t.Fatalf("after a window: %d requests, %d accepts", r, a)
	}
}

func TestOptionsErrors(t *testing.T) {
	for _, o := range []adaptive.Options{{K: 0.5}, {Buckets: -1}, {Window: time.Microsecond, Buckets: 20}} {
		if _, err := adaptive.New(o); err == nil {
			t.Errorf("New(%+v) accepted", o)
		}
	}
}

// The retry budget on its own: retries never pass ratio·firsts + min in
// the window, and come back as the window moves.
func TestRetryBudget(t *testing.T) {
	clk := clock.NewManual(time.Unix(1000, 0))
	th := newThrottle(t, clk, adaptive.Options{Window: 10 * time.Second, Buckets: 10, RetryRatio: 0.2, MinRetries: 3})
	for range 50 {
		th.Admit("a", false)
	}
	granted := 0
	for range 100 {
		if th.AllowRetry("a") {
			granted++
		}
	}
	if granted != 13 { // 0.2 × 50 + 3
		t.Fatalf("granted %d retries, want 13", granted)
	}
	clk.Advance(10 * time.Second)
	granted = 0
	for range 100 {
		if th.AllowRetry("a") {
			granted++
		}
	}
	if granted != 3 {
		t.Fatalf("a quiet window granted %d, want MinRetries 3", granted)
	}
	off := newThrottle(t, clk, adaptive.Options{RetryRatio: -1, MinRetries: -1})
	off.Admit("a", false)
	if off.AllowRetry("a") {
		t.Fatal("a negative budget granted a retry")
	}
}

// A flood of targets: the table stays bounded.
func TestTargetsBounded(t *testing.T) {
	clk := clock.NewManual(time.Unix(1000, 0))
	th := newThrottle(t, clk, adaptive.Options{MaxTargets: 100})
	for i := range 10000 {
		th.Admit(string(rune(i)), false)
	}
	if n := adaptive.TargetsOf(th); n > 100 {
		t.Fatalf("%d targets tracked, MaxTargets 100", n)
	}
}

// Many goroutines on one target (-race): the budget's bound holds for
// what was granted in total, and every count adds up.
func TestConcurrentBudget(t *testing.T) {
	clk := clock.NewManual(time.Unix(1000, 0))
	th, err := adaptive.New(adaptive.Options{Clock: clk, Window: time.Hour, RetryRatio: 0.1, MinRetries: 5})
	if err != nil {
		t.Fatal(err)
	}
	var granted atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := range 500 {
				th.Admit("a", false)
				th.Done("a", i%3 == 0)
				if th.AllowRetry("a") {
					granted.Add(1)
					th.Admit("a", true)
				}
			}
		})
	}
	wg.Wait()
	req, _, firsts, retries := th.Counts("a")
	if firsts != 4000 || retries != granted.Load() || req != firsts+retries {
		t.Fatalf("counts: %d requests, %d firsts, %d retries (granted %d)", req, firsts, retries, granted.Load())
	}
	if float64(retries) > 0.1*float64(firsts)+5 || retries < 300 {
		t.Fatalf("%d retries granted for %d first attempts; want the budget's 405 at most, and near it", retries, firsts)
	}
}

package clock_test

import (
	"context"
	"fmt"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/memstore"
)

// A manual clock makes a limiter's windows exact and instant in tests:
// the clock moves only when told to.
func ExampleManual() {
	ctx := context.Background()
	clk := clock.NewManual(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
	l := floodgate.NewLimiter(
		floodgate.MustPolicy("per-user", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 1, Period: time.Minute}),
		memstore.MustNew(memstore.Options{}), floodgate.WithClock(clk))

	for _, step := range []time.Duration{0, 30 * time.Second, 30 * time.Second} {
		clk.Advance(step)
		d, _ := l.Allow(ctx, "user:1")
		fmt.Printf("%s allowed=%v\n", clk.Now().Format("15:04:05"), d.Allowed)
	}
	// Output:
	// 12:00:00 allowed=true
	// 12:00:30 allowed=false
	// 12:01:00 allowed=true
}

// Code that waits sleeps on the limiter's clock, so a test can let it
// through by moving the clock once its sleeper is in place, without
// sleeping itself.
func ExampleManual_WaitForSleepers() {
	ctx := context.Background()
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := clock.NewManual(start)
	l := floodgate.NewLimiter(
		floodgate.MustPolicy("one-a-second", floodgate.Rule{Algorithm: floodgate.TokenBucket, Limit: 1, Period: time.Second}),
		memstore.MustNew(memstore.Options{}), floodgate.WithClock(clk))
	l.Allow(ctx, "job") // takes the only token

	done := make(chan error)
	go func() { done <- l.Wait(ctx, "job") }()
	if err := clk.WaitForSleepers(ctx, 1); err != nil {
		panic(err)
	}
	fmt.Println("sleepers:", clk.Sleepers())
	clk.Advance(time.Second)
	fmt.Println("admitted:", <-done == nil, "after", clk.Now().Sub(start))
	// Output:
	// sleepers: 1
	// admitted: true after 1s
}

// Production code reads the default clock, Coarse (a cached wall clock);
// Precise reads the system clock on every decision.
func ExamplePrecise() {
	policy := floodgate.MustPolicy("api", floodgate.Rule{Limit: 100, Period: time.Second})
	l := floodgate.NewLimiter(policy, memstore.MustNew(memstore.Options{}), floodgate.WithClock(clock.Precise))
	_ = l
}

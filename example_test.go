package floodgate_test

import (
	"context"
	"fmt"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/memstore"
)

// Ten requests a minute and 500 an hour per user, all or nothing.
func Example() {
	policy := floodgate.MustPolicy("api",
		floodgate.Rule{Name: "minute", Algorithm: floodgate.SlidingWindow, Limit: 10, Period: time.Minute},
		floodgate.Rule{Name: "hour", Algorithm: floodgate.SlidingWindow, Limit: 500, Period: time.Hour},
	)
	limiter := floodgate.NewLimiter(policy, memstore.MustNew(memstore.Options{}))

	for i := range 12 {
		d, _ := limiter.Allow(context.Background(), "user:241531")
		if !d.Allowed {
			fmt.Printf("request %d: denied by the %s rule\n", i+1, d.Rule)
			break
		}
	}
	// Output: request 11: denied by the minute rule
}

func ExampleLimiter_Allow() {
	ctx := context.Background()
	clk := clock.NewManual(time.Date(2026, 1, 1, 3, 0, 0, 0, time.UTC))
	// Three requests a minute, restored in whole at the end of each minute.
	l := floodgate.NewLimiter(
		floodgate.MustPolicy("seed", floodgate.Rule{Limit: 3, Period: time.Minute, Refill: floodgate.RefillInterval}),
		memstore.MustNew(memstore.Options{}), floodgate.WithClock(clk))
	for _, at := range []time.Duration{0, 10 * time.Second, 30 * time.Second, 55 * time.Second, 60 * time.Second} {
		clk.Set(time.Date(2026, 1, 1, 3, 0, 0, 0, time.UTC).Add(at))
		d, _ := l.Allow(ctx, "user:1")
		fmt.Printf("%3s allowed=%-5v remaining=%d retry-after=%s\n", at, d.Allowed, d.Remaining, d.RetryAfter)
	}
	// Output:
	//  0s allowed=true  remaining=2 retry-after=0s
	// 10s allowed=true  remaining=1 retry-after=0s
	// 30s allowed=true  remaining=0 retry-after=0s
	// 55s allowed=false remaining=0 retry-after=5s
	// 1m0s allowed=true  remaining=2 retry-after=0s
}

// Count only what failed: three failed card transactions a day.
func ExampleLimiter_Charge() {
	ctx := context.Background()
	clk := clock.NewManual(time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC))
	l := floodgate.NewLimiter(floodgate.MustPolicy("card-failures",
		floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 3, Calendar: floodgate.CalendarDay}),
		memstore.MustNew(memstore.Options{}), floodgate.WithClock(clk))

	for attempt := 1; attempt <= 5; attempt++ {
		if d, _ := l.PeekN(ctx, "card:4242", 1); !d.Allowed {
			fmt.Printf("attempt %d: blocked for %s\n", attempt, d.RetryAfter)
			continue
		}
		fmt.Printf("attempt %d: tried, failed\n", attempt)
		l.Charge(ctx, "card:4242", 1) // the transaction failed: count it
	}
	// Output:
	// attempt 1: tried, failed
	// attempt 2: tried, failed
	// attempt 3: tried, failed
	// attempt 4: blocked for 15h0m0s
	// attempt 5: blocked for 15h0m0s
}

// A leaky bucket as a shaper: requests leave at a fixed pace.
func ExampleLimiter_Reserve() {
	ctx := context.Background()
	clk := clock.NewManual(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	l := floodgate.NewLimiter(floodgate.MustPolicy("shaper",
		floodgate.Rule{Algorithm: floodgate.LeakyBucketShaper, Limit: 2, Period: time.Second, Burst: 3}),
		memstore.MustNew(memstore.Options{}), floodgate.WithClock(clk))
	for i := 1; i <= 5; i++ {
		r, _ := l.Reserve(ctx, "queue", 1)
		fmt.Printf("request %d: queued=%v leaves after %s\n", i, r.OK(), r.Delay)
	}
	// Output:
	// request 1: queued=true leaves after 0s
	// request 2: queued=true leaves after 500ms
	// request 3: queued=true leaves after 1s
	// request 4: queued=false leaves after 0s
	// request 5: queued=false leaves after 0s
}

// Per IP and per user in one store call.
func ExampleAllowBatch() {
	ctx := context.Background()
	store := memstore.MustNew(memstore.Options{})
	clk := floodgate.WithClock(clock.NewManual(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)))
	perIP := floodgate.NewLimiter(floodgate.MustPolicy("ip", floodgate.Rule{Limit: 100, Period: time.Minute}), store, clk)
	perUser := floodgate.NewLimiter(floodgate.MustPolicy("user", floodgate.Rule{Limit: 2, Period: time.Minute}), store, clk)

	out := make([]floodgate.Decision, 2)
	for range 3 {
		floodgate.AllowBatch(ctx, []floodgate.Item{
			{Limiter: perIP, Key: "203.0.113.7", Cost: 1},
			{Limiter: perUser, Key: "user:42", Cost: 1},
		}, out)
		fmt.Printf("ip: %v (%d left)  user: %v (%d left)\n", out[0].Allowed, out[0].Remaining, out[1].Allowed, out[1].Remaining)
	}
	// Output:
	// ip: true (99 left)  user: true (1 left)
	// ip: true (98 left)  user: true (0 left)
	// ip: true (97 left)  user: false (0 left)
}

// Per IP and per user, all or nothing: a request the user's limit refuses
// takes nothing from the address's, in one atomic step.
func ExampleAllowAll() {
	ctx := context.Background()
	store := memstore.MustNew(memstore.Options{})
	clk := floodgate.WithClock(clock.NewManual(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)))
	perIP := floodgate.NewLimiter(floodgate.MustPolicy("ip", floodgate.Rule{Limit: 100, Period: time.Minute}), store, clk)
	perUser := floodgate.NewLimiter(floodgate.MustPolicy("user", floodgate.Rule{Limit: 2, Period: time.Minute}), store, clk)

	out := make([]floodgate.Decision, 2)
	for range 3 {
		ok, _ := floodgate.AllowAll(ctx, []floodgate.Item{
			{Limiter: perIP, Key: "203.0.113.7", Cost: 1},
			{Limiter: perUser, Key: "user:42", Cost: 1},
		}, out)
		fmt.Printf("admitted: %v  ip: %d left  user: %d left\n", ok, out[0].Remaining, out[1].Remaining)
	}
	// Output:
	// admitted: true  ip: 99 left  user: 1 left
	// admitted: true  ip: 98 left  user: 0 left
	// admitted: false  ip: 98 left  user: 0 left
}

package memstore_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/memstore"
)

// One store serves every limiter of a process: per address and per user
// here, each policy's keys kept apart.
func Example() {
	ctx := context.Background()
	store := memstore.MustNew(memstore.Options{MaxKeys: 1 << 20})
	defer store.Close()

	perIP := floodgate.NewLimiter(floodgate.MustPolicy("per-ip", floodgate.Rule{Limit: 100, Period: time.Minute}), store)
	perUser := floodgate.NewLimiter(floodgate.MustPolicy("per-user", floodgate.Rule{Limit: 10, Period: time.Minute}), store)

	perIP.Allow(ctx, "203.0.113.7")
	perUser.Allow(ctx, "user:1")
	d, _ := perUser.Allow(ctx, "user:2")
	fmt.Printf("user:2 has %d left; the store holds %d keys\n", d.Remaining, store.Stats().Keys)
	// Output: user:2 has 9 left; the store holds 3 keys
}

// A daily quota that survives a restart: the store writes every key to its
// snapshot on Close (and every SnapshotInterval), and New reads it back.
func Example_snapshot() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "memstore-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	clk := clock.NewManual(time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC))
	opts := memstore.Options{SnapshotPath: filepath.Join(dir, "limits.snapshot"), Clock: clk}
	daily := floodgate.MustPolicy("daily", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 3, Calendar: floodgate.CalendarDay})

	store, err := memstore.New(opts)
	if err != nil {
		panic(err)
	}
	l := floodgate.NewLimiter(daily, store, floodgate.WithClock(clk))
	l.Allow(ctx, "user:1")
	l.Allow(ctx, "user:1")
	store.Close() // the process stops

	store, err = memstore.New(opts) // and starts again
	if err != nil {
		panic(err)
	}
	defer store.Close()
	l = floodgate.NewLimiter(daily, store, floodgate.WithClock(clk))
	for range 2 {
		d, _ := l.Allow(ctx, "user:1")
		fmt.Printf("allowed=%v remaining=%d\n", d.Allowed, d.Remaining)
	}
	// Output:
	// allowed=true remaining=0
	// allowed=false remaining=0
}

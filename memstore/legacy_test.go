package memstore

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/clock"
)

// A snapshot and a journal written before a sliding log counting
// rejections kept one entry more than its limit (testdata, written by
// the previous version: four allows of key a and one of b, t0 to t0+3s)
// are read, each key's state widened, and decide as if the trace had
// been run live.
func TestLegacyCountRejectedLayout(t *testing.T) {
	pol := floodgate.MustPolicy("legacy",
		floodgate.Rule{Name: "log", Algorithm: floodgate.SlidingLog, Limit: 5, Period: time.Minute, CountRejected: true},
		floodgate.Rule{Name: "fixed", Algorithm: floodgate.FixedWindow, Limit: 3, Period: time.Hour},
	)
	t0 := time.Date(2026, 6, 1, 11, 59, 30, 0, time.UTC)
	ctx := context.Background()
	type op struct {
		at   time.Duration
		key  string
		cost int64
		peek bool
	}
	ops := []op{
		{4 * time.Second, "a", 0, true}, {4 * time.Second, "a", 1, false},
		{31 * time.Second, "a", 1, false}, {32 * time.Second, "a", 0, true},
		{61 * time.Second, "a", 1, false}, {31 * time.Second, "b", 2, false},
		{62 * time.Second, "b", 0, true},
	}
	for _, kind := range []string{"snapshot", "journal"} {
		t.Run(kind, func(t *testing.T) {
			dir := t.TempDir()
			src := filepath.Join("testdata", "legacy-count-rejected", kind)
			files, err := os.ReadDir(src)
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range files {
				b, err := os.ReadFile(filepath.Join(src, f.Name()))
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, f.Name()), b, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			clk := clock.NewManual(t0.Add(4 * time.Second))
			o := Options{SnapshotPath: filepath.Join(dir, "snap"), SnapshotInterval: time.Hour, SweepInterval: -1, Clock: clk}
			if kind == "journal" {
				o.JournalPath, o.JournalSync = filepath.Join(dir, "journal"), -1
			}
			old, err := New(o)
			if err != nil {
				t.Fatalf("reading the older layout: %v", err)
			}
			defer old.Close()
			liveClk := clock.NewManual(t0)
			live := MustNew(Options{SweepInterval: -1, Clock: liveClk})
			defer live.Close()
			ll := floodgate.NewLimiter(pol, live, floodgate.WithClock(liveClk))
			for i := range 4 {
				ll.Allow(ctx, "a")
				if i == 3 {
					ll.Allow(ctx, "b")
				}
				liveClk.Advance(time.Second)
			}
			ol := floodgate.NewLimiter(pol, old, floodgate.WithClock(clk))
			for i, o := range ops {
				clk.Set(t0.Add(o.at))
				liveClk.Set(t0.Add(o.at))
				do := func(l *floodgate.Limiter) floodgate.Decision {
					var d floodgate.Decision
					var err error
					if o.peek {
						d, err = l.PeekN(ctx, o.key, o.cost)
					} else {
						d, err = l.AllowN(ctx, o.key, o.cost)
					}
					if err != nil {
						t.Fatal(err)
					}
					return d
				}
				if got, want := do(ol), do(ll); got != want {
					t.Errorf("op %d %+v: restored %+v, live %+v", i, o, got, want)
				}
			}
		})
	}
}

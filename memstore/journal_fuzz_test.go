package memstore_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/memstore"
)

// A journal segment damaged in any way (a torn tail, a disk error, a file
// from elsewhere) makes New fail with an error, or restores something the
// store can decide on, snapshot and close: never a panic, then or at the
// next decisions. The seeds are a segment of every algorithm's keys, cut
// and whole; `go test` runs them as a normal test.
func FuzzJournal(f *testing.F) {
	clk := clock.NewManual(t0)
	dir := f.TempDir()
	opts := memstore.Options{SnapshotPath: filepath.Join(dir, "s.snap"), JournalPath: filepath.Join(dir, "j"),
		JournalSync: -1, SweepInterval: -1, Clock: clk}
	s, err := memstore.New(opts)
	if err != nil {
		f.Fatal(err)
	}
	ctx := context.Background()
	for _, p := range fuzzPolicies() {
		l := floodgate.NewLimiter(p, s, floodgate.WithClock(clk))
		for i := range 3 {
			l.AllowN(ctx, "k"+strconv.Itoa(i), int64(i+1))
		}
		l.Refund(ctx, "k1", 1)
		l.Reset(ctx, "k2")
	}
	if err := s.SyncJournal(); err != nil {
		f.Fatal(err)
	}
	seed, err := os.ReadFile(filepath.Join(dir, "j.0000000000000001"))
	if err != nil {
		f.Fatal(err)
	}
	s.Close()
	f.Add(seed)
	f.Add(seed[:len(seed)-5])
	f.Add(seed[:len(seed)/2])
	f.Add(seed[:44])
	f.Add([]byte{})
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "j.0000000000000001"), b, 0o600); err != nil {
			t.Fatal(err)
		}
		clk := clock.NewManual(t0.Add(time.Second))
		opts := memstore.Options{SnapshotPath: filepath.Join(dir, "s.snap"), JournalPath: filepath.Join(dir, "j"),
			JournalSync: -1, SweepInterval: -1, Clock: clk, MaxKeys: 1000, Logger: quiet}
		s, err := memstore.New(opts)
		if err != nil {
			return
		}
		for _, p := range fuzzPolicies() {
			l := floodgate.NewLimiter(p, s, floodgate.WithClock(clk))
			for i := range 3 {
				k := "k" + strconv.Itoa(i)
				if d, err := l.AllowN(ctx, k, 1); err != nil || d.Remaining < 0 || d.Limit <= 0 {
					t.Fatalf("%s %s: %+v %v", p.Name(), k, d, err)
				}
				l.PeekN(ctx, k, 2)
				l.Refund(ctx, k, 1)
			}
		}
		clk.Advance(48 * time.Hour)
		s.Sweep(clk.NowMicro())
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	})
}

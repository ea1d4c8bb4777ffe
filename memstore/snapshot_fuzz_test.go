package memstore_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/memstore"
)

// fuzzPolicies are the policies of the fuzzer's seed snapshot, one per
// algorithm; a restored table is decided under them.
func fuzzPolicies() []*floodgate.Policy {
	var ps []*floodgate.Policy
	for _, alg := range []floodgate.Algorithm{floodgate.TokenBucket, floodgate.GCRA, floodgate.LeakyBucket,
		floodgate.FixedWindow, floodgate.SlidingWindow, floodgate.SlidingLog, floodgate.SlidingSubwindow} {
		r := floodgate.Rule{Name: "r", Algorithm: alg, Limit: 5, Period: time.Minute}
		if alg == floodgate.SlidingSubwindow {
			r.Granularity = 10 * time.Second
		}
		ps = append(ps, floodgate.MustPolicy("f-"+string(alg), r,
			floodgate.Rule{Name: "day", Algorithm: floodgate.FixedWindow, Limit: 50, Calendar: floodgate.CalendarDay}))
	}
	return ps
}

// A snapshot file damaged in any way (a disk error, a file truncated by a
// crash, a file from elsewhere) makes New fail with an error, or restores
// something the store can decide on: never a panic, then or at the next
// decisions.
func FuzzSnapshot(f *testing.F) {
	clk := clock.NewManual(t0)
	path := filepath.Join(f.TempDir(), "seed.snap")
	s, err := memstore.New(memstore.Options{SnapshotPath: path, SweepInterval: -1, Clock: clk})
	if err != nil {
		f.Fatal(err)
	}
	ctx := context.Background()
	for _, p := range fuzzPolicies() {
		l := floodgate.NewLimiter(p, s, floodgate.WithClock(clk))
		for i := range 3 {
			l.AllowN(ctx, "k"+strconv.Itoa(i), int64(i+1))
		}
	}
	if err := s.Close(); err != nil {
		f.Fatal(err)
	}
	seed, err := os.ReadFile(path)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	f.Add(seed[:len(seed)/2])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		path := filepath.Join(t.TempDir(), "s.snap")
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		clk := clock.NewManual(t0.Add(time.Second))
		s, err := memstore.New(memstore.Options{SnapshotPath: path, SweepInterval: -1, Clock: clk, MaxKeys: 1000})
		if err != nil {
			return
		}
		defer s.Close()
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
	})
}

// A damaged state in a snapshot that is otherwise well formed (a sliding
// log's ring head far out of its ring) is refused as a damaged file; it
// panicked with an index out of range.
func TestSnapshotDamagedStateIsAnError(t *testing.T) {
	clk := clock.NewManual(t0)
	path := filepath.Join(t.TempDir(), "s.snap")
	s, err := memstore.New(memstore.Options{SnapshotPath: path, SweepInterval: -1, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	p := floodgate.MustPolicy("log", floodgate.Rule{Algorithm: floodgate.SlidingLog, Limit: 5, Period: time.Minute})
	floodgate.NewLimiter(p, s, floodgate.WithClock(clk)).Allow(context.Background(), "k")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	// the key's state: 1 entry, head 0, the entry's time
	var st [24]byte
	binary.LittleEndian.PutUint64(st[0:], 1)
	binary.LittleEndian.PutUint64(st[16:], uint64(clk.NowMicro()))
	i := bytes.Index(b, st[:])
	if i < 0 {
		t.Fatal("the state is not in the snapshot")
	}
	binary.LittleEndian.PutUint64(b[i+8:], 1<<55) // the ring's head
	os.WriteFile(path, b, 0o600)
	_, err = memstore.New(memstore.Options{SnapshotPath: path, SweepInterval: -1, Clock: clk})
	if err == nil || !strings.Contains(err.Error(), "damaged") {
		t.Fatalf("a damaged state: %v, want an error saying the file is damaged", err)
	}
}

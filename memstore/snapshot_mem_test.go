package memstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
)

// wideLog is a sliding log of 10,000 an hour: 80 KB a key.
func wideLog(name string) *floodgate.Policy {
	return floodgate.MustPolicy(name, floodgate.Rule{Name: "hour", Algorithm: floodgate.SlidingLog, Limit: 10000, Period: time.Hour})
}

// fill makes keys keys of p in s, each consumed once at now.
func fill(t testing.TB, s *Store, p *floodgate.Policy, keys int, now int64) {
	t.Helper()
	for k := range keys {
		if _, err := s.Do(context.Background(), now, floodgate.Op{Policy: p, Key: fmt.Sprint("k", k), Cost: 1}); err != nil {
			t.Fatal(err)
		}
	}
}

// allocated returns the bytes f allocated (runtime.MemStats.TotalAlloc).
func allocated(f func()) uint64 {
	var a, b runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&a)
	f()
	runtime.ReadMemStats(&b)
	return b.TotalAlloc - a.TotalAlloc
}

// A snapshot streams the tables to the file: it allocated about five times
// the tables (every key appended to one slice, then written), and with
// sliding logs at the 1 GiB memory cap a periodic snapshot took a process
// to 6 GB. Restoring reads a table at a time into the store's tables, not
// the whole file into memory first.
func TestSnapshotMemoryIsBounded(t *testing.T) {
	const now = 1_000_000
	s, err := New(Options{MaxMemory: 64 << 20, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	fill(t, s, wideLog("wide"), 1000, now)
	narrow := floodgate.MustPolicy("narrow", floodgate.Rule{Name: "minute", Limit: 10, Period: time.Minute})
	fill(t, s, narrow, 5000, now)
	st := s.Stats()
	if st.Bytes < 48<<20 {
		t.Fatalf("tables hold %d MB, want about 64", st.Bytes>>20)
	}

	path := filepath.Join(t.TempDir(), "state.snap")
	var snapErr error
	snap := allocated(func() { snapErr = s.Snapshot(path) })
	if snapErr != nil {
		t.Fatal(snapErr)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d keys, tables %.1f MB, file %.1f MB: the snapshot allocated %.2f MB",
		st.Keys, float64(st.Bytes)/(1<<20), float64(fi.Size())/(1<<20), float64(snap)/(1<<20))
	if snap > uint64(st.Bytes)/4 {
		t.Errorf("the snapshot allocated %d MB for %d MB of tables, want under a quarter", snap>>20, st.Bytes>>20)
	}

	var s2 *Store
	restore := allocated(func() {
		s2, err = New(Options{MaxMemory: 64 << 20, SweepInterval: -1, SnapshotPath: path, Clock: fixedClock(now)})
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	st2 := s2.Stats()
	t.Logf("restoring allocated %.1f MB for %.1f MB of tables (%d keys)", float64(restore)/(1<<20), float64(st2.Bytes)/(1<<20), st2.Keys)
	if st2.Keys != st.Keys {
		t.Fatalf("restored %d keys of %d", st2.Keys, st.Keys)
	}
	// The tables grow by doubling as they fill (2× their size allocated
	// in all); reading the whole file first added its size besides.
	if restore > uint64(st2.Bytes)*5/2 {
		t.Errorf("restoring allocated %d MB for %d MB of tables, want under 2.5 times", restore>>20, st2.Bytes>>20)
	}
}

type fixedClock int64

func (c fixedClock) NowMicro() int64                                  { return int64(c) }
func (c fixedClock) Sleep(ctx context.Context, d time.Duration) error { return nil }

// The snapshot file is byte for byte what the writer before streaming made
// (legacyWriteSnapshot below, kept as it was), and a file of several
// tables made by it restores every key with its consumption.
func TestSnapshotFormatUnchanged(t *testing.T) {
	const now = 1_000_000
	dir := t.TempDir()
	opts := Options{SweepInterval: -1, Shards: 8}
	day := floodgate.MustPolicy("day", floodgate.Rule{Name: "day", Algorithm: floodgate.FixedWindow, Limit: 3, Calendar: floodgate.CalendarDay, Location: time.UTC})
	policies := []*floodgate.Policy{
		floodgate.MustPolicy("log", floodgate.Rule{Name: "log", Algorithm: floodgate.SlidingLog, Limit: 50, Period: time.Hour}),
		floodgate.MustPolicy("bucket", floodgate.Rule{Name: "b", Algorithm: floodgate.TokenBucket, Limit: 100, Period: time.Hour, Burst: 20}),
		day,
	}

	// One table: the same bytes.
	one, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	fill(t, one, policies[0], 300, now)
	var legacy bytes.Buffer
	if err := legacyWriteSnapshot(one, &legacy); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "one.snap")
	if err := one.Snapshot(path); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(path); !bytes.Equal(got, legacy.Bytes()) {
		t.Fatalf("snapshot of %d bytes differs from the legacy writer's %d", len(got), legacy.Len())
	}

	// Several tables, written by the legacy writer, restored.
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, p := range policies {
		fill(t, s, p, 200, now)
	}
	for range 2 {
		s.Do(context.Background(), now, floodgate.Op{Policy: day, Key: "k7", Cost: 1})
	}
	legacy.Reset()
	if err := legacyWriteSnapshot(s, &legacy); err != nil {
		t.Fatal(err)
	}
	path = filepath.Join(dir, "legacy.snap")
	if err := os.WriteFile(path, legacy.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := New(Options{SweepInterval: -1, Shards: 8, SnapshotPath: path, Clock: fixedClock(now)})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if got, want := r.Stats().Keys, s.Stats().Keys; got != want {
		t.Fatalf("restored %d keys of %d", got, want)
	}
	for _, p := range policies {
		for _, k := range []string{"k0", "k7", "k199"} {
			want, _ := s.Do(context.Background(), now, floodgate.Op{Policy: p, Key: k, Kind: floodgate.OpPeek})
			got, _ := r.Do(context.Background(), now, floodgate.Op{Policy: p, Key: k, Kind: floodgate.OpPeek})
			if got.Allowed != want.Allowed || got.Remaining != want.Remaining {
				t.Errorf("%s %s restored: %+v, want %+v", p.Name(), k, got, want)
			}
		}
	}
	// and the new writer's file of it restores the same
	path2 := filepath.Join(dir, "new.snap")
	if err := r.Snapshot(path2); err != nil {
		t.Fatal(err)
	}
	r2, err := New(Options{SweepInterval: -1, Shards: 8, SnapshotPath: path2, Clock: fixedClock(now)})
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	if got, want := r2.Stats().Keys, s.Stats().Keys; got != want {
		t.Fatalf("restored again %d keys of %d", got, want)
	}
}

// legacyWriteSnapshot is writeSnapshot as it was before it streamed: every
// table copied into one slice, then written.
func legacyWriteSnapshot(s *Store, w io.Writer) error {
	s.mu.Lock()
	tables := make([]*table, 0, len(s.byName))
	for _, t := range s.byName {
		tables = append(tables, t)
	}
	s.mu.Unlock()

	le := binary.LittleEndian
	buf := []byte(snapMagic)
	buf = le.AppendUint64(buf, s.k0)
	buf = le.AppendUint64(buf, s.k1)
	buf = le.AppendUint32(buf, uint32(len(tables)))
	if _, err := w.Write(buf); err != nil {
		return err
	}
	writeTable := func(p *floodgate.Policy, wps int, words []int64, count int) error {
		hdr, err := json.Marshal(header(p))
		if err != nil {
			return err
		}
		b := le.AppendUint32(nil, uint32(len(hdr)))
		b = append(b, hdr...)
		b = le.AppendUint32(b, uint32(wps))
		b = le.AppendUint64(b, uint64(count))
		if _, err := w.Write(b); err != nil {
			return err
		}
		for _, x := range words {
			if _, err := w.Write(le.AppendUint64(nil, uint64(x))); err != nil {
				return err
			}
		}
		return nil
	}
	for _, t := range tables {
		p, wps := t.policy.Load(), 0
		var words []int64
		for i := range t.shards {
			sh := &t.shards[i]
			sh.mu.Lock()
			if i == 0 {
				p, wps = t.policy.Load(), sh.w
			}
			if sh.w == wps {
				for j := 0; j+sh.w <= len(sh.words); j += sh.w {
					if sh.words[j] != 0 {
						words = append(words, sh.words[j:j+sh.w]...)
					}
				}
			}
			sh.mu.Unlock()
		}
		if err := writeTable(p, wps, words, len(words)/max(wps, 1)); err != nil {
			return err
		}
	}
	return nil
}

// Snapshots taken while keys come and go (shards growing, keys deleted)
// restore: each shard is written under its lock, the counts filled in at
// the end.
func TestSnapshotWhileDeciding(t *testing.T) {
	const now = 1_000_000
	s, err := New(Options{SweepInterval: -1, Shards: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	p := floodgate.MustPolicy("p", floodgate.Rule{Name: "log", Algorithm: floodgate.SlidingLog, Limit: 20, Period: time.Hour})
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		ctx := context.Background()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			key := fmt.Sprint("k", i%3000)
			kind := floodgate.OpAllow
			if i%7 == 0 {
				kind = floodgate.OpReset
			}
			s.Do(ctx, now, floodgate.Op{Policy: p, Key: key, Cost: 1, Kind: kind})
		}
	}()
	dir := t.TempDir()
	for i := range 5 {
		path := filepath.Join(dir, fmt.Sprint(i, ".snap"))
		if err := s.Snapshot(path); err != nil {
			t.Fatal(err)
		}
		r, err := New(Options{SweepInterval: -1, Shards: 8, SnapshotPath: path, Clock: fixedClock(now)})
		if err != nil {
			t.Fatalf("snapshot %d: %v", i, err)
		}
		r.Close()
		time.Sleep(5 * time.Millisecond)
	}
	close(stop)
	<-done
}

package memstore

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/storekit"
)

var jt0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// journalPolicies are a daily quota, a token bucket and a sliding log
// (a wide state), the last two with a second rule.
func journalPolicies() []*floodgate.Policy {
	return []*floodgate.Policy{
		floodgate.MustPolicy("quota", floodgate.Rule{Name: "day", Algorithm: floodgate.FixedWindow, Limit: 1000, Calendar: floodgate.CalendarDay}),
		floodgate.MustPolicy("bucket", floodgate.Rule{Name: "b", Algorithm: floodgate.TokenBucket, Limit: 50, Period: time.Hour},
			floodgate.Rule{Name: "day", Algorithm: floodgate.FixedWindow, Limit: 500, Calendar: floodgate.CalendarDay}),
		floodgate.MustPolicy("log", floodgate.Rule{Name: "l", Algorithm: floodgate.SlidingLog, Limit: 40, Period: time.Hour}),
	}
}

// jopts are a store's options with a snapshot and a journal in dir, the
// journal written only when the test says (SyncJournal).
func jopts(dir string, clk floodgate.Clock, log *slog.Logger) Options {
	return Options{SnapshotPath: filepath.Join(dir, "s.snap"), JournalPath: filepath.Join(dir, "s.journal"),
		JournalSync: -1, JournalSyncRecords: 1 << 30, SweepInterval: -1, SnapshotInterval: time.Hour, Clock: clk, Logger: log}
}

func mustOpen(t *testing.T, opts Options) *Store {
	t.Helper()
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// crashImage copies dir's files as they are now, as a kill -9 would leave
// them (what the process has written is in the files), to a new directory.
func crashImage(t *testing.T, dir string) string {
	t.Helper()
	img := t.TempDir()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(img, e.Name()), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return img
}

func do(t *testing.T, s *Store, now int64, p *floodgate.Policy, kind floodgate.OpKind, key string, cost int64) floodgate.Decision {
	t.Helper()
	d, err := s.Do(context.Background(), now, floodgate.Op{Policy: p, Key: key, Kind: kind, Cost: cost})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// remaining is every key's remaining (a peek), by policy and key.
func remaining(t *testing.T, s *Store, ps []*floodgate.Policy, keys int, now int64) map[string]int64 {
	t.Helper()
	m := map[string]int64{}
	for _, p := range ps {
		for k := range keys {
			m[fmt.Sprint(p.Name(), "/k", k)] = do(t, s, now, p, floodgate.OpPeek, fmt.Sprint("k", k), 1).Remaining
		}
	}
	return m
}

func sameRemaining(t *testing.T, what string, got, want map[string]int64) {
	t.Helper()
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s: %s has %d remaining, want %d", what, k, got[k], w)
		}
	}
}

// spend makes key k of each policy consume k+1+i (i the policy's index).
func spend(t *testing.T, s *Store, ps []*floodgate.Policy, keys int, now int64) {
	for i, p := range ps {
		for k := range keys {
			for range k + 1 + i {
				do(t, s, now, p, floodgate.OpAllow, fmt.Sprint("k", k), 1)
			}
		}
	}
}

// A process killed after the journal was written restarts with every key
// as it was: the snapshot alone (none here, the crash came before the
// first) forgave everything. Resets and refunds are changes too. What was
// decided after the last write is lost: the documented bound.
func TestJournalReplaysAfterCrash(t *testing.T) {
	clk := clock.NewManual(jt0)
	now := clk.NowMicro()
	dir := t.TempDir()
	s := mustOpen(t, jopts(dir, clk, nil))
	ps := journalPolicies()
	spend(t, s, ps, 6, now)
	do(t, s, now, ps[0], floodgate.OpReset, "k5", 0)
	do(t, s, now, ps[1], floodgate.OpRefund, "k3", 2)
	if err := s.SyncJournal(); err != nil {
		t.Fatal(err)
	}
	want := remaining(t, s, ps, 6, now)
	img := crashImage(t, dir)
	do(t, s, now, ps[0], floodgate.OpAllow, "k0", 1) // after the last write: lost
	s.Close()
	if _, err := os.Stat(filepath.Join(img, "s.snap")); err == nil {
		t.Fatal("the crash image holds a snapshot; the test wants the journal alone")
	}

	s2 := mustOpen(t, jopts(img, clk, nil))
	defer s2.Close()
	got := remaining(t, s2, ps, 6, now)
	sameRemaining(t, "after the crash", got, want)
	if got["quota/k0"] != 999 || got["quota/k5"] != 1000 || got["log/k4"] != 40-7 {
		t.Errorf("quota/k0 %d (want 999), quota/k5 %d (reset: want 1000), log/k4 %d (want 33)", got["quota/k0"], got["quota/k5"], got["log/k4"])
	}
	// the restored keys are decided on as before
	if d := do(t, s2, now, ps[0], floodgate.OpAllow, "k3", 996); !d.Allowed || d.Remaining != 0 {
		t.Errorf("quota/k3 after 4 and 996 more: %+v", d)
	}
}

// A clean Close leaves the snapshot and an empty journal; a restart has
// every key.
func TestJournalCloseAndRestart(t *testing.T) {
	clk := clock.NewManual(jt0)
	now := clk.NowMicro()
	dir := t.TempDir()
	s := mustOpen(t, jopts(dir, clk, nil))
	ps := journalPolicies()
	spend(t, s, ps, 4, now)
	want := remaining(t, s, ps, 4, now)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	segs, _ := filepath.Glob(filepath.Join(dir, "s.journal.*"))
	if len(segs) != 1 {
		t.Fatalf("segments after Close: %v, want the one started by the last snapshot", segs)
	}
	if fi, _ := os.Stat(segs[0]); fi.Size() != int64(journalHeaderLen) {
		t.Errorf("the last segment holds %d bytes, want only its header", fi.Size())
	}
	s2 := mustOpen(t, jopts(dir, clk, nil))
	defer s2.Close()
	sameRemaining(t, "after a restart", remaining(t, s2, ps, 4, now), want)
}

// A snapshot starts a new segment before it is written and deletes the
// older ones after it is in place. A crash at any point of it restores
// every key exactly: after the new segment was started (old snapshot, old
// and new segments), after the rename (new snapshot, old and new
// segments), after the deletion.
func TestJournalSnapshotRotation(t *testing.T) {
	clk := clock.NewManual(jt0)
	now := clk.NowMicro()
	dir := t.TempDir()
	opts := jopts(dir, clk, nil)
	s := mustOpen(t, opts)
	defer s.Close()
	ps := journalPolicies()
	spend(t, s, ps, 4, now)
	if err := s.Snapshot(opts.SnapshotPath); err != nil { // S0
		t.Fatal(err)
	}
	spend(t, s, ps, 6, now) // in segment 2
	seq, err := s.jr.rotate()
	if err != nil {
		t.Fatal(err)
	}
	// between the rotation and the snapshot's rename, changes go to the
	// new segment, a reset among them
	spend(t, s, ps[:1], 8, now)
	do(t, s, now, ps[1], floodgate.OpReset, "k2", 0)
	if err := s.SyncJournal(); err != nil {
		t.Fatal(err)
	}
	images := map[string]string{"crash after the rotation": crashImage(t, dir)}
	if err := s.snapshot(opts.SnapshotPath); err != nil { // S1, before the deletion
		t.Fatal(err)
	}
	images["crash after the rename"] = crashImage(t, dir)
	want := remaining(t, s, ps, 8, now)
	for _, old := range []uint64{seq - 2, seq - 1} {
		os.Remove(s.jr.path(old))
	}
	images["crash after the deletion"] = crashImage(t, dir)
	for what, img := range images {
		s2 := mustOpen(t, jopts(img, clk, nil))
		sameRemaining(t, what, remaining(t, s2, ps, 8, now), want)
		s2.Close()
	}

	// the whole of it: only the new segment is left
	do(t, s, now, ps[2], floodgate.OpAllow, "k7", 1)
	if err := s.Snapshot(opts.SnapshotPath); err != nil {
		t.Fatal(err)
	}
	segs, _ := filepath.Glob(filepath.Join(dir, "s.journal.*"))
	if len(segs) != 1 || segs[0] != s.jr.path(seq+1) {
		t.Fatalf("segments after a snapshot: %v, want only %s", segs, s.jr.path(seq+1))
	}
}

// syncLog is a logger writing to a buffer, for tests to read.
type syncLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A segment cut anywhere in its last record (a crash in the middle of a
// write) replays every record before it and drops the torn one with a
// warning; damage in the middle stops the replay there (the records after
// it in that segment are dropped, with a warning saying so), and later
// segments are still replayed. Neither is an error, nor a panic.
func TestJournalTornTailAndDamage(t *testing.T) {
	clk := clock.NewManual(jt0)
	now := clk.NowMicro()
	dir := t.TempDir()
	s := mustOpen(t, jopts(dir, clk, nil))
	p := journalPolicies()[0]
	do(t, s, now, p, floodgate.OpAllow, "a", 1)
	s.SyncJournal()
	seg := s.jr.path(s.jr.seq)
	fi, _ := os.Stat(seg)
	first := fi.Size() // header, policy record, a's first record
	do(t, s, now, p, floodgate.OpAllow, "a", 10)
	s.SyncJournal()
	whole, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if len(whole) != int(first)+8+13+8*storekit.Width(p) {
		t.Fatalf("segment of %d bytes, want %d + one key record", len(whole), first)
	}
	check := func(what string, b []byte, wantRemaining int64, warn string) {
		t.Helper()
		img := t.TempDir()
		os.WriteFile(filepath.Join(img, filepath.Base(seg)), b, 0o600)
		var log syncLog
		s2, err := New(jopts(img, clk, slog.New(slog.NewTextHandler(&log, nil))))
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		defer s2.Close()
		if d := do(t, s2, now, p, floodgate.OpPeek, "a", 1); d.Remaining != wantRemaining {
			t.Errorf("%s: a has %d remaining, want %d", what, d.Remaining, wantRemaining)
		}
		if got := log.String(); warn == "" && strings.Contains(got, "level=WARN") || !strings.Contains(got, warn) {
			t.Errorf("%s: logged %q, want %q", what, got, warn)
		}
	}
	check("whole", whole, 989, "")
	for cut := int(first); cut < len(whole); cut++ {
		warn := "torn record"
		if cut == int(first) {
			warn = "" // cut between records: nothing torn
		}
		check(fmt.Sprintf("cut at %d of %d", cut, len(whole)), whole[:cut], 999, warn)
	}
	// a zeroed tail (a power loss after the file grew, before its data)
	zeroed := append(whole[:first:first], make([]byte, len(whole)-int(first))...)
	check("zeroed tail", zeroed, 999, "a record of 0 bytes")
	// a flipped bit in a's first record: the replay stops there
	bad := bytes.Clone(whole)
	bad[first-3] ^= 1
	check("damage in the middle", bad, 1000, "checksum does not match")
	// a header that is not a journal's
	check("not a journal", append([]byte("something else entirely, not a journal at all.."), whole[journalHeaderLen:]...), 1000, "not a floodgate journal")
}

// Damage in one segment leaves the later segments replayed.
func TestJournalDamageKeepsLaterSegments(t *testing.T) {
	clk := clock.NewManual(jt0)
	now := clk.NowMicro()
	dir := t.TempDir()
	s := mustOpen(t, jopts(dir, clk, nil))
	p := journalPolicies()[0]
	do(t, s, now, p, floodgate.OpAllow, "a", 5)
	do(t, s, now, p, floodgate.OpAllow, "b", 5)
	s.SyncJournal()
	old := s.jr.path(s.jr.seq)
	if _, err := s.jr.rotate(); err != nil {
		t.Fatal(err)
	}
	do(t, s, now, p, floodgate.OpAllow, "b", 7)
	s.SyncJournal()
	img := crashImage(t, dir)
	s.Close()
	b, _ := os.ReadFile(filepath.Join(img, filepath.Base(old)))
	b[len(b)-1] ^= 0xff // b's record in the old segment
	os.WriteFile(filepath.Join(img, filepath.Base(old)), b, 0o600)
	s2 := mustOpen(t, jopts(img, clk, slog.New(slog.NewTextHandler(&syncLog{}, nil))))
	defer s2.Close()
	if a, bb := do(t, s2, now, p, floodgate.OpPeek, "a", 1).Remaining, do(t, s2, now, p, floodgate.OpPeek, "b", 1).Remaining; a != 995 || bb != 988 {
		t.Errorf("a %d (want 995), b %d (want 988, from the later segment)", a, bb)
	}
}

// A segment written under another hash key than the snapshot's (a journal
// from another store) is refused with an error naming it; a journal
// without a snapshot is refused in New.
func TestJournalRefusesAnotherStoresSegments(t *testing.T) {
	clk := clock.NewManual(jt0)
	now := clk.NowMicro()
	a, b := t.TempDir(), t.TempDir()
	for _, dir := range []string{a, b} {
		s := mustOpen(t, jopts(dir, clk, nil))
		do(t, s, now, journalPolicies()[0], floodgate.OpAllow, "k", 1)
		s.Close()
	}
	segs, _ := filepath.Glob(filepath.Join(b, "s.journal.*"))
	data, _ := os.ReadFile(segs[0])
	os.WriteFile(filepath.Join(a, "s.journal.00000000000000ff"), data, 0o600)
	if _, err := New(jopts(a, clk, nil)); err == nil || !strings.Contains(err.Error(), "another hash key") || !strings.Contains(err.Error(), "s.journal.00000000000000ff") {
		t.Errorf("a segment of another store: %v, want an error naming it", err)
	}
	if _, err := New(Options{JournalPath: filepath.Join(a, "j")}); err == nil {
		t.Error("a journal without a snapshot: no error")
	}
}

// JournalSyncRecords records waiting make the flusher write and fsync
// them at once, with no tick.
func TestJournalSyncsAtRecords(t *testing.T) {
	clk := clock.NewManual(jt0)
	now := clk.NowMicro()
	dir := t.TempDir()
	opts := jopts(dir, clk, nil)
	opts.JournalSyncRecords = 3
	s := mustOpen(t, opts)
	defer s.Close()
	p := journalPolicies()[0]
	for range 3 {
		do(t, s, now, p, floodgate.OpAllow, "k", 1)
	}
	for deadline := time.Now().Add(30 * time.Second); s.JournalStats().Syncs == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("3 records waiting, JournalSyncRecords 3: no sync in 30 s")
		}
	}
	s2 := mustOpen(t, jopts(crashImage(t, dir), clk, nil))
	defer s2.Close()
	if d := do(t, s2, now, p, floodgate.OpPeek, "k", 1); d.Remaining != 997 {
		t.Errorf("after the sync at 3 records and a crash: %d remaining, want 997", d.Remaining)
	}
}

// Decisions, moves and groups on many goroutines while snapshots rotate
// the journal and the flusher syncs every millisecond: after the last
// sync, a crash image restores every key exactly; writing through, with no
// sync after the last decision.
func TestJournalConcurrentWithSnapshots(t *testing.T) {
	for _, through := range []bool{false, true} {
		t.Run(fmt.Sprint("write-through=", through), func(t *testing.T) { testJournalConcurrent(t, through) })
	}
}

func testJournalConcurrent(t *testing.T, through bool) {
	clk := clock.NewManual(jt0)
	now := clk.NowMicro()
	dir := t.TempDir()
	opts := jopts(dir, clk, nil)
	opts.JournalSync = time.Millisecond
	opts.JournalSyncRecords = 64
	opts.JournalWriteThrough = through
	if through {
		opts.JournalSync = -1 // no flusher: what is in the file was written through
		opts.JournalSyncRecords = 1 << 30
	}
	s := mustOpen(t, opts)
	defer s.Close()
	ps := journalPolicies()
	const keys = 40
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			for i := range 600 {
				p := ps[(g+i)%len(ps)]
				key := fmt.Sprint("k", (i*7+g)%keys)
				switch i % 10 {
				case 9:
					s.Do(ctx, now, floodgate.Op{Policy: p, Key: key, Kind: floodgate.OpRefund, Cost: 1})
				case 8:
					ops := []floodgate.Op{{Policy: ps[0], Key: key, Cost: 1}, {Policy: ps[1], Key: key, Cost: 1}}
					s.DoGroup(ctx, now, ops, []bool{true, true}, make([]floodgate.Decision, 2))
				default:
					s.Do(ctx, now, floodgate.Op{Policy: p, Key: key, Cost: 1})
				}
			}
		}()
	}
	done := make(chan struct{})
	snaps := make(chan int)
	go func() {
		n := 0
		for {
			select {
			case <-done:
				snaps <- n
				return
			default:
			}
			if err := s.Snapshot(opts.SnapshotPath); err != nil {
				t.Error(err)
			}
			n++
		}
	}()
	wg.Wait()
	close(done)
	t.Logf("%d snapshots during the decisions", <-snaps)
	if !through {
		if err := s.SyncJournal(); err != nil {
			t.Fatal(err)
		}
	}
	want := remaining(t, s, ps, keys, now)
	s2 := mustOpen(t, jopts(crashImage(t, dir), clk, nil))
	defer s2.Close()
	sameRemaining(t, "after the crash", remaining(t, s2, ps, keys, now), want)
}

// A key carried to another policy (Move) is journaled on both sides.
func TestJournalMove(t *testing.T) {
	clk := clock.NewManual(jt0)
	now := clk.NowMicro()
	dir := t.TempDir()
	s := mustOpen(t, jopts(dir, clk, nil))
	ps := journalPolicies()
	to := floodgate.MustPolicy("quota-gold", floodgate.Rule{Name: "day", Algorithm: floodgate.FixedWindow, Limit: 5000, Calendar: floodgate.CalendarDay})
	do(t, s, now, ps[0], floodgate.OpAllow, "k", 30)
	if err := s.Move(context.Background(), now, ps[0], to, "k"); err != nil {
		t.Fatal(err)
	}
	s.SyncJournal()
	img := crashImage(t, dir)
	s.Close()
	s2 := mustOpen(t, jopts(img, clk, nil))
	defer s2.Close()
	if from, got := do(t, s2, now, ps[0], floodgate.OpPeek, "k", 1).Remaining, do(t, s2, now, to, floodgate.OpPeek, "k", 1).Remaining; from != 1000 || got != 4970 {
		t.Errorf("after a move and a crash: %d left under the old policy (want 1000), %d under the new (want 4970)", from, got)
	}
}

// Writing through, a change is in the file when Do returns: a crash image
// taken then has it, with no sync; without, it waits for the next sync.
func TestJournalWriteThrough(t *testing.T) {
	clk := clock.NewManual(jt0)
	now := clk.NowMicro()
	p := journalPolicies()[0]
	for _, through := range []bool{false, true} {
		dir := t.TempDir()
		opts := jopts(dir, clk, nil)
		opts.JournalWriteThrough = through
		s := mustOpen(t, opts)
		do(t, s, now, p, floodgate.OpAllow, "k", 7)
		img := crashImage(t, dir)
		st := s.JournalStats()
		s.Close()
		s2 := mustOpen(t, jopts(img, clk, nil))
		want := int64(1000)
		if through {
			want = 993
		}
		if d := do(t, s2, now, p, floodgate.OpPeek, "k", 1); d.Remaining != want {
			t.Errorf("write-through %v: after a crash as Do returned, %d remaining, want %d", through, d.Remaining, want)
		}
		if through && (st.Writes != 1 || st.Syncs != 0) {
			t.Errorf("write-through: %+v, want 1 write and no fsync", st)
		}
		s2.Close()
	}
}

// Each tick of the flusher fsyncs what was written since the last fsync,
// by the flusher or, writing through, by the changes themselves: the
// power-loss bound. Writing through, the ticks found nothing left to write
// and asked for no fsync at all.
func TestJournalTickFsyncs(t *testing.T) {
	clk := clock.NewManual(jt0)
	now := clk.NowMicro()
	p := journalPolicies()[0]
	for _, through := range []bool{false, true} {
		t.Run(fmt.Sprint("write-through=", through), func(t *testing.T) {
			tick := make(chan time.Time)
			opts := jopts(t.TempDir(), clk, nil)
			opts.JournalWriteThrough = through
			opts.journalTick = tick
			s := mustOpen(t, opts)
			defer s.Close()
			for round := int64(1); round <= 3; round++ {
				do(t, s, now, p, floodgate.OpAllow, "k", 1)
				if st := s.JournalStats(); st.Syncs != round-1 {
					t.Fatalf("round %d, before the tick: %+v, want %d fsyncs", round, st, round-1)
				}
				tick <- jt0 // the flusher has it
				for deadline := time.Now().Add(30 * time.Second); s.JournalStats().Syncs < round; time.Sleep(time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatalf("round %d: a tick after a change, and no fsync in 30 s: %+v", round, s.JournalStats())
					}
				}
			}
			tick <- jt0 // nothing written since: no fsync
			tick <- jt0 // (the first tick is handled once the second is taken)
			if st := s.JournalStats(); st.Syncs != 3 {
				t.Errorf("ticks with nothing written: %+v, want still 3 fsyncs", st)
			}
		})
	}
}

// A crash after a snapshot's rename, before the older segments are
// deleted, leaves segments the snapshot already holds. Replayed over it,
// they brought back keys evicted since and converted tables through older
// layouts of a policy once more. The snapshot names the first segment it
// does not hold; the older ones are passed over, and the restore is exact.
func TestJournalStaleSegmentsAfterSnapshot(t *testing.T) {
	clk := clock.NewManual(jt0)
	now := clk.NowMicro()
	dir := t.TempDir()
	opts := jopts(dir, clk, nil)
	s := mustOpen(t, opts)
	defer s.Close()
	v1 := floodgate.MustPolicy("q", floodgate.Rule{Name: "day", Algorithm: floodgate.FixedWindow, Limit: 100, Calendar: floodgate.CalendarDay})
	do(t, s, now, v1, floodgate.OpAllow, "k", 50)
	v2 := floodgate.MustPolicy("q", floodgate.Rule{Name: "day", Algorithm: floodgate.FixedWindow, Limit: 1000, Calendar: floodgate.CalendarDay})
	do(t, s, now, v2, floodgate.OpAllow, "k", 500)
	old := s.jr.path(s.jr.seq)
	// a snapshot as Snapshot writes it, but for the deletion of the older segments
	seq, err := s.jr.rotate()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.snapshotFrom(opts.SnapshotPath, seq); err != nil {
		t.Fatal(err)
	}
	img := crashImage(t, dir)
	if segs, _ := filepath.Glob(filepath.Join(img, "s.journal.*")); len(segs) != 2 {
		t.Fatalf("segments in the crash image: %v, want the older one and the new", segs)
	}
	var log syncLog
	s2 := mustOpen(t, jopts(img, clk, slog.New(slog.NewTextHandler(&log, nil))))
	defer s2.Close()
	if d := do(t, s2, now, v2, floodgate.OpPeek, "k", 1); d.Remaining != 450 {
		t.Errorf("after a crash between the snapshot's rename and the older segments' deletion: %d remaining, want 450", d.Remaining)
	}
	stale := filepath.Join(img, filepath.Base(old))
	if got := log.String(); !strings.Contains(got, "passed over") || !strings.Contains(got, stale) || strings.Contains(got, "replayed path="+stale) {
		t.Errorf("the older segment %s: logged %q, want it passed over", stale, got)
	}
}

// A snapshot that names segment N and a journal with no segment from N on
// (moved, or deleted by hand): the new segment is numbered N or more, so
// the next restart replays it rather than passing it over.
func TestJournalNumbersOnFromTheSnapshot(t *testing.T) {
	clk := clock.NewManual(jt0)
	now := clk.NowMicro()
	dir := t.TempDir()
	p := journalPolicies()[0]
	s := mustOpen(t, jopts(dir, clk, nil))
	for range 3 {
		do(t, s, now, p, floodgate.OpAllow, "k", 1)
		if err := s.Snapshot(filepath.Join(dir, "s.snap")); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	segs, _ := filepath.Glob(filepath.Join(dir, "s.journal.*"))
	for _, f := range segs {
		os.Remove(f)
	}
	s2 := mustOpen(t, jopts(dir, clk, nil))
	do(t, s2, now, p, floodgate.OpAllow, "k", 10)
	s2.SyncJournal()
	img := crashImage(t, dir)
	s2.Close()
	s3 := mustOpen(t, jopts(img, clk, nil))
	defer s3.Close()
	if d := do(t, s3, now, p, floodgate.OpPeek, "k", 1); d.Remaining != 987 {
		t.Errorf("after the journal's segments were removed, a restart and a crash: %d remaining, want 987", d.Remaining)
	}
}

package memstore_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/memstore"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func newStore(t *testing.T, opts memstore.Options) *memstore.Store {
	t.Helper()
	if opts.SweepInterval == 0 {
		opts.SweepInterval = -1 // tests sweep by hand, at the manual clock's time
	}
	s, err := memstore.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func perMinute(name string, n int64) *floodgate.Policy {
	return floodgate.MustPolicy(name, floodgate.Rule{Name: "minute", Limit: n, Period: time.Minute})
}

func TestZeroAllocsOnExistingKey(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewManual(t0)
	for _, alg := range []floodgate.Algorithm{floodgate.TokenBucket, floodgate.GCRA, floodgate.LeakyBucket,
		floodgate.FixedWindow, floodgate.SlidingWindow, floodgate.SlidingLog, floodgate.SlidingSubwindow} {
		r := floodgate.Rule{Algorithm: alg, Limit: 100, Period: time.Minute}
		if alg == floodgate.SlidingSubwindow {
			r.Granularity = time.Second
		}
		l := floodgate.NewLimiter(floodgate.MustPolicy("z-"+string(alg), r), newStore(t, memstore.Options{}), floodgate.WithClock(clk))
		l.Allow(ctx, "user:1")
		allocs := testing.AllocsPerRun(1000, func() {
			l.Allow(ctx, "user:1")
			l.AllowN(ctx, "user:1", 0)
		})
		if allocs != 0 {
			t.Errorf("%s: %v allocations per decision on an existing key, want 0", alg, allocs)
		}
	}
}

// A flood of new keys at the cap must not evict a throttled key, nor any
// key that constrains: the flood's keys each consumed 1 of 10, so past the
// cap they find no room and are refused, decided by their rule's failure
// mode (open: admitted, Degraded).
func TestFloodDoesNotFreeThrottledKey(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewManual(t0)
	s := newStore(t, memstore.Options{MaxKeys: 256, Shards: 4, Logger: quiet})
	l := floodgate.NewLimiter(perMinute("flood", 10), s, floodgate.WithClock(clk))
	for range 10 {
		if d, _ := l.Allow(ctx, "victim"); !d.Allowed {
			t.Fatal("victim's first 10 requests must pass")
		}
	}
	degraded := 0
	for i := range 100_000 {
		d, _ := l.Allow(ctx, "attacker:"+strconv.Itoa(i))
		if !d.Allowed {
			t.Fatalf("fresh key %d denied", i)
		}
		if d.Degraded {
			degraded++
		}
		if i%1000 == 0 {
			clk.Advance(time.Millisecond)
		}
	}
	d, _ := l.Allow(ctx, "victim")
	if d.Allowed {
		t.Fatal("the flood of new keys freed the throttled key")
	}
	st := s.Stats()
	if st.Keys > 256+8*4 {
		t.Errorf("store holds %d keys, cap 256 (+8 per shard)", st.Keys)
	}
	if st.Evicted != 0 || st.Evictions != 0 || st.Refused < 99_000 || st.Refused != int64(degraded) {
		t.Errorf("%+v with %d degraded decisions; want no eviction, and every key past the cap refused and its decision degraded", st, degraded)
	}
}

func TestIdleKeysExpire(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewManual(t0)
	s := newStore(t, memstore.Options{})
	l := floodgate.NewLimiter(perMinute("idle", 5), s, floodgate.WithClock(clk))
	for i := range 1000 {
		l.Allow(ctx, "k"+strconv.Itoa(i))
	}
	if got := s.Stats().Keys; got != 1000 {
		t.Fatalf("keys = %d, want 1000", got)
	}
	// One token of a 5/minute bucket refills in 12 s.
	clk.Advance(12*time.Second - time.Microsecond)
	s.Sweep(clk.NowMicro())
	if got := s.Stats().Keys; got != 1000 {
		t.Fatalf("before 12s keys = %d, want all 1000 still constraining", got)
	}
	clk.Advance(time.Microsecond) // every bucket is full again
	s.Sweep(clk.NowMicro())
	if st := s.Stats(); st.Keys != 0 || st.Expired != 1000 {
		t.Fatalf("after 12s: %+v, want 0 keys and 1000 expired", st)
	}
}

func TestDeniedNewKeyAndResetLeaveNothing(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, memstore.Options{})
	l := floodgate.NewLimiter(perMinute("nothing", 5), s, floodgate.WithClock(clock.NewManual(t0)))
	if d, _ := l.AllowN(ctx, "big", 6); d.Allowed || d.Reason != floodgate.ReasonCostTooLarge {
		t.Fatalf("cost 6 on a limit of 5: %+v", d)
	}
	l.AllowN(ctx, "peek", 0)
	l.Refund(ctx, "refund", 1)
	l.Allow(ctx, "reset")
	l.Reset(ctx, "reset")
	if got := s.Stats().Keys; got != 0 {
		t.Fatalf("keys = %d, want 0", got)
	}
}

func TestSnapshotRestoresConsumption(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewManual(t0)
	path := filepath.Join(t.TempDir(), "state.snap")
	daily := floodgate.Rule{Name: "day", Algorithm: floodgate.FixedWindow, Limit: 3, Calendar: floodgate.CalendarDay}
	s1, err := memstore.New(memstore.Options{SnapshotPath: path, SweepInterval: -1, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	l1 := floodgate.NewLimiter(floodgate.MustPolicy("quota", daily), s1, floodgate.WithClock(clk))
	for range 3 {
		l1.Allow(ctx, "user:241531")
	}
	l1.Allow(ctx, "user:7")
	if err := s1.Close(); err != nil { // writes the snapshot
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("snapshot file: %v %v", fi, err)
	}

	clk.Advance(time.Hour) // a restart within the same day
	s2, err := memstore.New(memstore.Options{SnapshotPath: path, SweepInterval: -1, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	// A new process builds its policy anew, with the same name.
	l2 := floodgate.NewLimiter(floodgate.MustPolicy("quota", daily), s2, floodgate.WithClock(clk))
	if d, _ := l2.Allow(ctx, "user:241531"); d.Allowed {
		t.Fatal("restart handed out a fresh daily quota")
	}
	if d, _ := l2.Allow(ctx, "user:7"); !d.Allowed || d.Remaining != 1 {
		t.Fatalf("user:7 after restart: %+v, want admitted with 1 remaining", d)
	}
	clk.Advance(24 * time.Hour)
	if d, _ := l2.Allow(ctx, "user:241531"); !d.Allowed {
		t.Fatal("next day must admit again")
	}
}

func TestSnapshotAdoptedByChangedPolicy(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewManual(t0)
	path := filepath.Join(t.TempDir(), "state.snap")
	s1 := newStore(t, memstore.Options{SnapshotPath: path, Clock: clk})
	l1 := floodgate.NewLimiter(perMinute("p", 10), s1, floodgate.WithClock(clk))
	for range 8 {
		l1.Allow(ctx, "k")
	}
	if err := s1.Snapshot(path); err != nil {
		t.Fatal(err)
	}
	s2 := newStore(t, memstore.Options{SnapshotPath: path, Clock: clk})
	// The limit was lowered to 5 while the process was down: 8 consumed,
	// clamped to the new limit, leaves nothing.
	l2 := floodgate.NewLimiter(perMinute("p", 5), s2, floodgate.WithClock(clk))
	if d, _ := l2.Allow(ctx, "k"); d.Allowed {
		t.Fatalf("consumption was lost in the conversion: %+v", d)
	}
}

func TestCorruptSnapshotIsAnError(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bad.snap")
	os.WriteFile(path, []byte("not a snapshot at all, just some bytes"), 0o600)
	if _, err := memstore.New(memstore.Options{SnapshotPath: path}); err == nil {
		t.Fatal("want an error for a corrupt snapshot")
	}
	os.WriteFile(path, nil, 0o600)
	if _, err := memstore.New(memstore.Options{SnapshotPath: path}); err == nil {
		t.Fatal("want an error for an empty snapshot")
	}
}

// SetLimit with a million keys converts every key in place.
func TestSetLimitKeepsConsumptionAcrossGrowth(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewManual(t0)
	s := newStore(t, memstore.Options{})
	l := floodgate.NewLimiter(floodgate.MustPolicy("grow", floodgate.Rule{Name: "log", Algorithm: floodgate.SlidingLog, Limit: 4, Period: time.Minute}), s, floodgate.WithClock(clk))
	for i := range 2000 {
		for range 3 {
			l.Allow(ctx, "k"+strconv.Itoa(i))
		}
	}
	if err := l.SetLimit("log", 6); err != nil { // the log's width changes
		t.Fatal(err)
	}
	for i := range 2000 {
		d, _ := l.Allow(ctx, "k"+strconv.Itoa(i))
		if !d.Allowed || d.Remaining != 2 {
			t.Fatalf("key %d after raising the limit to 6: %+v, want admitted with 2 remaining", i, d)
		}
	}
	if err := l.SetLimit("log", 2); err != nil {
		t.Fatal(err)
	}
	if d, _ := l.Allow(ctx, "k0"); d.Allowed {
		t.Fatal("lowering the limit below consumption must deny")
	}
	if err := l.SetLimit("nope", 2); err == nil {
		t.Fatal("unknown rule name must be an error")
	}
}

// Parallel callers on distinct keys and on one key: exact totals.
func TestConcurrentKeys(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewManual(t0)
	s := newStore(t, memstore.Options{})
	l := floodgate.NewLimiter(perMinute("conc", 50), s, floodgate.WithClock(clk))
	var wg sync.WaitGroup
	admitted := make([]int, 8)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 400 {
				if d, _ := l.Allow(ctx, "k"+strconv.Itoa(i%20)); d.Allowed {
					admitted[g]++
				}
			}
		}()
	}
	wg.Wait()
	total := 0
	for _, a := range admitted {
		total += a
	}
	if total != 20*50 {
		t.Fatalf("admitted %d, want exactly 20 keys × 50", total)
	}
}

// Wide states hit the memory cap long before the key cap: the tables stop
// growing, and new keys are refused where every key still constrains.
func TestMemoryCapBoundsWideStates(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewManual(t0)
	const budget = 4 << 20
	s := newStore(t, memstore.Options{MaxMemory: budget, Shards: 8, Logger: quiet})
	log := floodgate.MustPolicy("wide", floodgate.Rule{Algorithm: floodgate.SlidingLog, Limit: 1000, Period: time.Hour})
	l := floodgate.NewLimiter(log, s, floodgate.WithClock(clk))
	for range 1000 {
		l.Allow(ctx, "victim")
	}
	for i := range 20_000 {
		l.Allow(ctx, "k"+strconv.Itoa(i))
	}
	st := s.Stats()
	// One growth step past the cap can be in flight per shard.
	if st.Bytes > 2*budget {
		t.Fatalf("tables hold %d bytes with a cap of %d", st.Bytes, budget)
	}
	if st.Refused == 0 || st.Evicted != 0 {
		t.Fatalf("%+v: want new keys refused at the memory cap, and no key that constrains evicted", st)
	}
	if d, _ := l.Allow(ctx, "victim"); d.Allowed {
		t.Fatal("the memory cap freed the throttled key")
	}
}

// A policy seen for the first time costs the same whatever the number of
// policies before it: the store copied a map of every policy at each new
// one, so loading a rules file of 20,000 descriptors took seconds (1 ms a
// new policy at 20,000) and every reload took them again.
func TestNewPolicyCostIsFlat(t *testing.T) {
	s := memstore.MustNew(memstore.Options{})
	defer s.Close()
	ctx := context.Background()
	decide := func(i int) {
		p := floodgate.MustPolicy(fmt.Sprint("p", i), floodgate.Rule{Name: "r", Algorithm: floodgate.FixedWindow, Limit: 5, Period: time.Minute})
		if _, err := s.Do(ctx, 1_000_000, floodgate.Op{Policy: p, Key: "k", Cost: 1}); err != nil {
			t.Fatal(err)
		}
	}
	perPolicy := func(from, n int) uint64 {
		var a, b runtime.MemStats
		runtime.ReadMemStats(&a)
		for i := from; i < from+n; i++ {
			decide(i)
		}
		runtime.ReadMemStats(&b)
		return (b.TotalAlloc - a.TotalAlloc) / uint64(n)
	}
	first := perPolicy(0, 50)
	for i := 50; i < 8000; i++ {
		decide(i)
	}
	later := perPolicy(8000, 50)
	t.Logf("bytes allocated per new policy: %d among the first 50, %d after 8,000", first, later)
	if later > 2*first {
		t.Fatalf("a new policy allocates %d bytes after 8,000 policies, %d among the first: the cost grows with the count", later, first)
	}
}

// The memory cap holds with policies of wide state: sliding logs of 10,000
// keep 80 KB a key, and 40 of them flooded with distinct keys took 3 GB
// past a 1 GiB cap (every shard of few keys grew, 64 shards a policy).
func TestMemoryCapWithWideStates(t *testing.T) {
	const capBytes = 64 << 20
	s := memstore.MustNew(memstore.Options{MaxMemory: capBytes, Logger: quiet})
	defer s.Close()
	ctx := context.Background()
	for i := range 40 {
		p := floodgate.MustPolicy(fmt.Sprint("log", i), floodgate.Rule{Name: "r", Algorithm: floodgate.SlidingLog, Limit: 10000, Period: time.Hour})
		for k := range 200 {
			if _, err := s.Do(ctx, 1_000_000, floodgate.Op{Policy: p, Key: fmt.Sprint("k", k), Cost: 1}); err != nil {
				t.Fatal(err)
			}
		}
	}
	st := s.Stats()
	t.Logf("%d keys, %d MB, %d refused", st.Keys, st.Bytes>>20, st.Refused)
	// the cap, and each table's first allocation (which a key must have)
	if st.Bytes > capBytes+40<<20 {
		t.Fatalf("%d MB held under a cap of %d MB", st.Bytes>>20, capBytes>>20)
	}
	if st.Refused == 0 || st.Evicted != 0 {
		t.Fatalf("%+v: the flood did not reach the cap, or evicted a key that constrains", st)
	}
}

// A snapshot's tables are filled when the store opens, and the live policy
// takes its table over even when it was made before the store (serve loads
// its rules first, so the live policy is older than the snapshot's copy):
// the changed limit applies to the restored consumption.
func TestSnapshotTakenOverByOlderPolicyObject(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewManual(t0)
	path := filepath.Join(t.TempDir(), "state.snap")
	s1 := newStore(t, memstore.Options{SnapshotPath: path, Clock: clk})
	l1 := floodgate.NewLimiter(perMinute("p", 100), s1, floodgate.WithClock(clk))
	for range 60 {
		l1.Allow(ctx, "k")
	}
	if err := s1.Snapshot(path); err != nil {
		t.Fatal(err)
	}
	live := perMinute("p", 200) // made before the store that restores
	s2 := newStore(t, memstore.Options{SnapshotPath: path, Clock: clk})
	if st := s2.Stats(); st.Keys != 1 {
		t.Fatalf("restored store holds %d keys before any decision, want 1", st.Keys)
	}
	d, _ := floodgate.NewLimiter(live, s2, floodgate.WithClock(clk)).Allow(ctx, "k")
	if !d.Allowed || d.Limit != 200 || d.Remaining != 139 {
		t.Fatalf("%+v, want the 200 limit with 60 restored and 1 more consumed (139 left)", d)
	}
}

// A table restored from a snapshot whose policy no longer exists goes once
// its keys have expired: it was written into every later snapshot for good.
func TestRestoredTableOfAGonePolicyIsDropped(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewManual(t0)
	path := filepath.Join(t.TempDir(), "state.snap")
	s1 := newStore(t, memstore.Options{SnapshotPath: path, Clock: clk})
	floodgate.NewLimiter(perMinute("gone", 10), s1, floodgate.WithClock(clk)).Allow(ctx, "k")
	floodgate.NewLimiter(perMinute("kept", 10), s1, floodgate.WithClock(clk)).Allow(ctx, "k")
	if err := s1.Snapshot(path); err != nil {
		t.Fatal(err)
	}
	s2 := newStore(t, memstore.Options{SnapshotPath: path, Clock: clk})
	kept := floodgate.NewLimiter(perMinute("kept", 10), s2, floodgate.WithClock(clk))
	kept.Allow(ctx, "k")
	clk.Advance(2 * time.Minute)
	s2.Sweep(clk.NowMicro())
	kept.Allow(ctx, "k2") // the live policy's table stays, and holds its key
	path2 := filepath.Join(t.TempDir(), "again.snap")
	if err := s2.Snapshot(path2); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path2)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(data), `"gone"`) || !strings.Contains(string(data), `"kept"`) {
		t.Fatalf("the snapshot after the sweep: gone's table %v, kept's %v; want kept's alone",
			strings.Contains(string(data), `"gone"`), strings.Contains(string(data), `"kept"`))
	}
}

// An empty table goes at the sweep, whatever its policy: a service with
// per-key overrides makes a policy for every set of numbers it meets, and
// each kept a table (about 9 KB) for good: 20,000 of them held 180 MB.
func TestEmptyTablesAreDropped(t *testing.T) {
	s := newStore(t, memstore.Options{SweepInterval: -1})
	ctx := context.Background()
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	now := t0.UnixMicro()
	for i := range 20000 {
		p := floodgate.MustPolicy(fmt.Sprint("override|", i), floodgate.Rule{Name: "r", Algorithm: floodgate.FixedWindow, Limit: int64(i + 1), Period: time.Minute})
		if _, err := s.Do(ctx, now, floodgate.Op{Policy: p, Key: "user:" + strconv.Itoa(i), Cost: 1}); err != nil {
			t.Fatal(err)
		}
	}
	s.Sweep(now + 2*time.Minute.Microseconds())
	after := heap()
	t.Logf("heap %d MB before, %d MB after 20,000 policies and a sweep", before>>20, after>>20)
	if after > before+20<<20 {
		t.Fatalf("heap grew from %d to %d MB: the policies' empty tables were kept", before>>20, after>>20)
	}
	if st := s.Stats(); st.Keys != 0 || st.Bytes != 0 {
		t.Fatalf("stats after the sweep: %+v, want no keys and no bytes", st)
	}
}

// A policy still in use whose table was dropped while empty binds again,
// and keeps what it counts from then on, even when a sweep drops the table
// while callers are deciding: none of their keys goes into a dropped table.
func TestDroppedTableRebinds(t *testing.T) {
	s := newStore(t, memstore.Options{SweepInterval: -1})
	ctx := context.Background()
	p := floodgate.MustPolicy("p", floodgate.Rule{Name: "r", Algorithm: floodgate.FixedWindow, Limit: 1, Period: time.Minute})
	other := floodgate.MustPolicy("other", floodgate.Rule{Name: "r", Algorithm: floodgate.FixedWindow, Limit: 1, Period: time.Minute})
	for round := range 40 {
		now := t0.Add(time.Duration(round) * 2 * time.Minute).UnixMicro()
		s.Sweep(now) // the last round's keys are fresh: the tables go
		stop := make(chan struct{})
		var sweeps sync.WaitGroup
		sweeps.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
					s.Sweep(now)
				}
			}
		})
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Go(func() {
				for i := range 25 {
					key := fmt.Sprintf("r%d-w%d-%d", round, w, i)
					ops := []floodgate.Op{{Policy: p, Key: key, Cost: 1}, {Policy: other, Key: key, Cost: 1}}
					out := make([]floodgate.Decision, 2)
					var err error
					if (i+w)%2 == 1 { // each path meets the dropped tables first in some worker
						_, err = floodgate.DoGroup(ctx, s, now, ops, []bool{true, true}, out)
					} else {
						err = s.DoBatch(ctx, now, ops, out)
					}
					if err != nil || !out[0].Allowed || !out[1].Allowed {
						t.Errorf("%s: first request %v %v", key, out, err)
						return
					}
					if d, _ := s.Do(ctx, now, floodgate.Op{Policy: p, Key: key, Cost: 1}); d.Allowed {
						t.Errorf("%s: a second request admitted: its first went to a dropped table", key)
						return
					}
				}
			})
		}
		wg.Wait()
		close(stop)
		sweeps.Wait()
		if t.Failed() {
			return
		}
	}
	// Once idle the tables go, every key with them (a key in a dropped
	// table would be out of the sweep's reach); a later decision binds
	// again and counts.
	end := t0.Add(2 * time.Hour).UnixMicro()
	s.Sweep(end)
	if k := s.Stats().Keys; k != 0 {
		t.Fatalf("%d keys left after the last sweep: they went into dropped tables", k)
	}
	if d, _ := s.Do(ctx, end, floodgate.Op{Policy: p, Key: "k", Cost: 1}); !d.Allowed {
		t.Fatal("the first request after the drop was refused")
	}
	if d, _ := s.Do(ctx, end, floodgate.Op{Policy: p, Key: "k", Cost: 1}); d.Allowed || s.Stats().Keys != 1 {
		t.Fatalf("after the drop: a second request admitted (%v) or keys %d, want 1", d.Allowed, s.Stats().Keys)
	}
	// A move into a policy whose table was dropped binds it again too.
	if err := s.Move(ctx, end, p, other, "k"); err != nil {
		t.Fatal(err)
	}
	if d, _ := s.Do(ctx, end, floodgate.Op{Policy: other, Key: "k", Cost: 1}); d.Allowed {
		t.Fatal("the moved key admitted again under the other policy: the move went into its dropped table")
	}
}

package memstore_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/memstore"
)

// daily is a quota of 1000 a day that one request can spend whole (Envoy's
// hits_addend, AllowN).
func daily(name string, mode floodgate.FailureMode) *floodgate.Policy {
	return floodgate.MustPolicy(name, floodgate.Rule{Name: "day", Algorithm: floodgate.FixedWindow, Limit: 1000, Period: 24 * time.Hour, OnStoreFailure: mode})
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// The attack (#17, item 2): five keys spend a 1000/day quota,
// then 40,000 new keys each spend theirs whole. At the cap every sampled
// key is as consumed as the spent ones, and the store evicted one of them
// anyway: the five came back with 1000 remaining. A key that constrains
// is never reset by memory pressure, at either cap: the new keys that find
// no room are refused, decided by the rule's failure mode (open here:
// admitted, and marked Degraded), and counted.
func TestSpentKeysSurviveFloodOfSpentKeys(t *testing.T) {
	for name, opts := range map[string]memstore.Options{
		"MaxKeys":   {MaxKeys: 256, Shards: 4, Logger: quiet},
		"MaxMemory": {MaxMemory: 64 << 10, Logger: quiet},
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			clk := clock.NewManual(t0)
			s := newStore(t, opts)
			l := floodgate.NewLimiter(daily("quota", ""), s, floodgate.WithClock(clk))
			for v := range 5 {
				if d, err := l.AllowN(ctx, "victim:"+strconv.Itoa(v), 1000); err != nil || !d.Allowed || d.Remaining != 0 {
					t.Fatalf("victim %d spends its quota: %+v, %v", v, d, err)
				}
			}
			degraded := 0
			for i := range 40_000 {
				d, err := l.AllowN(ctx, "flood:"+strconv.Itoa(i), 1000)
				if err != nil || !d.Allowed {
					t.Fatalf("flood key %d: %+v, %v; want admitted (by the store, or failing open)", i, d, err)
				}
				if d.Degraded {
					degraded++
				}
				if i%1000 == 0 {
					clk.Advance(time.Second)
				}
			}
			for v := range 5 {
				d, err := l.PeekN(ctx, "victim:"+strconv.Itoa(v), 1)
				if err != nil || d.Allowed || d.Remaining != 0 {
					t.Errorf("victim %d after the flood: %+v, %v; want still spent (0 remaining)", v, d, err)
				}
			}
			st := s.Stats()
			t.Logf("%+v", st)
			if st.Evicted != 0 || st.Refused == 0 || st.Refused != int64(degraded) || st.Keys+st.Refused != 40_005 {
				t.Errorf("%+v, %d degraded: want no key that constrains evicted, and every flood key either held or refused (degraded)", st, degraded)
			}
		})
	}
}

// A key refused for want of room is decided by its rules' failure modes,
// as by a store that cannot answer: a rule failing closed denies it (the
// first such rule decides), open and local admit it; either way the
// decision is Degraded. A request whose cost no rule could ever admit
// needs no room: it is limited, not refused; nor do a check or a refund.
func TestRefusedKeyFollowsFailureMode(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewManual(t0)
	hour := floodgate.Rule{Name: "hour", Limit: 100, Period: time.Hour}
	closed := hour
	closed.OnStoreFailure = floodgate.FailClosed
	local := hour
	local.OnStoreFailure, local.LocalPercent = floodgate.FailLocal, 50
	for _, c := range []struct {
		name    string
		rules   []floodgate.Rule
		allowed bool
		rule    string
	}{
		{"open", []floodgate.Rule{hour}, true, "hour"},
		{"closed", []floodgate.Rule{hour, {Name: "day", Limit: 1000, Period: 24 * time.Hour, OnStoreFailure: floodgate.FailClosed}}, false, "day"},
		{"closed-first", []floodgate.Rule{closed}, false, "hour"},
		{"local", []floodgate.Rule{local}, true, "hour"},
	} {
		s := newStore(t, memstore.Options{MaxKeys: 16, Shards: 1, Logger: quiet})
		l := floodgate.NewLimiter(floodgate.MustPolicy("mode-"+c.name, c.rules...), s, floodgate.WithClock(clk))
		for i := range 16 {
			if d, _ := l.AllowN(ctx, "k"+strconv.Itoa(i), 100); !d.Allowed || d.Degraded {
				t.Fatalf("%s: filling the store: %+v", c.name, d)
			}
		}
		d, err := l.Allow(ctx, "new")
		if err != nil || !d.Degraded || d.Allowed != c.allowed || d.Rule != c.rule {
			t.Errorf("%s: %+v, %v; want degraded, allowed %v, by rule %s", c.name, d, err, c.allowed, c.rule)
		}
		if !c.allowed && (d.Reason != floodgate.ReasonStoreUnavailable || d.RetryAfter <= 0) {
			t.Errorf("%s: %+v; want refused as the store unavailable, with a retry-after", c.name, d)
		}
		// too large for the rule: limited, whether or not there is room
		if d, _ := l.AllowN(ctx, "new", 1_000_000); d.Allowed || d.Degraded || d.Reason != floodgate.ReasonCostTooLarge {
			t.Errorf("%s, a cost too large: %+v; want limited, not refused", c.name, d)
		}
		// a check and a refund need no room
		if d, _ := l.PeekN(ctx, "new", 1); !d.Allowed || d.Degraded || d.Remaining != 100 {
			t.Errorf("%s, a peek: %+v", c.name, d)
		}
		if d, _ := l.Refund(ctx, "new", 1); d.Degraded {
			t.Errorf("%s, a refund: %+v", c.name, d)
		}
		if st := s.Stats(); st.Keys != 16 || st.Refused != 1 || st.Evicted != 0 || st.Evictions != 0 {
			t.Errorf("%s: %+v: want the 16 spent keys held, none evicted, 1 refusal", c.name, st)
		}
	}
}

// Room is made from keys that no longer constrain: once the flood's and
// the victims' windows are over, new keys are held again (not degraded),
// each taking the room of a key that decayed, found by sampling or by
// sweeping the shard. A key that decayed while others in its shard still
// constrain is found even where a sample of 8 misses it.
func TestDecayedKeysMakeRoom(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewManual(t0)
	s := newStore(t, memstore.Options{MaxKeys: 256, Shards: 1, Logger: quiet})
	// a bucket of 1000 a day: a request of 1 frees in 86.4 s, of 1000 in a day
	l := floodgate.NewLimiter(floodgate.MustPolicy("bucket", floodgate.Rule{Name: "day", Limit: 1000, Period: 24 * time.Hour}), s, floodgate.WithClock(clk))
	l.AllowN(ctx, "light", 1)
	for i := range 255 {
		l.AllowN(ctx, "spent:"+strconv.Itoa(i), 1000)
	}
	if d, _ := l.AllowN(ctx, "new:0", 1); !d.Degraded {
		t.Fatalf("a new key at the cap, every key constraining: %+v; want refused", d)
	}
	clk.Advance(100 * time.Second) // "light" is fresh again, the rest still spent
	if d, _ := l.AllowN(ctx, "new:1", 1000); !d.Allowed || d.Degraded {
		t.Fatalf("a new key where one key has decayed: %+v; want held", d)
	}
	if d, _ := l.AllowN(ctx, "new:2", 1); !d.Degraded {
		t.Fatalf("a new key once the decayed key's room is taken: %+v; want refused", d)
	}
	for i := range 255 { // 100 s of a 1000/day bucket: 1 request back
		if d, _ := l.PeekN(ctx, "spent:"+strconv.Itoa(i), 1); d.Remaining > 1 {
			t.Fatalf("spent key %d was dropped for room: %+v", i, d)
		}
	}
	clk.Advance(24 * time.Hour) // everything is fresh: room for a whole cap of new keys
	for i := range 256 {
		if d, _ := l.AllowN(ctx, "later:"+strconv.Itoa(i), 1); !d.Allowed || d.Degraded {
			t.Fatalf("new key %d once every key decayed: %+v; want held", i, d)
		}
	}
	st := s.Stats()
	if st.Evicted != 0 || st.Evictions+st.Expired < 256 || st.Refused != 2 {
		t.Errorf("%+v: want room made by dropping only decayed keys, and 2 refusals", st)
	}
}

// The invariant, checked against a store with no cap: every decision the
// capped store makes itself (not Degraded) is the one the uncapped store
// makes after the same history of decided operations. A dropped key that
// constrained would show up as a decision that differs. Random keys,
// costs, algorithms and time.
func TestCappedStoreDecidesAsUncapped(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(17, 2))
	policies := []*floodgate.Policy{
		floodgate.MustPolicy("tb", floodgate.Rule{Name: "r", Limit: 50, Period: time.Minute}),
		floodgate.MustPolicy("fw", floodgate.Rule{Name: "r", Algorithm: floodgate.FixedWindow, Limit: 20, Period: 10 * time.Second}),
		floodgate.MustPolicy("sw", floodgate.Rule{Name: "r", Algorithm: floodgate.SlidingWindow, Limit: 30, Period: 30 * time.Second}),
		floodgate.MustPolicy("log", floodgate.Rule{Name: "r", Algorithm: floodgate.SlidingLog, Limit: 8, Period: 5 * time.Second}),
		floodgate.MustPolicy("two", floodgate.Rule{Name: "s", Limit: 5, Period: time.Second}, floodgate.Rule{Name: "h", Algorithm: floodgate.FixedWindow, Limit: 100, Period: time.Hour}),
	}
	capped := newStore(t, memstore.Options{MaxKeys: 200, Shards: 4, Logger: quiet})
	ref := newStore(t, memstore.Options{})
	now := t0.UnixMicro()
	refused, compared := 0, 0
	for n := range 200_000 {
		p := policies[rng.IntN(len(policies))]
		op := floodgate.Op{Policy: p, Key: "k" + strconv.Itoa(rng.IntN(2000)), Kind: floodgate.OpAllow, Cost: 1 + rng.Int64N(4)}
		switch r := rng.IntN(20); {
		case r == 0:
			op.Kind, op.Cost = floodgate.OpPeek, 1
		case r == 1:
			op.Kind = floodgate.OpRefund
		case r == 2:
			op.Cost = 1 + rng.Int64N(60) // some too large, some spending a key whole
		}
		got, err := capped.Do(ctx, now, op)
		if err != nil {
			t.Fatal(err)
		}
		if got.Degraded {
			refused++
			continue
		}
		want, _ := ref.Do(ctx, now, op)
		compared++
		if got.Allowed != want.Allowed || got.Remaining != want.Remaining || got.Reason != want.Reason {
			t.Fatalf("op %d (%s %s cost %d, %s): capped store %+v, uncapped %+v", n, p.Name(), op.Key, op.Cost, op.Kind, got, want)
		}
		now += rng.Int64N(2000) // 1 ms on average: windows roll, buckets drain
	}
	st := capped.Stats()
	t.Logf("%d decisions compared, %d refused; %+v", compared, refused, st)
	if refused == 0 || st.Evictions+st.Expired == 0 || st.Evicted != 0 {
		t.Fatalf("%+v: the test must reach the cap, refuse, and make room", st)
	}
}

// Inserts at the cap from many goroutines at once: spent keys stay spent,
// the cap holds (plus 8 keys a shard), nothing that constrains is evicted,
// and every flood key is either held or refused. Run with -race.
func TestConcurrentInsertsAtCap(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewManual(t0)
	const maxKeys, shards, workers, each = 512, 8, 8, 5000
	s := newStore(t, memstore.Options{MaxKeys: maxKeys, Shards: shards, Logger: quiet})
	quota := daily("quota", "")
	bucket := floodgate.MustPolicy("bucket", floodgate.Rule{Name: "s", Limit: 1000, Period: time.Second})
	l := floodgate.NewLimiter(quota, s, floodgate.WithClock(clk))
	for v := range 20 {
		l.AllowN(ctx, "victim:"+strconv.Itoa(v), 1000)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	held, refused := 0, 0
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h, r := 0, 0
			for i := range each {
				key := "flood:" + strconv.Itoa(w) + ":" + strconv.Itoa(i)
				var d floodgate.Decision
				switch i % 4 {
				case 0: // a bucket that frees fast: room for others once it decays
					d, _ = s.Do(ctx, clk.NowMicro(), floodgate.Op{Policy: bucket, Key: key, Kind: floodgate.OpAllow, Cost: 1})
				case 1: // a group of two new keys
					ops := []floodgate.Op{{Policy: quota, Key: key, Kind: floodgate.OpAllow, Cost: 1000}, {Policy: quota, Key: key + "+", Kind: floodgate.OpAllow, Cost: 1000}}
					out := make([]floodgate.Decision, 2)
					if err := s.DoGroup(ctx, clk.NowMicro(), ops, []bool{true, true}, out); err != nil {
						t.Error(err)
						return
					}
					for _, d := range out {
						if d.Degraded {
							r++
						} else {
							h++
						}
					}
					continue
				default:
					d, _ = l.AllowN(ctx, key, 1000)
				}
				if d.Degraded {
					r++
				} else {
					h++
				}
				if w == 0 && i%500 == 0 {
					clk.Advance(10 * time.Millisecond)
				}
			}
			mu.Lock()
			held, refused = held+h, refused+r
			mu.Unlock()
		}()
	}
	wg.Add(1)
	go func() { // victims checked while the flood runs
		defer wg.Done()
		for range 200 {
			for v := range 20 {
				if d, _ := l.PeekN(ctx, "victim:"+strconv.Itoa(v), 1); d.Allowed {
					t.Errorf("victim %d freed during the flood: %+v", v, d)
					return
				}
			}
		}
	}()
	wg.Wait()
	for v := range 20 {
		if d, _ := l.PeekN(ctx, "victim:"+strconv.Itoa(v), 1); d.Allowed {
			t.Errorf("victim %d freed by the flood: %+v", v, d)
		}
	}
	st := s.Stats()
	t.Logf("%+v; %d held, %d refused", st, held, refused)
	if st.Evicted != 0 || st.Keys > maxKeys+8*shards*2 || int64(refused) != st.Refused || refused == 0 || held+refused != workers*each*5/4 {
		t.Errorf("%+v; %d held, %d refused: want the cap kept, no key that constrains evicted, and each flood key held or refused", st, held, refused)
	}
}

// An all-or-nothing group at the cap: a member the store has no room for,
// refused by a rule failing closed, refuses the group, and the members
// decided before it (placed, then dropped again) consume nothing; one
// failing open is admitted uncounted beside the others.
func TestGroupAtCap(t *testing.T) {
	ctx := context.Background()
	now := t0.UnixMicro()
	for _, mode := range []floodgate.FailureMode{floodgate.FailClosed, floodgate.FailOpen} {
		s := newStore(t, memstore.Options{MaxKeys: 16, Shards: 1, Logger: quiet})
		p := daily("group", mode)
		for i := range 15 {
			s.Do(ctx, now, floodgate.Op{Policy: p, Key: "spent" + strconv.Itoa(i), Kind: floodgate.OpAllow, Cost: 1000})
		}
		// room for one key: a takes it, b is refused
		ops := []floodgate.Op{
			{Policy: p, Key: "a", Kind: floodgate.OpAllow, Cost: 10},
			{Policy: p, Key: "b", Kind: floodgate.OpAllow, Cost: 10},
			{Policy: p, Key: "spent0", Kind: floodgate.OpPeek, Cost: 0},
		}
		out := make([]floodgate.Decision, 3)
		if err := s.DoGroup(ctx, now, ops, []bool{true, true, true}, out); err != nil {
			t.Fatal(err)
		}
		a, _ := s.Do(ctx, now, floodgate.Op{Policy: p, Key: "a", Kind: floodgate.OpPeek, Cost: 1})
		st := s.Stats()
		switch mode {
		case floodgate.FailClosed:
			if out[1].Allowed || !out[1].Degraded || out[1].Reason != floodgate.ReasonStoreUnavailable {
				t.Fatalf("closed: b %+v; want refused", out[1])
			}
			if !out[0].Allowed || out[0].Degraded || out[0].Remaining != 1000 {
				t.Fatalf("closed: a %+v; want its check (it would fit, nothing taken)", out[0])
			}
			if a.Remaining != 1000 || st.Keys != 15 {
				t.Fatalf("closed: a %+v, %+v; want a not consumed, and not held", a, st)
			}
		default:
			if !out[0].Allowed || out[0].Degraded || out[0].Remaining != 990 || !out[1].Allowed || !out[1].Degraded {
				t.Fatalf("open: %+v; want a admitted and counted, b admitted failing open", out)
			}
			if a.Remaining != 990 || st.Keys != 16 {
				t.Fatalf("open: a %+v, %+v; want a consumed and held", a, st)
			}
		}
		if st.Refused != 1 {
			t.Fatalf("%s: %+v, want 1 refusal", mode, st)
		}
	}
}

// Move never fails for want of room: the key leaves its old table, so the
// count does not grow, and refusing it would forgive what it consumed.
func TestMoveAtCap(t *testing.T) {
	ctx := context.Background()
	now := t0.UnixMicro()
	s := newStore(t, memstore.Options{MaxKeys: 16, Shards: 1, Logger: quiet})
	from, to := daily("from", ""), floodgate.MustPolicy("to", floodgate.Rule{Name: "day", Algorithm: floodgate.FixedWindow, Limit: 2000, Period: 24 * time.Hour})
	for i := range 16 {
		s.Do(ctx, now, floodgate.Op{Policy: from, Key: "k" + strconv.Itoa(i), Kind: floodgate.OpAllow, Cost: 1000})
	}
	if err := s.Move(ctx, now, from, to, "k3"); err != nil {
		t.Fatal(err)
	}
	if d, _ := s.Do(ctx, now, floodgate.Op{Policy: to, Key: "k3", Kind: floodgate.OpPeek, Cost: 1}); d.Remaining != 1000 {
		t.Fatalf("k3 after the move: %+v, want 1000 of 2000 left", d)
	}
	if st := s.Stats(); st.Keys != 16 || st.Refused != 0 {
		t.Fatalf("%+v", st)
	}
}

// A snapshot restored under a lower cap keeps every key it holds that
// still constrains: the cap was lowered, and dropping them would forgive
// them. New keys are refused until there is room.
func TestRestoreUnderLowerCap(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewManual(t0)
	path := filepath.Join(t.TempDir(), "state.snap")
	s1 := newStore(t, memstore.Options{SnapshotPath: path, Clock: clk})
	l1 := floodgate.NewLimiter(daily("quota", ""), s1, floodgate.WithClock(clk))
	for i := range 300 {
		l1.AllowN(ctx, "k"+strconv.Itoa(i), 1000)
	}
	if err := s1.Snapshot(path); err != nil {
		t.Fatal(err)
	}
	s2 := newStore(t, memstore.Options{SnapshotPath: path, Clock: clk, MaxKeys: 200, Shards: 4, Logger: quiet})
	l2 := floodgate.NewLimiter(daily("quota", ""), s2, floodgate.WithClock(clk))
	for i := range 300 {
		if d, _ := l2.PeekN(ctx, "k"+strconv.Itoa(i), 1); d.Allowed {
			t.Fatalf("k%d restored under a lower cap: %+v; want still spent", i, d)
		}
	}
	if d, _ := l2.AllowN(ctx, "new", 1); !d.Degraded {
		t.Fatalf("a new key past the cap after the restore: %+v, want refused", d)
	}
	if st := s2.Stats(); st.Keys != 300 {
		t.Fatalf("%+v: want the 300 restored keys held", st)
	}
}

// Refusals are logged, with their count, at most once every 10 seconds of
// the decisions' clock, however many there are.
func TestRefusalsLoggedRarely(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewManual(t0)
	var buf bytes.Buffer
	var mu sync.Mutex
	s := newStore(t, memstore.Options{MaxKeys: 16, Shards: 1, Logger: slog.New(slog.NewTextHandler(lockedWriter{&mu, &buf}, nil))})
	l := floodgate.NewLimiter(daily("quota", ""), s, floodgate.WithClock(clk))
	for i := range 10_000 {
		l.AllowN(ctx, "k"+strconv.Itoa(i), 1000)
		if i%100 == 99 {
			clk.Advance(time.Second) // 100 s in all
		}
	}
	mu.Lock()
	defer mu.Unlock()
	lines := strings.Count(buf.String(), "no room for new keys")
	if lines < 9 || lines > 11 || !strings.Contains(buf.String(), "refused=") {
		t.Fatalf("%d log lines over 100 s of refusals, want one every 10 s:\n%s", lines, buf.String())
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (w lockedWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.Write(b)
}

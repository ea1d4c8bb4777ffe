package redisstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/redistest"
	"github.com/floodgate/floodgate/redisstore"
)

// shareNode opens a store that promotes a key to a slice at its first
// decision, on the caller's clock.
func shareNode(t *testing.T, addr, prefix string) *redisstore.Store {
	t.Helper()
	s, err := redisstore.New("redis://"+addr, redisstore.Options{ClientTime: true, ShareHotRate: 1, Prefix: prefix, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// One node, one hot key: it admits exactly the limit in each window, from
// far fewer Redis calls than decisions, and Redis counts what it took.
func TestShareOneNode(t *testing.T) {
	srv := redistest.Standalone(t)
	s := shareNode(t, srv.Addr, "one")
	defer s.Close()
	p := floodgate.MustPolicy("p", floodgate.Rule{Name: "w", Algorithm: floodgate.FixedWindow, Limit: 1000, Period: time.Hour, Tier: floodgate.TierLocalShare})
	ctx := context.Background()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
	for w := range 2 {
		admitted := 0
		for i := range 3000 {
			d, err := s.Do(ctx, now+int64(i), floodgate.Op{Policy: p, Key: "k", Kind: floodgate.OpAllow, Cost: 1})
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				admitted++
			}
		}
		if admitted != 1000 {
			t.Errorf("window %d: admitted %d, want 1000", w, admitted)
		}
		now += time.Hour.Microseconds()
	}
	st := s.Stats()
	if st.Share.Takes == 0 || st.Share.Takes*10 > 6000 {
		t.Errorf("%d calls of ShareFunction for 6000 decisions, want at least 10× fewer", st.Share.Takes)
	}
	t.Logf("%+v", st.Share)
}

// The model: several stores (nodes) on one Redis, random interleavings of
// decisions, sweeps (idle slices given back), nodes closing (slices given
// back) or dying (slices stranded), and the clock moving within and across
// windows. The requests admitted in any window of any rule never exceed
// its limit, as an exact limiter's would not.
func TestShareModel(t *testing.T) {
	srv := redistest.Standalone(t)
	ctx := context.Background()
	for seed := range 12 {
		rng := rand.New(rand.NewPCG(uint64(seed), 19))
		rules := []floodgate.Rule{{Name: "h", Algorithm: floodgate.FixedWindow, Limit: int64(5 + rng.IntN(200)), Period: time.Hour, Tier: floodgate.TierLocalShare}}
		if seed%3 == 2 {
			rules = append(rules, floodgate.Rule{Name: "h3", Algorithm: floodgate.FixedWindow, Limit: rules[0].Limit * 2, Period: 3 * time.Hour, Tier: floodgate.TierLocalShare})
		}
		p := floodgate.MustPolicy("m", rules...)
		prefix := fmt.Sprint("model", seed)
		nodes := make([]*redisstore.Store, 3+rng.IntN(3))
		var dead []*redisstore.Store
		for i := range nodes {
			nodes[i] = shareNode(t, srv.Addr, prefix)
		}
		admitted := map[[2]int64]int64{} // {rule, window start} → requests
		exact := map[[2]int64]int64{}    // what an exact limiter admits of the same requests
		var asked, got, exactGot int64
		now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
		for step := range 600 {
			i := rng.IntN(len(nodes))
			switch x := rng.IntN(100); {
			case x < 70:
				cost := int64(1 + rng.IntN(3)/2)
				d, err := nodes[i].Do(ctx, now, floodgate.Op{Policy: p, Key: "k", Kind: floodgate.OpAllow, Cost: cost})
				if err != nil {
					t.Fatal(err)
				}
				asked += cost
				fits := true
				for r, rule := range rules {
					per := rule.Period.Microseconds()
					fits = fits && exact[[2]int64{int64(r), now - now%per}]+cost <= rule.Limit
				}
				for r, rule := range rules {
					if per := rule.Period.Microseconds(); fits {
						exact[[2]int64{int64(r), now - now%per}] += cost
					}
				}
				if fits {
					exactGot += cost
				}
				if !d.Allowed {
					break
				}
				got += cost
				for r, rule := range rules {
					per := rule.Period.Microseconds()
					w := [2]int64{int64(r), now - now%per}
					if admitted[w] += cost; admitted[w] > rule.Limit {
						t.Fatalf("seed %d step %d: rule %s admitted %d in its window from %d, limit %d", seed, step, rule.Name, admitted[w], w[1], rule.Limit)
					}
				}
			case x < 78:
				redisstore.ShareSweep(nodes[i], now)
			case x < 81: // a node leaves, giving its slices back; another comes
				nodes[i].Close()
				nodes[i] = shareNode(t, srv.Addr, prefix)
			case x < 83: // a node dies holding its slices
				dead = append(dead, nodes[i])
				nodes[i] = shareNode(t, srv.Addr, prefix)
			case x < 95:
				now += rng.Int64N(300_000)
			default:
				now += rng.Int64N(40 * time.Minute.Microseconds())
			}
		}
		for _, s := range append(nodes, dead...) {
			s.Close()
		}
		if got > exactGot {
			t.Errorf("seed %d: admitted %d, exact %d", seed, got, exactGot)
		}
		t.Logf("seed %d: %d nodes, limit %d: asked %d, admitted %d, exact admits %d", seed, len(nodes), rules[0].Limit, asked, got, exactGot)
	}
}

// A node gives back what is left of its slice when the key goes idle, and
// on Close: another node then admits the whole rest of the limit.
func TestShareGivesBackIdleAndOnClose(t *testing.T) {
	srv := redistest.Standalone(t)
	ctx := context.Background()
	p := floodgate.MustPolicy("p", floodgate.Rule{Name: "w", Algorithm: floodgate.FixedWindow, Limit: 1000, Period: time.Hour, Tier: floodgate.TierLocalShare})
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
	for _, how := range []string{"idle", "close"} {
		a, b := shareNode(t, srv.Addr, how), shareNode(t, srv.Addr, how)
		now := t0
		used := 0
		for range 100 { // 1,000 a second: a's slices grow with its rate
			d, err := a.Do(ctx, now, floodgate.Op{Policy: p, Key: "k", Kind: floodgate.OpAllow, Cost: 1})
			if err != nil || !d.Allowed {
				t.Fatalf("%s: %v %+v", how, err, d)
			}
			used++
			now += 1000
		}
		if how == "idle" {
			now += 300_000
			redisstore.ShareSweep(a, now)
		} else {
			a.Close()
		}
		st := a.Stats().Share
		if st.Returned == 0 {
			t.Errorf("%s: nothing given back (%+v)", how, st)
		}
		for {
			d, err := b.Do(ctx, now, floodgate.Op{Policy: p, Key: "k", Kind: floodgate.OpAllow, Cost: 1})
			if err != nil {
				t.Fatal(err)
			}
			if !d.Allowed {
				break
			}
			used++
		}
		if used != 1000 {
			t.Errorf("%s: %d admitted in all, want the whole limit 1000 (a gave back %d)", how, used, st.Returned)
		}
		t.Logf("%s: a gave back %d", how, st.Returned)
		if how == "idle" {
			a.Close()
		}
		b.Close()
	}
}

// Memory stays bounded under a flood of distinct keys: at most ShareKeys
// keys hold slices, keys below ShareHotRate decisions a second stay exact
// (a Redis call each), and the cold keys' counts are bounded.
func TestShareHotKeysOnly(t *testing.T) {
	srv := redistest.Standalone(t)
	ctx := context.Background()
	s, err := redisstore.New("redis://"+srv.Addr, redisstore.Options{ClientTime: true, ShareHotRate: 3, ShareKeys: 4, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	p := floodgate.MustPolicy("p", floodgate.Rule{Name: "w", Algorithm: floodgate.FixedWindow, Limit: 100, Period: time.Hour, Tier: floodgate.TierLocalShare})
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
	do := func(key string) {
		if _, err := s.Do(ctx, now, floodgate.Op{Policy: p, Key: key, Kind: floodgate.OpAllow, Cost: 1}); err != nil {
			t.Fatal(err)
		}
		now++
	}
	for i := range 5000 { // cold: once each
		do(fmt.Sprint("cold", i))
	}
	if st := s.Stats(); st.Share.Keys != 0 || st.Calls != 5000 || redisstore.ShareSeen(s) > 4*4 {
		t.Fatalf("cold keys: %+v, %d counted", st, redisstore.ShareSeen(s))
	}
	for i := range 10 { // hot: 20 each, but only 4 fit
		for range 20 {
			do(fmt.Sprint("hot", i))
		}
	}
	st := s.Stats()
	if st.Share.Keys != 4 {
		t.Fatalf("%d keys hold slices, want ShareKeys = 4", st.Share.Keys)
	}
	if st.Share.Local == 0 {
		t.Fatal("no decision made from a slice")
	}
	t.Logf("%+v", st.Share)
}

// DoBatch decides a local share's ops from their slices and the others
// on Redis, each in its place.
func TestShareInBatch(t *testing.T) {
	srv := redistest.Standalone(t)
	s := shareNode(t, srv.Addr, "batch")
	defer s.Close()
	ctx := context.Background()
	share := floodgate.MustPolicy("s", floodgate.Rule{Name: "w", Algorithm: floodgate.FixedWindow, Limit: 50, Period: time.Hour, Tier: floodgate.TierLocalShare})
	exact := floodgate.MustPolicy("e", floodgate.Rule{Name: "x", Algorithm: floodgate.FixedWindow, Limit: 30, Period: time.Hour})
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
	got := map[string]int{}
	for range 100 {
		ops := []floodgate.Op{
			{Policy: exact, Key: "k", Kind: floodgate.OpAllow, Cost: 1},
			{Policy: share, Key: "k", Kind: floodgate.OpAllow, Cost: 1},
		}
		out := make([]floodgate.Decision, 2)
		if err := s.DoBatch(ctx, now, ops, out); err != nil {
			t.Fatal(err)
		}
		for i, d := range out {
			if d.Allowed {
				got[ops[i].Policy.Name()]++
			}
		}
		now += 1000
	}
	if got["s"] != 50 || got["e"] != 30 {
		t.Fatalf("admitted %v, want s 50 and e 30", got)
	}
	if st := s.Stats().Share; st.Local == 0 {
		t.Fatalf("no decision from a slice: %+v", st)
	}
}

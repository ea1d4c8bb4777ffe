package redisstore_test

import (
	"context"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/internal/redistest"
	"github.com/floodgate/floodgate/memstore"
	"github.com/floodgate/floodgate/redisstore"
)

// Real concurrency against real servers: many goroutines, two Store
// instances (two "servers") on one Redis Cluster of three masters and on
// one standalone Redis, every algorithm. Time is injected (ClientTime and
// a manual clock), so every bound is exact: the memory store, fed what the
// Redis store admitted, is the oracle.

// ccRules are the algorithms under test, each admitting ccLimit at once.
const ccLimit = 30

var ccRules = []floodgate.Rule{
	{Name: "r", Algorithm: floodgate.TokenBucket, Limit: ccLimit, Period: time.Hour},
	{Name: "r", Algorithm: floodgate.TokenBucket, Refill: floodgate.RefillInterval, Limit: ccLimit, Period: time.Hour},
	{Name: "r", Algorithm: floodgate.GCRA, Limit: ccLimit, Period: time.Hour},
	{Name: "r", Algorithm: floodgate.LeakyBucket, Limit: ccLimit, Period: time.Hour},
	{Name: "r", Algorithm: floodgate.FixedWindow, Limit: ccLimit, Period: time.Hour},
	{Name: "r", Algorithm: floodgate.SlidingWindow, Limit: ccLimit, Period: time.Hour},
	{Name: "r", Algorithm: floodgate.SlidingLog, Limit: ccLimit, Period: time.Hour},
	{Name: "r", Algorithm: floodgate.SlidingSubwindow, Limit: ccLimit, Period: time.Hour, Granularity: time.Minute},
}

func ccRuleName(r floodgate.Rule) string {
	n := string(r.Algorithm)
	if r.Refill != "" {
		n += "_" + string(r.Refill)
	}
	return n
}

// ccT0 is the test's first instant: 10 minutes into an hour, so that the
// second phase (25 minutes later) is in the same fixed and sliding window.
var ccT0 = time.Date(2031, 3, 4, 5, 10, 0, 0, time.UTC)

// ccDeployments starts a three-master Cluster and a standalone server and
// returns their store URLs.
func ccDeployments(t *testing.T) map[string]string {
	c := redistest.Cluster(t, 3)
	s := redistest.Standalone(t)
	return map[string]string{
		"cluster":    "redis-cluster://" + strings.Join(c.Addrs(), ","),
		"standalone": "redis://" + s.Addr,
	}
}

func ccStore(t *testing.T, url string, opts redisstore.Options) *redisstore.Store {
	t.Helper()
	s, err := redisstore.New(url, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// ccOracle is a memory store limiter of policy p on clk.
func ccOracle(t *testing.T, p *floodgate.Policy, clk floodgate.Clock) *floodgate.Limiter {
	t.Helper()
	m, err := memstore.New(memstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return floodgate.NewLimiter(p, m, floodgate.WithClock(clk))
}

// ccCounts counts, per key, the units admitted.
type ccCounts struct {
	mu sync.Mutex
	n  map[string]int64
}

func (c *ccCounts) add(key string, n int64) {
	c.mu.Lock()
	if c.n == nil {
		c.n = map[string]int64{}
	}
	c.n[key] += n
	c.mu.Unlock()
}

func (c *ccCounts) get(key string) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[key]
}

const (
	ccGoroutines = 64
	ccOps        = 30 // per goroutine and phase
	ccHot        = 3
	ccCold       = 40
)

func ccKeys() []string {
	var keys []string
	for i := range ccHot {
		keys = append(keys, "hot"+strconv.Itoa(i))
	}
	for i := range ccCold {
		keys = append(keys, "cold"+strconv.Itoa(i))
	}
	return keys
}

// ccLoad runs ccGoroutines goroutines, alternating between the limiters,
// each making ccOps requests (Allow, AllowN, AllowBatch, AllowAll) on hot
// and cold keys, and returns the units admitted per key.
func ccLoad(t *testing.T, lims []*floodgate.Limiter, seed uint64) *ccCounts {
	t.Helper()
	keys := ccKeys()
	counts := &ccCounts{}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for g := range ccGoroutines {
		wg.Go(func() {
			l := lims[g%len(lims)]
			rng := rand.New(rand.NewPCG(seed, uint64(g)))
			pick := func() string {
				if rng.IntN(10) < 6 {
					return keys[rng.IntN(ccHot)]
				}
				return keys[ccHot+rng.IntN(ccCold)]
			}
			check := func(what string, d floodgate.Decision, err error) bool {
				if err != nil || d.Degraded {
					t.Errorf("%s: %+v, %v", what, d, err)
					return false
				}
				if d.Remaining > ccLimit || d.Remaining < 0 {
					t.Errorf("%s: remaining %d of %d", what, d.Remaining, ccLimit)
				}
				return true
			}
			ctx := context.Background()
			<-start
			for range ccOps {
				switch rng.IntN(4) {
				case 0:
					k := pick()
					d, err := l.Allow(ctx, k)
					if check("Allow", d, err) && d.Allowed {
						counts.add(k, 1)
					}
				case 1:
					k, n := pick(), 1+rng.Int64N(3)
					d, err := l.AllowN(ctx, k, n)
					if check("AllowN", d, err) && d.Allowed {
						counts.add(k, n)
					}
				case 2:
					items := make([]floodgate.Item, 2+rng.IntN(3))
					for i := range items {
						items[i] = floodgate.Item{Limiter: l, Key: pick(), Cost: 1 + rng.Int64N(2)}
					}
					out := make([]floodgate.Decision, len(items))
					err := floodgate.AllowBatch(ctx, items, out)
					for i, it := range items {
						if check("AllowBatch", out[i], err) && out[i].Allowed {
							counts.add(it.Key, it.Cost)
						}
					}
				case 3:
					items := make([]floodgate.Item, 2+rng.IntN(2))
					for i := range items {
						items[i] = floodgate.Item{Limiter: l, Key: pick(), Cost: 1 + rng.Int64N(2)}
					}
					out := make([]floodgate.Decision, len(items))
					ok, err := floodgate.AllowAll(ctx, items, out)
					good := err == nil
					for i := range items {
						good = check("AllowAll", out[i], err) && good
					}
					if good && ok {
						for _, it := range items {
							counts.add(it.Key, it.Cost)
						}
					}
				}
			}
		})
	}
	close(start)
	wg.Wait()
	return counts
}

// ccExact checks that what the Redis store admitted for each key fits the
// oracle (the memory store, fed the same totals at the same instants,
// admits them: no over-admission), and that the Redis state now is the
// oracle's (no lost increment, nothing left charged by a refused
// AllowAll).
func ccExact(t *testing.T, l, oracle *floodgate.Limiter, counts *ccCounts, phase string) {
	t.Helper()
	ctx := context.Background()
	var total int64
	for _, k := range ccKeys() {
		n := counts.get(k)
		total += n
		if n > 0 {
			d, err := oracle.AllowN(ctx, k, n)
			if err != nil {
				t.Fatal(err)
			}
			if !d.Allowed {
				od, _ := oracle.PeekN(ctx, k, 0)
				t.Errorf("%s: %s: admitted %d units, but only %d fit (over-admission)", phase, k, n, od.Remaining)
				continue
			}
		}
		got, err := l.PeekN(ctx, k, 0)
		if err != nil || got.Degraded {
			t.Fatalf("peek %s: %+v %v", k, got, err)
		}
		want, _ := oracle.PeekN(ctx, k, 0)
		if got.Remaining != want.Remaining || got.ResetAfter != want.ResetAfter {
			t.Errorf("%s: %s (admitted %d): Redis says remaining %d, reset after %s; exact: %d, %s",
				phase, k, n, got.Remaining, got.ResetAfter, want.Remaining, want.ResetAfter)
		}
	}
	if total == 0 {
		t.Errorf("%s: nothing admitted", phase)
	}
}

// Every algorithm, two stores on one Cluster (and on one standalone
// server), 64 goroutines of Allow, AllowN, AllowBatch and AllowAll on hot
// and cold keys: each key admits exactly what its rule allows, at the
// first instant and again 25 minutes later, and its state in Redis is
// exactly what was admitted.
func TestConcurrentExactAdmission(t *testing.T) {
	for dep, url := range ccDeployments(t) {
		t.Run(dep, func(t *testing.T) {
			opts := redisstore.Options{ClientTime: true, Timeout: 5 * time.Second}
			a, b := ccStore(t, url, opts), ccStore(t, url, opts)
			for _, rule := range ccRules {
				t.Run(ccRuleName(rule), func(t *testing.T) {
					p := floodgate.MustPolicy("cc-"+ccRuleName(rule), rule)
					clk := clock.NewManual(ccT0)
					lims := []*floodgate.Limiter{
						floodgate.NewLimiter(p, a, floodgate.WithClock(clk)),
						floodgate.NewLimiter(p, b, floodgate.WithClock(clk)),
					}
					oracle := ccOracle(t, p, clk)
					ccExact(t, lims[0], oracle, ccLoad(t, lims, 1), "at t0")
					clk.Advance(25 * time.Minute)
					ccExact(t, lims[1], oracle, ccLoad(t, lims, 2), "at t0+25m")
				})
			}
		})
	}
}

// hookStore is a Store (never a GroupStore, as a Cluster's is in effect)
// that runs after(n) once its nth DoBatch has returned: a deterministic
// place between AllowAll's decision and its compensating refund.
type hookStore struct {
	floodgate.Store
	n     atomic.Int32
	after func(n int32)
}

func (h *hookStore) DoBatch(ctx context.Context, now int64, ops []floodgate.Op, out []floodgate.Decision) error {
	err := h.Store.DoBatch(ctx, now, ops, out)
	if h.after != nil {
		h.after(h.n.Add(1))
	}
	return err
}

// ccMasters maps each hash slot of c to its master's address.
func ccMasters(t *testing.T, c *redistest.ClusterSet) []string {
	t.Helper()
	out, err := redistest.Cmd(c.Nodes[0].Addr, "CLUSTER", "NODES")
	if err != nil {
		t.Fatal(err)
	}
	slots := make([]string, 16384)
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 9 || !strings.Contains(f[2], "master") {
			continue
		}
		addr, _, _ := strings.Cut(f[1], "@")
		for _, r := range f[8:] {
			lo, hi, ok := strings.Cut(r, "-")
			if !ok {
				hi = lo
			}
			a, err1 := strconv.Atoi(lo)
			b, err2 := strconv.Atoi(hi)
			if err1 != nil || err2 != nil {
				continue
			}
			for s := a; s <= b; s++ {
				slots[s] = addr
			}
		}
	}
	return slots
}

// ccKeyOn returns a key of policy p whose Redis key is on master addr (or,
// with addr "", on another master than avoid).
func ccKeyOn(t *testing.T, s *redisstore.Store, slots []string, p *floodgate.Policy, prefix, addr, avoid string) string {
	t.Helper()
	for i := range 10000 {
		k := prefix + strconv.Itoa(i)
		m := slots[redisstore.KeySlot(s.Key(p.Name(), k))]
		if addr != "" && m == addr || addr == "" && m != avoid {
			return k
		}
	}
	t.Fatal("no key found")
	return ""
}

// ccCluster starts a three-master Cluster and one store on it.
func ccCluster(t *testing.T, opts redisstore.Options) (*redistest.ClusterSet, string, *redisstore.Store) {
	t.Helper()
	c := redistest.Cluster(t, 3)
	url := "redis-cluster://" + strings.Join(c.Addrs(), ",")
	return c, url, ccStore(t, url, opts)
}

// AllowAll across masters under contention: each AllowAll charges every
// key or none, so after many goroutines of AllowAll on {x, y} (y's limit
// the smaller) and of Allow on x alone, from two stores, x has consumed
// exactly the AllowAlls admitted plus its own admissions, y exactly the
// AllowAlls admitted, and neither more than its limit.
func TestClusterAllowAllCompensationExact(t *testing.T) {
	c, url, a := ccCluster(t, redisstore.Options{ClientTime: true, Timeout: 5 * time.Second})
	b := ccStore(t, url, redisstore.Options{ClientTime: true, Timeout: 5 * time.Second})
	slots := ccMasters(t, c)
	for _, rule := range ccRules {
		t.Run(ccRuleName(rule), func(t *testing.T) {
			px := floodgate.MustPolicy("ccx-"+ccRuleName(rule), rule)
			ry := rule
			ry.Limit = 12
			py := floodgate.MustPolicy("ccy-"+ccRuleName(rule), ry)
			x := ccKeyOn(t, a, slots, px, "x", c.Nodes[0].Addr, "")
			y := ccKeyOn(t, a, slots, py, "y", c.Nodes[1].Addr, "")
			clk := clock.NewManual(ccT0)
			var lx, ly [2]*floodgate.Limiter
			for i, s := range []*redisstore.Store{a, b} {
				lx[i] = floodgate.NewLimiter(px, s, floodgate.WithClock(clk))
				ly[i] = floodgate.NewLimiter(py, s, floodgate.WithClock(clk))
			}
			var all, alone atomic.Int64
			var wg sync.WaitGroup
			for g := range 32 {
				wg.Go(func() {
					ctx := context.Background()
					for range 12 {
						if g%4 == 3 {
							d, err := lx[g%2].Allow(ctx, x)
							if err != nil || d.Degraded {
								t.Errorf("Allow: %+v %v", d, err)
								return
							}
							if d.Allowed {
								alone.Add(1)
							}
							continue
						}
						out := make([]floodgate.Decision, 2)
						ok, err := floodgate.AllowAll(ctx, []floodgate.Item{{Limiter: lx[g%2], Key: x, Cost: 1}, {Limiter: ly[g%2], Key: y, Cost: 1}}, out)
						if err != nil || out[0].Degraded || out[1].Degraded {
							t.Errorf("AllowAll: %+v %v", out, err)
							return
						}
						if ok {
							all.Add(1)
						}
					}
				})
			}
			wg.Wait()
			ctx := context.Background()
			dx, err1 := lx[0].PeekN(ctx, x, 0)
			dy, err2 := ly[1].PeekN(ctx, y, 0)
			if err1 != nil || err2 != nil {
				t.Fatal(err1, err2)
			}
			usedX, usedY := ccLimit-dx.Remaining, ry.Limit-dy.Remaining
			if all.Load() > ry.Limit || all.Load()+alone.Load() > ccLimit {
				t.Errorf("admitted %d AllowAll and %d Allow: over the limits %d and %d", all.Load(), alone.Load(), ry.Limit, ccLimit)
			}
			if usedY != all.Load() || usedX != all.Load()+alone.Load() {
				t.Errorf("y consumed %d, x %d; want %d (AllowAll admitted) and %d (plus Allow on x)",
					usedY, usedX, all.Load(), all.Load()+alone.Load())
			}
			if all.Load() == 0 {
				t.Error("no AllowAll admitted")
			}
		})
	}
}

// A caller whose context ends while AllowAll's first round trip is in
// flight (a deadline, a client gone) on a Cluster: a key was admitted and
// another denied, so the request is refused; the admitted key must be
// refunded all the same. The refund was made under the caller's ended
// context, so the store answered it with the context's error without
// asking Redis, and the key stayed charged for a request refused whole.
func TestClusterAllowAllRefundsAfterCallerLeaves(t *testing.T) {
	c, _, s := ccCluster(t, redisstore.Options{ClientTime: true, Timeout: 5 * time.Second})
	slots := ccMasters(t, c)
	p := floodgate.MustPolicy("cc-leave", floodgate.Rule{Name: "r", Algorithm: floodgate.FixedWindow, Limit: 5, Period: time.Hour})
	h := &hookStore{Store: s}
	clk := clock.NewManual(ccT0)
	l := floodgate.NewLimiter(p, h, floodgate.WithClock(clk))
	for _, how := range []string{"cancel", "deadline"} {
		t.Run(how, func(t *testing.T) {
			x := ccKeyOn(t, s, slots, p, how+"-x", c.Nodes[0].Addr, "")
			y := ccKeyOn(t, s, slots, p, how+"-y", c.Nodes[1].Addr, "")
			if d, err := l.AllowN(context.Background(), y, 5); err != nil || !d.Allowed {
				t.Fatalf("exhausting y: %+v %v", d, err)
			}
			var ctx context.Context
			var cancel context.CancelFunc
			if how == "cancel" {
				ctx, cancel = context.WithCancel(context.Background())
			} else {
				ctx, cancel = context.WithTimeout(context.Background(), 300*time.Millisecond)
			}
			defer cancel()
			h.n.Store(0)
			h.after = func(n int32) {
				if n == 1 { // the decisions are back; the refund is next
					cancel()
					<-ctx.Done()
				}
			}
			defer func() { h.after = nil }()
			out := make([]floodgate.Decision, 2)
			ok, err := floodgate.AllowAll(ctx, []floodgate.Item{{Limiter: l, Key: x, Cost: 2}, {Limiter: l, Key: y, Cost: 1}}, out)
			h.after = nil
			if ok {
				t.Fatalf("AllowAll admitted with y exhausted: %+v", out)
			}
			if !out[0].Allowed || out[1].Allowed {
				t.Fatalf("want x fitting and y refused: %+v (err %v)", out, err)
			}
			d, perr := l.PeekN(context.Background(), x, 0)
			if perr != nil {
				t.Fatal(perr)
			}
			if d.Remaining != 5 {
				t.Errorf("x charged %d for an AllowAll refused whole (AllowAll's error: %v)", 5-d.Remaining, err)
			}
		})
	}
}

// A master killed in the middle of a load, from two stores: every
// decision on a key of a live master is Redis's and counted exactly once
// (what Redis holds is exactly what was admitted), and decisions on the
// dead master's keys made after it died go to the failure mode (closed:
// refused), so they count nowhere.
func TestClusterMasterKilledLiveKeysExact(t *testing.T) {
	// The timeout is not the subject (a dead master refuses connections
	// at once): generous, for a call that times out may still be counted
	// by Redis, and on a starved CI host 100 ms calls to live masters did.
	opts := redisstore.Options{ClientTime: true, Timeout: 10 * time.Second, BreakerCooldown: 100 * time.Millisecond}
	c, url, a := ccCluster(t, opts)
	b := ccStore(t, url, opts)
	// the live masters keep serving their slots once the cluster has
	// marked the dead one failed
	for _, n := range c.Nodes {
		if _, err := redistest.Cmd(n.Addr, "CONFIG", "SET", "cluster-require-full-coverage", "no"); err != nil {
			t.Fatal(err)
		}
	}
	slots := ccMasters(t, c)
	victim := c.Nodes[2]
	p := floodgate.MustPolicy("cc-kill", floodgate.Rule{Name: "r", Algorithm: floodgate.FixedWindow, Limit: 1 << 30, Period: time.Hour, OnStoreFailure: floodgate.FailClosed})
	clk := clock.NewManual(ccT0)
	lims := []*floodgate.Limiter{floodgate.NewLimiter(p, a, floodgate.WithClock(clk)), floodgate.NewLimiter(p, b, floodgate.WithClock(clk))}
	var keys []string
	onVictim := map[string]bool{}
	for i := range 48 {
		k := "k" + strconv.Itoa(i)
		keys = append(keys, k)
		onVictim[k] = slots[redisstore.KeySlot(a.Key(p.Name(), k))] == victim.Addr
	}
	var admitted ccCounts // Redis's admissions, per key
	var decisions, afterKill, liveDegraded, victimRedis atomic.Int64
	var killed atomic.Bool
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			l := lims[g%2]
			rng := rand.New(rand.NewPCG(7, uint64(g)))
			for {
				select {
				case <-stop:
					return
				default:
				}
				dead := killed.Load() // decided after the kill returned
				items := make([]floodgate.Item, 1+rng.IntN(4))
				for i := range items {
					items[i] = floodgate.Item{Limiter: l, Key: keys[rng.IntN(len(keys))], Cost: 1}
				}
				out := make([]floodgate.Decision, len(items))
				var err error
				if len(items) == 1 {
					out[0], err = l.Allow(context.Background(), items[0].Key)
				} else {
					err = floodgate.AllowBatch(context.Background(), items, out)
				}
				if err != nil {
					t.Error(err)
					return
				}
				for i, it := range items {
					d := out[i]
					switch {
					case d.Degraded && !onVictim[it.Key]:
						liveDegraded.Add(1)
					case !d.Degraded && onVictim[it.Key] && dead:
						victimRedis.Add(1)
					case d.Degraded && d.Allowed:
						t.Errorf("%s: closed rule admitted in failure mode", it.Key)
					}
					if d.Allowed && !d.Degraded {
						admitted.add(it.Key, 1)
					}
				}
				decisions.Add(int64(len(items)))
				if dead {
					afterKill.Add(int64(len(items)))
				}
			}
		})
	}
	// waits for events: the limits only end a hung test
	redistest.WaitFor(t, time.Minute, "decisions before the kill", func() bool { return decisions.Load() >= 600 })
	victim.Kill()
	killed.Store(true)
	redistest.WaitFor(t, time.Minute, "decisions after the kill", func() bool { return afterKill.Load() >= 800 })
	close(stop)
	wg.Wait()
	if liveDegraded.Load() > 0 {
		t.Errorf("%d decisions on live masters' keys went to the failure mode", liveDegraded.Load())
	}
	if victimRedis.Load() > 0 {
		t.Errorf("%d decisions on the dead master's keys were Redis's", victimRedis.Load())
	}
	// a fresh store, so no breaker of the load's stores is involved
	check := floodgate.NewLimiter(p, ccStore(t, url, redisstore.Options{ClientTime: true, Timeout: 2 * time.Second}), floodgate.WithClock(clk))
	live := 0
	for _, k := range keys {
		if onVictim[k] {
			continue
		}
		live++
		d, err := check.PeekN(context.Background(), k, 0)
		if err != nil || d.Degraded {
			t.Fatalf("peek %s: %+v %v", k, d, err)
		}
		if used := int64(1<<30) - d.Remaining; used != admitted.get(k) {
			t.Errorf("%s: Redis counts %d, %d admitted by Redis", k, used, admitted.get(k))
		}
	}
	if live == 0 || live == len(keys) {
		t.Fatalf("%d of %d keys on live masters", live, len(keys))
	}
}

// Reserve and Cancel, Refund, from two stores, concurrently, every
// algorithm, on a Cluster and a standalone server: each Cancel gives back
// once (a second Cancel nothing), so once every reservation is cancelled
// the key holds exactly what Allow admitted; refunds of more than was
// consumed leave the key fresh, never beyond, so exactly the rule's limit
// is admitted afterwards.
func TestConcurrentReserveCancelRefund(t *testing.T) {
	for dep, url := range ccDeployments(t) {
		t.Run(dep, func(t *testing.T) {
			opts := redisstore.Options{ClientTime: true, Timeout: 5 * time.Second}
			a, b := ccStore(t, url, opts), ccStore(t, url, opts)
			for _, rule := range ccRules {
				t.Run(ccRuleName(rule), func(t *testing.T) {
					p := floodgate.MustPolicy("ccr-"+ccRuleName(rule), rule)
					clk := clock.NewManual(ccT0)
					lims := []*floodgate.Limiter{floodgate.NewLimiter(p, a, floodgate.WithClock(clk)), floodgate.NewLimiter(p, b, floodgate.WithClock(clk))}
					ctx := context.Background()
					const key = "rk"
					var kept atomic.Int64
					var wg sync.WaitGroup
					for g := range 32 {
						wg.Go(func() {
							l := lims[g%2]
							for i := range 8 {
								if g%4 == 0 {
									d, err := l.Allow(ctx, key)
									if err != nil || d.Degraded {
										t.Errorf("Allow: %+v %v", d, err)
										return
									}
									if d.Allowed {
										kept.Add(1)
									}
									continue
								}
								r, err := l.Reserve(ctx, key, int64(1+i%3))
								if err != nil || r.Degraded {
									t.Errorf("Reserve: %+v %v", r, err)
									return
								}
								if err := r.Cancel(ctx); err != nil {
									t.Error(err)
								}
								if err := r.Cancel(ctx); err != nil { // gives nothing back
									t.Error(err)
								}
							}
						})
					}
					wg.Wait()
					d, err := lims[0].PeekN(ctx, key, 0)
					if err != nil {
						t.Fatal(err)
					}
					if used := int64(ccLimit) - d.Remaining; used != kept.Load() {
						t.Errorf("after every reservation was cancelled (twice): %d consumed, %d admitted by Allow", used, kept.Load())
					}
					// refunds of far more than was consumed, concurrently
					for g := range 16 {
						wg.Go(func() {
							if d, err := lims[g%2].Refund(ctx, key, 1+int64(g)); err != nil || d.Degraded || d.Remaining > ccLimit {
								t.Errorf("Refund: %+v %v", d, err)
							}
						})
					}
					wg.Wait()
					if d, err := lims[1].PeekN(ctx, key, 0); err != nil || d.Remaining != ccLimit || d.ResetAfter != 0 {
						t.Errorf("after refunds: %+v %v; want fresh", d, err)
					}
					var n atomic.Int64
					for g := range 16 {
						wg.Go(func() {
							for range 4 {
								if d, err := lims[g%2].Allow(ctx, key); err == nil && d.Allowed {
									n.Add(1)
								}
							}
						})
					}
					wg.Wait()
					if n.Load() != ccLimit {
						t.Errorf("after refunds %d admitted, want exactly %d", n.Load(), ccLimit)
					}
				})
			}
		})
	}
}

// AllowAll's compensating refund on a Cluster is a plain Refund, "newest
// consumption first", at the key's latest time. When the key's window has
// moved on between the decision and the refund (another server's clock,
// or, with Redis's TIME, a window boundary passed between the two round
// trips), the refund takes from the new window what was consumed in the
// old. docs/REDIS.md states the bound this pins: the new window admits at
// most its limit plus the refunded cost (6 of 5 here), never more. An undo
// at the charge's own time would make it exactly 5; it is not built.
//
// y, which refuses the AllowAll, has a daily window: a key written in the
// last millisecond of an hourly one gets a TTL of 2 ms, which Redis counts
// in real time, and on a starved host it expired before the AllowAll, so
// y was fresh again and admitted.
func TestClusterAllowAllRefundAcrossWindows(t *testing.T) {
	c, _, s := ccCluster(t, redisstore.Options{ClientTime: true, Timeout: 5 * time.Second})
	slots := ccMasters(t, c)
	p := floodgate.MustPolicy("cc-roll", floodgate.Rule{Name: "r", Algorithm: floodgate.FixedWindow, Limit: 5, Period: time.Hour})
	py := floodgate.MustPolicy("cc-roll-y", floodgate.Rule{Name: "r", Algorithm: floodgate.FixedWindow, Limit: 5, Period: 24 * time.Hour})
	x := ccKeyOn(t, s, slots, p, "x", c.Nodes[0].Addr, "")
	y := ccKeyOn(t, s, slots, py, "y", c.Nodes[1].Addr, "")
	early := clock.NewManual(ccT0.Truncate(time.Hour).Add(time.Hour - time.Millisecond)) // server A: the window's last ms
	late := clock.NewManual(ccT0.Truncate(time.Hour).Add(time.Hour + time.Millisecond))  // server B: the next window
	h := &hookStore{Store: s}
	la := floodgate.NewLimiter(p, h, floodgate.WithClock(early))
	ly := floodgate.NewLimiter(py, h, floodgate.WithClock(early))
	lb := floodgate.NewLimiter(p, s, floodgate.WithClock(late))
	ctx := context.Background()
	if d, err := ly.AllowN(ctx, y, 5); !d.Allowed || d.Degraded {
		t.Fatalf("exhausting y: %+v %v", d, err)
	}
	h.after = func(n int32) {
		if n == 1 { // between A's decision and its refund, B fills x's new window
			if d, _ := lb.AllowN(ctx, x, 5); !d.Allowed {
				t.Error("B's window not fresh")
			}
		}
	}
	out := make([]floodgate.Decision, 2)
	if ok, err := floodgate.AllowAll(ctx, []floodgate.Item{{Limiter: la, Key: x, Cost: 1}, {Limiter: ly, Key: y, Cost: 1}}, out); ok || err != nil || out[0].Degraded || out[1].Degraded {
		t.Fatalf("AllowAll of x and the exhausted y: %v %v %+v", ok, err, out)
	}
	admitted := 5
	for range 3 {
		if d, _ := lb.Allow(ctx, x); d.Allowed {
			admitted++
		}
	}
	if admitted > 6 {
		t.Errorf("x's new window admitted %d of 5: more than the limit plus the 1 refunded", admitted)
	}
}

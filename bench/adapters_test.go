package bench

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	golimiter "github.com/sethvargo/go-limiter"
	"github.com/sethvargo/go-limiter/memorystore"
	ulule "github.com/ulule/limiter/v3"
	ululemem "github.com/ulule/limiter/v3/drivers/store/memory"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/memstore"
)

// Limits are the equivalent limits every implementation is given: Limit
// requests per Period, with a burst (bucket capacity) of Limit.
type limits struct {
	name   string
	limit  int64
	period time.Duration
}

var (
	// admit: 100 million per 2e9 s (63 years), so a token comes back every
	// 20 s. Every request of a benchmark is admitted (even the tens of
	// millions a hot key gets), and no key drawn uniformly from 1M, which
	// gets a few requests per store, drains back to a fresh state while
	// its store lives (a few seconds): every decision is on an existing
	// key. (Floodgate's store forgets a key whose state is fresh again, so
	// under a limit that refills within microseconds, a billion an hour
	// say, the uniform workloads would mostly measure re-inserting keys.)
	admit = limits{"admit", 100_000_000, 2_000_000_000 * time.Second}
	// deny: one an hour, so that every request after a key's first is
	// denied.
	deny = limits{"deny", 1, time.Hour}
)

var ctx = context.Background()

// An allower is one implementation under one limit, keyed. Adapters are
// distinct struct types (not pointers) so that the generic benchmark loops
// are instantiated per adapter and call it directly, not through an
// interface.
type allower interface {
	allow(key string) bool
	close()
}

// fgAllower is Floodgate: a Limiter over a memstore.Store with the
// default options and the default (coarse) clock.
type fgAllower struct {
	l *floodgate.Limiter
	s *memstore.Store
}

func (a fgAllower) allow(key string) bool {
	d, _ := a.l.Allow(ctx, key)
	return d.Allowed
}

func (a fgAllower) close() { a.s.Close() }

// heldKeys is how many keys the store holds, to check that the keyed
// workloads decide on existing keys.
func (a fgAllower) heldKeys() int64 { return a.s.Stats().Keys }

func newFloodgate(r floodgate.Rule) fgAllower {
	p := floodgate.MustPolicy("bench", r)
	s := memstore.MustNew(memstore.Options{})
	return fgAllower{l: floodgate.NewLimiter(p, s), s: s}
}

// goLimiterAllower is github.com/sethvargo/go-limiter's memorystore: a
// token bucket refilled per interval, one map under an RWMutex.
type goLimiterAllower struct{ s golimiter.Store }

func (a goLimiterAllower) allow(key string) bool {
	_, _, _, ok, _ := a.s.Take(ctx, key)
	return ok
}

func (a goLimiterAllower) close() { a.s.Close(ctx) }

func newGoLimiter(lim limits) goLimiterAllower {
	s, err := memorystore.New(&memorystore.Config{Tokens: uint64(lim.limit), Interval: lim.period})
	if err != nil {
		panic(err)
	}
	return goLimiterAllower{s}
}

// ululeAllower is github.com/ulule/limiter/v3 with its memory store: a
// fixed window (from each key's first request) counted in a sync.Map.
type ululeAllower struct{ l *ulule.Limiter }

func (a ululeAllower) allow(key string) bool {
	c, _ := a.l.Get(ctx, key)
	return !c.Reached
}

func (a ululeAllower) close() {}

func newUlule(lim limits) ululeAllower {
	return ululeAllower{ulule.New(ululemem.NewStore(), ulule.Rate{Period: lim.period, Limit: lim.limit})}
}

// floodgate algorithms compared on the keyed workloads.
var fgKeyed = []struct {
	name string
	alg  floodgate.Algorithm
}{
	{"fg_token_bucket", floodgate.TokenBucket},
	{"fg_gcra", floodgate.GCRA},
	{"fg_fixed_window", floodgate.FixedWindow},
	{"fg_sliding_window", floodgate.SlidingWindow},
}

func fgRule(alg floodgate.Algorithm, lim limits) floodgate.Rule {
	return floodgate.Rule{Algorithm: alg, Limit: lim.limit, Period: lim.period}
}

// NumKeys is the size of the keyed workloads' key space.
const numKeys = 1_000_000

var (
	keysOnce sync.Once
	keys     []string
)

// allKeys returns the keys user:0000000 … user:0999999, generated once so
// that formatting them is never measured.
func allKeys() []string {
	keysOnce.Do(func() {
		keys = make([]string, numKeys)
		for i := range keys {
			keys[i] = fmt.Sprintf("user:%07d", i)
		}
	})
	return keys
}

// rng is a xorshift generator; pick maps it onto [0, n) by multiply-shift,
// a few cycles, so the random key choice costs next to nothing.
type rng uint64

func (r *rng) next() uint64 {
	x := uint64(*r)
	x ^= x << 13
	x ^= x >> 7
	x ^= x << 17
	*r = rng(x)
	return x
}

func (r *rng) pick(n int) int {
	return int((r.next() & 0xffffffff) * uint64(n) >> 32)
}

// report adds the share of requests admitted, so that a reader can check
// that every implementation admitted (or denied) what its limit says.
func report(b *testing.B, admitted, n int) {
	if n > 0 {
		b.ReportMetric(float64(admitted)/float64(n), "admitted/op")
	}
}

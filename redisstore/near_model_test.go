package redisstore

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/storekit"
)

// The near cache's premise, for every algorithm in hard and soft mode: a
// refusal of cost 1 at t with RetryAfter r holds until t+r, with the same
// decision but for the times counted down, while nothing but time moves
// the key's state (the store drops the entry on anything else). Random
// traces on the engine's own math (storekit.Apply, which the Lua mirrors
// and the differential suite holds it to) play Redis; every answer the
// near cache gives must be, field for field, the decision the engine
// gives, a refusal, which consumes nothing.
func TestNearCacheNeverAnswersWhatRedisWouldAdmit(t *testing.T) {
	algos := []floodgate.Rule{
		{Algorithm: floodgate.TokenBucket},
		{Algorithm: floodgate.TokenBucket, Refill: floodgate.RefillInterval},
		{Algorithm: floodgate.LeakyBucket},
		{Algorithm: floodgate.LeakyBucketShaper}, // never answered (nearSafe): what it says remains changes while it refuses
		{Algorithm: floodgate.GCRA},
		{Algorithm: floodgate.FixedWindow},
		{Algorithm: floodgate.SlidingLog},
		{Algorithm: floodgate.SlidingWindow},
		{Algorithm: floodgate.SlidingSubwindow, Granularity: 100 * time.Millisecond},
	}
	rng := rand.New(rand.NewPCG(19, 1))
	answered, skipped := 0, 0
	for trace := range 600 {
		var rules []floodgate.Rule
		for i := range 1 + rng.IntN(2) {
			r := algos[rng.IntN(len(algos))]
			r.Name = string(rune('a' + i))
			r.Limit = 1 + rng.Int64N(8)
			r.Period = time.Duration(1+rng.IntN(4)) * time.Second
			if r.Algorithm == floodgate.TokenBucket && r.Refill == "" && rng.IntN(2) == 0 {
				r.Burst = r.Limit + rng.Int64N(4)
			}
			if rng.IntN(3) == 0 {
				r.Mode, r.SoftPercent = floodgate.Soft, 50
			}
			rules = append(rules, r)
		}
		p, err := floodgate.NewPolicy("m", rules...)
		if err != nil { // a mode the algorithm does not take
			skipped++
			continue
		}
		c := newNearCache()
		state := make([]int64, storekit.Width(p))
		now := time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
		for step := range 300 {
			now += rng.Int64N(150_000)
			kind := floodgate.OpAllow
			if rng.IntN(5) == 0 {
				kind = []floodgate.OpKind{floodgate.OpPeek, floodgate.OpReserve, floodgate.OpCharge, floodgate.OpRefund, floodgate.OpReset}[rng.IntN(5)]
			}
			cost := int64(1)
			if rng.IntN(4) == 0 {
				cost = rng.Int64N(5)
			}
			op := p.Op(kind, "k", cost, time.Duration(rng.IntN(3))*time.Second)
			var d floodgate.Decision
			if kind == floodgate.OpAllow && c.lookup(now, &op, &d) {
				answered++
				before := append([]int64(nil), state...)
				exact := storekit.Apply(p, state, now, op)
				if d != exact {
					t.Fatalf("trace %d step %d (%v): cost %d\nnear cache %+v\nengine     %+v", trace, step, rules, op.Cost, d, exact)
				}
				copy(state, before) // the engine's refusal consumed nothing (nor may the cache's)
				continue
			}
			d = storekit.Apply(p, state, now, op)
			c.learn(now, &op, &d)
		}
	}
	if answered < 1000 {
		t.Errorf("the near cache answered %d requests in all the traces: the test says little", answered)
	}
	t.Logf("%d policies of 600 not valid, skipped", skipped)
	t.Logf("%d requests answered by the near cache, each one the engine refused", answered)
}

// BenchmarkNearLookup is the near cache's lookup alone, as every OpAllow of
// cost 1 pays it: on a key known refused (hit) and on a key it holds
// nothing for (miss, the cost added to a decision asked of Redis).
//
//	go test -run '^$' -bench NearLookup ./redisstore
func BenchmarkNearLookup(b *testing.B) {
	p := floodgate.MustPolicy("bench", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 1, Period: time.Hour})
	c := newNearCache()
	refused := p.Op(floodgate.OpAllow, "refused-key", 1, 0)
	d := floodgate.Decision{Limit: 1, RetryAfter: time.Hour, ResetAfter: time.Hour, Reason: floodgate.ReasonLimited, Rule: "r"}
	c.learn(0, &refused, &d)
	for _, tc := range []struct {
		name string
		op   floodgate.Op
		hit  bool
	}{{"hit", refused, true}, {"miss", p.Op(floodgate.OpAllow, "another-key", 1, 0), false}} {
		b.Run(tc.name, func(b *testing.B) {
			var out floodgate.Decision
			b.ReportAllocs()
			for i := range b.N {
				if c.lookup(int64(i), &tc.op, &out) != tc.hit {
					b.Fatal("wrong answer")
				}
			}
		})
	}
}

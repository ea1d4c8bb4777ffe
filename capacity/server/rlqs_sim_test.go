package server_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/floodgate/floodgate/capacity/server"
	"github.com/floodgate/floodgate/internal/lease"
)

// A deterministic run (manual clock, real gRPC) of Envoys sharing one
// bucket's quota while their demand shifts, new Envoys join, some leave
// (closing their stream) and some are cut off (their stream reset: they
// keep enforcing their last assignment until its TTL). After every answer,
// what the Envoys may admit (each live or cut Envoy's unexpired
// assignment) adds up to at most the quota; and the quota is used: in the
// rounds where demand exceeds it, the assignments add up to at least 90%
// of it on average.
func TestRLQSSimulation(t *testing.T) {
	for _, alg := range []lease.Algorithm{lease.FairShare, lease.ProportionalShare, lease.None} {
		t.Run(string(alg), func(t *testing.T) {
			const capacity, rounds = 500, 40
			h := startRLQS(t, config(resource(apiResource, capacity, alg)), server.RLQSOptions{})
			rng := rand.New(rand.NewPCG(20, uint64(len(alg))))
			var live, cut []*envoy
			join := func() {
				e := h.newEnvoy("envoy")
				e.subscribe("api", float64(1+rng.IntN(100)))
				live = append(live, e)
			}
			held := func() float64 {
				sum := 0.0
				for _, e := range append(append([]*envoy{}, live...), cut...) {
					sum += e.rate("api")
				}
				return sum
			}
			for i := 0; i < 20; i++ {
				join()
			}
			var used, busy float64
			for round := 1; round <= rounds; round++ {
				h.clock.Advance(time.Second)
				rng.Shuffle(len(live), func(i, j int) { live[i], live[j] = live[j], live[i] })
				demand := 0.0
				for _, e := range live {
					if rng.IntN(10) == 0 {
						e.buckets["api"].demand = float64(1 + rng.IntN(100))
					}
					demand += e.buckets["api"].demand
					e.report(time.Second)
					if s := held(); s > capacity {
						t.Fatalf("round %d: the Envoys may admit %v, over the quota %v", round, s, capacity)
					}
				}
				if demand > capacity && round > 3 {
					busy++
					used += held() / capacity
				}
				switch r := rng.IntN(10); {
				case r < 2:
					join()
				case r < 3 && len(live) > 5:
					live[0].close()
					live = live[1:]
				case r < 4 && len(live) > 5:
					live[0].cancel()
					cut = append(cut, live[0])
					live = live[1:]
				}
			}
			if busy > 0 && used/busy < 0.9 {
				t.Fatalf("the assignments used %.1f%% of the quota on average while demand exceeded it, want at least 90%%", 100*used/busy)
			}
			t.Logf("%s: %d Envoys left, %d cut; %.1f%% of the quota assigned on average over %v busy rounds", alg, len(live), len(cut), 100*used/max(busy, 1), busy)
		})
	}
}

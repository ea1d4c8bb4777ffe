package lease

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/floodgate/floodgate/clock"
)

// convergence runs n clients (no losses, refresh phases spread over the
// interval, steps of 100 ms) until their leases are steady, swaps the
// demand of the low and the high half, and returns how long until the
// leases are within 1% of the capacity of the algorithm's ideal shares
// (the sum of the differences), and the most the clients held.
func convergence(tb testing.TB, alg Algorithm, n int, seed uint64, steady bool) (time.Duration, float64, float64) {
	s := newSim(tb, simOpts{alg: alg, capacity: 1000, clients: n, seed: seed, step: 100 * time.Millisecond,
		table: Options{NoFastRefresh: steady}})
	high := func(i int) float64 { return float64(20 + (i*37)%180) }
	for i, c := range s.clients {
		c.prio = 0
		c.wants = 5
		if i%2 == 0 {
			c.wants = high(i)
		}
	}
	capU := toUnits(1000)
	for i := 0; i < 1200; i++ { // 2 minutes
		s.refresh()
		s.check(capU, "warm-up")
		s.advance()
	}
	for i, c := range s.clients { // the low half goes high, the high half low
		c.wants = 5
		if i%2 == 1 {
			c.wants = high(i)
		}
	}
	shift, gets := s.clk.NowMicro(), s.gets
	for i := 0; i < 3000; i++ {
		s.refresh()
		s.check(capU, "convergence")
		if s.offIdeal(alg) <= 0.01*1000 {
			d := time.Duration(s.clk.NowMicro()-shift) * time.Microsecond
			// requests per client per 5 s refresh interval while converging
			rate := float64(s.gets-gets) / float64(n) / max(1, d.Seconds()/5)
			return d, s.maxRatio, rate
		}
		s.advance()
	}
	return -1, s.maxRatio, 0
}

// offIdeal is the sum over active clients of |held - ideal share|.
func (s *sim) offIdeal(alg Algorithm) float64 {
	now := s.clk.NowMicro()
	var wants []float64
	var prios []int64
	var act []*simClient
	for _, c := range s.clients {
		if c.state == active {
			wants = append(wants, c.wants)
			prios = append(prios, c.prio)
			act = append(act, c)
		}
	}
	ideal := ShareBands(alg, 1000, 3*1000/float64(len(act)), wants, prios)
	var off float64
	for i, c := range act {
		off += math.Abs(c.holds(now).Capacity - ideal[i])
	}
	return off
}

// BenchmarkConvergence reports the time from a demand shift to leases
// within 1% of the ideal, in seconds and in refresh intervals (5 s), over
// 20 seeds (refresh phases): the median and the worst.
func BenchmarkConvergence(b *testing.B) {
	for _, c := range []struct {
		alg    Algorithm
		steady bool
	}{{FairShare, false}, {ProportionalShare, false}, {FairShare, true}, {ProportionalShare, true}} {
		alg := c.alg
		name := string(alg)
		if c.steady {
			name += "/NoFastRefresh"
		}
		b.Run(name, func(b *testing.B) {
			var ds []time.Duration
			var rate float64
			for b.Loop() {
				ds, rate = ds[:0], 0
				for seed := uint64(1); seed <= 20; seed++ {
					d, most, r := convergence(b, alg, 100, seed, c.steady)
					if d < 0 || most > 1 {
						b.Fatalf("seed %d: no convergence (%v) or over-grant (%v)", seed, d, most)
					}
					ds = append(ds, d)
					rate += r / 20
				}
			}
			b.ReportMetric(rate, "req/client/interval")
			slices.Sort(ds)
			b.ReportMetric(ds[len(ds)/2].Seconds(), "median-s")
			b.ReportMetric(ds[len(ds)-1].Seconds(), "worst-s")
			b.ReportMetric(ds[len(ds)/2].Seconds()/5, "median-intervals")
			b.ReportMetric(ds[len(ds)-1].Seconds()/5, "worst-intervals")
		})
	}
}

// utilization runs 100 clients whose demand always exceeds the capacity
// and shifts (every 30 s a fifth of them draw new wants) for 20 simulated
// minutes, with loss of the responses lost, and returns the mean share of
// the capacity in use (each client using min(lease, wants)) after a
// 2-minute warm-up, and the most the clients held.
func utilization(tb testing.TB, alg Algorithm, loss float64, seed uint64, steady bool) (float64, float64, float64) {
	s := newSim(tb, simOpts{alg: alg, capacity: 1000, clients: 100, loss: loss, seed: seed, step: 100 * time.Millisecond,
		table: Options{NoFastRefresh: steady}})
	rng := rand.New(rand.NewPCG(seed, 11))
	draw := func() float64 { return float64(5 + rng.IntN(40)) } // mean 25 x 100 clients = 2.5x the capacity
	for _, c := range s.clients {
		c.prio, c.wants = 0, draw()
	}
	capU := toUnits(1000)
	for i := 0; i < 12000; i++ {
		if i%300 == 0 {
			for _, c := range s.clients {
				if rng.IntN(5) == 0 {
					c.wants = draw()
				}
			}
		}
		if i == 1200 {
			s.utilSum, s.utilN, s.utilMin = 0, 0, math.Inf(1)
		}
		s.refresh()
		s.check(capU, "utilization")
		s.advance()
	}
	// requests per client per 5 s refresh interval over the run
	rate := float64(s.gets) / 100 / (12000 * 0.1 / 5)
	return s.utilSum / float64(s.utilN), s.maxRatio, rate
}

// BenchmarkUtilization reports the mean share of capacity in use while
// demand exceeds supply, and the most held (1 = the capacity: no more).
func BenchmarkUtilization(b *testing.B) {
	for _, alg := range []Algorithm{FairShare, ProportionalShare} {
		for _, loss := range []float64{0, 0.05} {
			for _, steady := range []bool{false, true} {
				name := fmt.Sprintf("%s/loss=%v", alg, loss)
				if steady {
					name += "/NoFastRefresh"
				}
				b.Run(name, func(b *testing.B) {
					var u, most, rate float64
					for b.Loop() {
						u, most, rate = utilization(b, alg, loss, 1, steady)
					}
					b.ReportMetric(rate, "req/client/interval")
					b.ReportMetric(100*u, "util%")
					b.ReportMetric(100*most, "max-held%")
				})
			}
		}
	}
}

// BenchmarkGet: one client's refresh of one resource, among n clients of
// it, each reporting the lease it holds; demand shifts a little with
// every request, so the plans are recomputed as they would be in service.
func BenchmarkGet(b *testing.B) {
	for _, n := range []int{1_000, 100_000} {
		for _, alg := range []Algorithm{FairShare, ProportionalShare, None} {
			b.Run(fmt.Sprintf("%s/clients=%d", alg, n), func(b *testing.B) {
				clk := clock.NewManual(t0)
				tb := New(mustConfig(b, oneResource(alg, 1e6, "")), Options{Clock: clk, MaxClients: 2 * n})
				ids := make([]string, n)
				has := make([]Lease, n)
				out := make([]Lease, 0, 1)
				for i := range ids {
					ids[i] = fmt.Sprint("client-", i)
					out, _ = tb.Get(ids[i], []Request{{Resource: "r", Priority: int64(i % 3), Wants: float64(i%100 + 1)}}, out)
					has[i] = out[0]
				}
				req := make([]Request, 1)
				i := 0
				b.ReportAllocs()
				for b.Loop() {
					k := i % n
					req[0] = Request{Resource: "r", Priority: int64(k % 3), Wants: float64((k+i)%100 + 1), Has: has[k]}
					var err error
					out, err = tb.Get(ids[k], req, out)
					if err != nil {
						b.Fatal(err)
					}
					has[k] = out[0]
					i++
				}
			})
		}
	}
}

// BenchmarkGetParallel: BenchmarkGet's fair share from all cores at once.
func BenchmarkGetParallel(b *testing.B) {
	for _, n := range []int{1_000, 100_000} {
		b.Run(fmt.Sprintf("clients=%d", n), func(b *testing.B) {
			clk := clock.NewManual(t0)
			tb := New(mustConfig(b, oneResource(FairShare, 1e6, "")), Options{Clock: clk, MaxClients: 2 * n})
			ids := make([]string, n)
			for i := range ids {
				ids[i] = fmt.Sprint("client-", i)
				tb.Get(ids[i], []Request{{Resource: "r", Wants: float64(i%100 + 1)}}, nil)
			}
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				out := make([]Lease, 0, 1)
				req := make([]Request, 1)
				r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
				for pb.Next() {
					k := r.IntN(n)
					req[0] = Request{Resource: "r", Wants: float64(r.IntN(100) + 1)}
					out, _ = tb.Get(ids[k], req, out)
				}
			})
		})
	}
}

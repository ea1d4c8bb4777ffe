package topk

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"testing"
)

// Heavy-hitter accuracy against exact counts on a Zipf workload (issue 22,
// "Measure"): a stream of Zipf-distributed draws over a million keys is
// fed to a summary and to an exact map; the summary's top 100 is compared
// with the true top 100. docs/BENCHMARKS.md has the figures and the
// command (BenchmarkZipfRecall).

// zipfKeys is the key space of the workload: a million keys.
const zipfKeys = 1_000_000

// zipfResult is one run's accuracy.
type zipfResult struct {
	recall   float64 // share of the true top 100 among the summary's top 100 by Count (as Top ranks)
	recallLB float64 // the same with the summary's keys ranked by Count-Error, their guaranteed count
	recall10 float64 // share of the true top 10 among the summary's top 10 by Count
	// meanErr and maxErr are the overstatement (Count - true) / true of the
	// reported keys that are in the true top 100
	meanErr, maxErr float64
	boundsOK        bool   // every kept count within [true, true+Error]
	truthTail       uint64 // the true count of the 100th key
}

// keyNames holds the names of the key space, made once, when first asked.
var keyNames = sync.OnceValue(func() []string {
	k := make([]string, zipfKeys)
	for i := range k {
		// a rank is not a key's name: the names are shuffled, so key
		// order (Top's tie-break) says nothing of weight
		k[i] = "user=" + strconv.Itoa(int((uint64(i)*2654435761)%zipfKeys))
	}
	return k
})

// zipfRun feeds stream draws of a Zipf(s) distribution over zipfKeys keys
// (seeded) to a summary of the capacity and to exact counts, and compares
// their top 100.
func zipfRun(seed uint64, s float64, stream, capacity int) zipfResult {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	z := rand.NewZipf(r, s, 1, zipfKeys-1)
	sum := New(capacity)
	exact := make(map[string]uint64, 1<<16)
	names := keyNames()
	for range stream {
		k := names[z.Uint64()]
		sum.Add(k, 1)
		exact[k]++
	}
	return compareTop(sum.Top(0), exact)
}

// compareTop compares a summary's kept entries with the exact counts:
// recall of the true top 100 (the keys whose count reaches the 100th's,
// ties included, counted at most 100) by the summary's top 100 ranked by
// Count and ranked by Count-Error, and the overstatement of the counts of
// the true heavy hitters reported.
func compareTop(kept []Entry[struct{}], exact map[string]uint64) zipfResult {
	counts := make([]uint64, 0, len(exact))
	for _, c := range exact {
		counts = append(counts, c)
	}
	slices.SortFunc(counts, cmpDesc)
	tail, tail10 := counts[min(99, len(counts)-1)], counts[min(9, len(counts)-1)]
	res := zipfResult{boundsOK: true, truthTail: tail}
	for _, e := range kept[:min(10, len(kept))] {
		if exact[e.Key] >= tail10 {
			res.recall10 += 0.1
		}
	}
	for _, e := range kept {
		if t := exact[e.Key]; e.Count < t || e.Count-t > e.Error {
			res.boundsOK = false
		}
	}
	recall := func(top []Entry[struct{}]) (float64, []Entry[struct{}]) {
		var hits []Entry[struct{}]
		for _, e := range top[:min(100, len(top))] {
			if exact[e.Key] >= tail {
				hits = append(hits, e)
			}
		}
		return float64(min(len(hits), 100)) / 100, hits
	}
	var hits []Entry[struct{}]
	res.recall, hits = recall(kept) // kept is in Top's order
	for _, e := range hits {
		t := exact[e.Key]
		rel := float64(e.Count-t) / float64(t)
		res.meanErr += rel
		res.maxErr = max(res.maxErr, rel)
	}
	if len(hits) > 0 {
		res.meanErr /= float64(len(hits))
	}
	byLB := slices.Clone(kept)
	slices.SortStableFunc(byLB, func(a, b Entry[struct{}]) int { return cmpDesc(a.Count-a.Error, b.Count-b.Error) })
	res.recallLB, _ = recall(byLB)
	return res
}

func cmpDesc(a, b uint64) int {
	switch {
	case a > b:
		return -1
	case a < b:
		return 1
	}
	return 0
}

// BenchmarkZipfRecall reports the recall of the true top 100 and the
// overstatement of the counts, for several exponents and capacities:
// LimitedSlots of the service's top limited keys is 1,024 (256 before
// these figures), detailed_metric's summary 1,000 (400 before). Run once (-benchtime 1x): each iteration is a whole stream.
//
//	go test -run '^$' -bench ZipfRecall -benchtime 1x ./internal/topk/
func BenchmarkZipfRecall(b *testing.B) {
	const stream = 10_000_000
	for _, s := range []float64{1.01, 1.1, 1.5} {
		for _, capacity := range []int{256, 400, 1024, 2048, 4096} {
			b.Run(fmt.Sprintf("s=%v/cap=%d", s, capacity), func(b *testing.B) {
				var res zipfResult
				for i := 0; b.Loop(); i++ {
					res = zipfRun(uint64(i+1), s, stream, capacity)
				}
				b.ReportMetric(res.recall*100, "recall%")
				b.ReportMetric(res.recallLB*100, "recall-by-lower-bound%")
				b.ReportMetric(res.recall10*100, "recall@10%")
				b.ReportMetric(res.meanErr*100, "mean-overcount%")
				b.ReportMetric(res.maxErr*100, "max-overcount%")
				b.ReportMetric(float64(res.truthTail), "100th-true-count")
				if !res.boundsOK {
					b.Errorf("a count outside [true, true+Error]")
				}
			})
		}
	}
}

// The recall of the true top 100 at the service's capacities (256: the
// top limited keys; 400: detailed_metric) and at the 1,024 proposed, on a
// fixed seed (deterministic: the same stream each run), stays at or above
// what was measured (docs/BENCHMARKS.md), and the true top 10 is always
// found: a change to the summary that loses heavy hitters, or inflates
// their counts, fails here. The stream is 1,000,000 draws over a million
// keys; the floors sit a little under the figures measured (in brackets),
// in case a Go release changes math/rand/v2's Zipf.
func TestZipfRecallFloor(t *testing.T) {
	for _, c := range []struct {
		s         float64
		capacity  int
		minRecall float64 // of the true top 100
		maxMean   float64 // mean overstatement of the true top 100's counts
	}{
		{1.1, 256, 0.50, 0.30},   // [0.52, 0.2764]
		{1.1, 400, 0.70, 0.10},   // [0.72, 0.0980]
		{1.5, 256, 0.93, 0.015},  // [0.95, 0.0128]
		{1.01, 1024, 0.98, 0.01}, // [1.00, ...]
		{1.1, 1024, 0.98, 0.01},  // [1.00, ...]
	} {
		res := zipfRun(42, c.s, 1_000_000, c.capacity)
		t.Logf("s=%v capacity=%d: recall %.2f (by lower bound %.2f; of the top 10 %.1f), overcount of the true top 100 reported: mean %.4f, max %.4f", c.s, c.capacity, res.recall, res.recallLB, res.recall10, res.meanErr, res.maxErr)
		if !res.boundsOK {
			t.Errorf("s=%v capacity=%d: a count outside [true, true+Error]", c.s, c.capacity)
		}
		if res.recall < c.minRecall || res.recall10 < 0.99 {
			t.Errorf("s=%v capacity=%d: recall of the true top 100 %.2f (floor %.2f), of the top 10 %.1f (floor 1)", c.s, c.capacity, res.recall, c.minRecall, res.recall10)
		}
		if res.meanErr > c.maxMean {
			t.Errorf("s=%v capacity=%d: mean overcount %.4f, above the %.4f allowed", c.s, c.capacity, res.meanErr, c.maxMean)
		}
	}
}

// BenchmarkZipfAdd is the cost of one Add on the Zipf(1.1) stream at the
// service's capacity and at larger ones (the heap is O(log c)).
//
//	go test -run '^$' -bench ZipfAdd ./internal/topk/
func BenchmarkZipfAdd(b *testing.B) {
	r := rand.New(rand.NewPCG(7, 7))
	z := rand.NewZipf(r, 1.1, 1, zipfKeys-1)
	names := keyNames()
	draws := make([]string, 1<<20)
	for i := range draws {
		draws[i] = names[z.Uint64()]
	}
	for _, capacity := range []int{256, 400, 1024, 4096} {
		b.Run(fmt.Sprintf("cap=%d", capacity), func(b *testing.B) {
			s := New(capacity)
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				s.Add(draws[i&(len(draws)-1)], 1)
			}
		})
	}
}

package lease

import (
	"cmp"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

func near(a, b float64) bool { return math.Abs(a-b) < 0.005 }

// Doorman's worked example: capacity 120, wants 1000, 50 and 10.
func TestDoormanWorkedExample(t *testing.T) {
	wants := []float64{1000, 50, 10}
	for _, c := range []struct {
		alg  Algorithm
		want []float64
	}{
		{FairShare, []float64{60, 50, 10}},
		{ProportionalShare, []float64{69.69, 40.31, 10}},
		{None, []float64{1000, 50, 10}},
		{Static, []float64{30, 30, 10}},
	} {
		got := Share(c.alg, 120, 30, wants)
		for i := range got {
			if !near(got[i], c.want[i]) {
				t.Errorf("%s: got %.2f, want %.2f", c.alg, got, c.want)
				break
			}
		}
	}
}

// Fair share redistributes leftovers until none remain: every client gets
// min(wants, level), the sum is the capacity when demand exceeds it.
func TestFairShareRedistributesUntilNoneRemain(t *testing.T) {
	wants := []float64{1, 2, 3, 10, 20, 100, 100}
	got := Share(FairShare, 100, 0, wants)
	want := []float64{1, 2, 3, 10, 20, 32, 32}
	var sum float64
	for i := range got {
		sum += got[i]
		if !near(got[i], want[i]) {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
	if !near(sum, 100) {
		t.Fatalf("sum %v, want 100", sum)
	}
	// Under capacity: everyone gets its wants.
	got = Share(FairShare, 1000, 0, wants)
	for i := range got {
		if got[i] != wants[i] {
			t.Fatalf("under capacity: got %v, want %v", got, wants)
		}
	}
}

// Priority bands: the higher band is served first, the lower ones share
// what is left, and a band with nothing left gets 0.
func TestPriorityBands(t *testing.T) {
	wants := []float64{80, 80, 50, 50, 50}
	prios := []int64{10, 10, 5, 5, 1}
	for _, c := range []struct {
		alg  Algorithm
		want []float64
	}{
		{FairShare, []float64{60, 60, 0, 0, 0}},         // 120 < 160: band 10 takes all
		{ProportionalShare, []float64{60, 60, 0, 0, 0}}, // idem
	} {
		got := ShareBands(c.alg, 120, 0, wants, prios)
		for i := range got {
			if !near(got[i], c.want[i]) {
				t.Fatalf("%s: got %v, want %v", c.alg, got, c.want)
			}
		}
	}
	got := ShareBands(FairShare, 200, 0, wants, prios)
	want := []float64{80, 80, 20, 20, 0}
	for i := range got {
		if !near(got[i], want[i]) {
			t.Fatalf("fair 200: got %v, want %v", got, want)
		}
	}
	got = ShareBands(FairShare, 300, 0, wants, prios)
	want = []float64{80, 80, 50, 50, 40}
	for i := range got {
		if !near(got[i], want[i]) {
			t.Fatalf("fair 300: got %v, want %v", got, want)
		}
	}
	// none: the higher band takes what it wants first; a band that does not
	// fit leaves nothing to the lower ones.
	got = ShareBands(None, 200, 0, wants, prios)
	want = []float64{80, 80, 50, 50, 0}
	for i := range got {
		if !near(got[i], want[i]) {
			t.Fatalf("none 200: got %v, want %v", got, want)
		}
	}
}

// The sum of shares never exceeds the capacity, for any algorithm, when
// demand exceeds it (none and static excepted: their grant rule caps them).
func TestSharesSumWithinCapacity(t *testing.T) {
	wants := make([]float64, 200)
	prios := make([]int64, 200)
	for i := range wants {
		wants[i] = float64((i*7919)%97 + 1)
		prios[i] = int64(i % 3)
	}
	for _, alg := range []Algorithm{FairShare, ProportionalShare} {
		for _, capa := range []float64{0, 1, 100, 1000, 5000, 1e6} {
			var sum float64
			for _, s := range ShareBands(alg, capa, 0, wants, prios) {
				if s < 0 {
					t.Fatalf("%s %v: negative share %v", alg, capa, s)
				}
				sum += s
			}
			if sum > capa*(1+1e-12)+1e-9 {
				t.Fatalf("%s capacity %v: shares sum to %v", alg, capa, sum)
			}
		}
	}
}

// refLevel is max-min fairness the textbook way: sort by wants per client,
// satisfy the smallest while they fit.
func refLevel(left float64, ps []part) float64 {
	ps = append([]part(nil), ps...)
	slices.SortFunc(ps, func(a, b part) int { return cmp.Compare(a.wants/a.weight, b.wants/b.weight) })
	var weight float64
	for _, p := range ps {
		weight += p.weight
	}
	for _, p := range ps {
		if p.wants/p.weight > left/weight {
			break
		}
		left -= p.wants
		weight -= p.weight
	}
	if weight <= 0 {
		return math.Inf(1)
	}
	return left / weight
}

// waterLevel (selection, expected O(n)) agrees with the sorted reference
// on random inputs with ties, weights and every degree of demand.
func TestWaterLevelMatchesSortedReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	for trial := 0; trial < 3000; trial++ {
		n := 1 + rng.IntN(60)
		ps := make([]part, n)
		var weight float64
		for i := range ps {
			ps[i] = part{wants: float64(rng.IntN(8)) * float64(1+rng.IntN(3)), weight: float64(1 + rng.IntN(3)*rng.IntN(2))}
			weight += ps[i].weight
		}
		left := float64(rng.IntN(200))
		want := refLevel(left, ps)
		got := waterLevel(left, weight, append([]part(nil), ps...))
		if math.IsInf(want, 1) != math.IsInf(got, 1) || !math.IsInf(want, 1) && math.Abs(got-want) > 1e-9*max(1, want) {
			t.Fatalf("trial %d: level %v, the reference %v (left %v, parts %v)", trial, got, want, left, ps)
		}
	}
}

package lease

import (
	"math"
	"slices"
)

// A part is one share of an entry's demand: a client's wants at its
// priority, weighing one client; or one priority band of an intermediate
// server, weighing as many clients as the band counts.
type part struct {
	prio   int64
	wants  float64
	weight float64 // clients, >= 1
	key    float64 // wants per client, for waterLevel
}

// bandPlan is how one priority band is served, computed over all its
// parts by plan: the target of a part follows from it in O(1).
type bandPlan struct {
	prio  int64
	full  bool    // every part gets its wants
	zero  bool    // nothing is left for the band
	level float64 // fair share: the water level per client
	equal float64 // proportional share: the equal share per client
	extra float64 // proportional share: the under-share clients' leftover
	exces float64 // proportional share: the over-share clients' total excess
}

// plan computes the band plans of algorithm alg over parts for capacity
// capa (in units), highest priority first. parts is sorted in place.
func plan(alg Algorithm, static float64, capa float64, parts []part, dst []bandPlan) []bandPlan {
	dst = dst[:0]
	if !oneBand(parts) {
		sortByBand(parts)
	}
	left := capa
	for i := 0; i < len(parts); {
		j := i + 1
		for j < len(parts) && parts[j].prio == parts[i].prio {
			j++
		}
		bp, used := planBand(alg, static, left, parts[i:j])
		dst = append(dst, bp)
		left = math.Max(0, left-used)
		i = j
	}
	return dst
}

func oneBand(parts []part) bool {
	for i := 1; i < len(parts); i++ {
		if parts[i].prio != parts[0].prio {
			return false
		}
	}
	return true
}

// sortByBand orders parts by priority, highest first.
func sortByBand(parts []part) {
	slices.SortFunc(parts, func(a, b part) int {
		switch {
		case a.prio > b.prio:
			return -1
		case a.prio < b.prio:
			return 1
		}
		return 0
	})
}

// planBand plans one band (its parts in any order) with left
// capacity, returning the plan and the capacity it takes.
func planBand(alg Algorithm, static float64, left float64, ps []part) (bandPlan, float64) {
	bp := bandPlan{prio: ps[0].prio}
	var wants, weight float64
	for _, p := range ps {
		wants += rawTarget(alg, static, p)
		weight += p.weight
	}
	switch {
	case left <= 0:
		bp.zero = true
		return bp, 0
	case wants <= left:
		bp.full = true
		return bp, wants
	}
	switch alg {
	case FairShare:
		bp.level = waterLevel(left, weight, ps)
	case ProportionalShare:
		bp.equal = left / weight
		for _, p := range ps {
			if eq := bp.equal * p.weight; p.wants <= eq {
				bp.extra += eq - p.wants
			} else {
				bp.exces += p.wants - eq
			}
		}
	default: // none, static: the band overflows; the grant rule serves it first come
		bp.full = true
	}
	return bp, left
}

// waterLevel is max-min fairness: the level per client such that parts
// wanting less get their wants and the others the level, leftovers
// redistributed until none remain. It selects rather than sorts (expected
// O(n)): it partitions the parts around a pivot's wants per client; if the
// level is at least the pivot's, the parts at or below it are satisfied and
// leave the reckoning, else the search goes on among those below. ps is
// reordered.
func waterLevel(left, weight float64, ps []part) float64 {
	for i := range ps {
		ps[i].key = ps[i].wants / ps[i].weight
	}
	lo, hi := 0, len(ps)
	seed := uint64(len(ps))*0x9E3779B97F4A7C15 | 1
	for lo < hi {
		seed ^= seed << 13
		seed ^= seed >> 7
		seed ^= seed << 17
		pivot := ps[lo+int(seed%uint64(hi-lo))].key
		lt, gt, lessW, lessWeight := partition3(ps, lo, hi, pivot)
		// ps[lo:lt] < pivot, ps[lt:gt] == pivot, ps[gt:hi] > pivot
		var eqW, eqWeight float64
		for _, p := range ps[lt:gt] {
			eqW += p.wants
			eqWeight += p.weight
		}
		if restW := weight - lessWeight - eqWeight; left-lessW-eqW >= pivot*restW {
			left -= lessW + eqW // the level is at least pivot: all up to it are satisfied
			weight = restW
			lo = gt
		} else {
			hi = lt // the level is below pivot: search among the smaller
		}
	}
	if weight <= 0 {
		return math.Inf(1)
	}
	return left / weight
}

// partition3 orders ps[lo:hi] around pivot (less, equal, greater),
// returning the bounds and the wants and weight of the lesser.
func partition3(ps []part, lo, hi int, pivot float64) (lt, gt int, lessW, lessWeight float64) {
	lt, i, gt := lo, lo, hi
	for i < gt {
		switch k := ps[i].key; {
		case k < pivot:
			lessW += ps[i].wants
			lessWeight += ps[i].weight
			ps[lt], ps[i] = ps[i], ps[lt]
			lt++
			i++
		case k > pivot:
			gt--
			ps[i], ps[gt] = ps[gt], ps[i]
		default:
			i++
		}
	}
	return lt, gt, lessW, lessWeight
}

// rawTarget is what a part asks for before sharing: its wants, capped at
// the per-client static capacity under "static".
func rawTarget(alg Algorithm, static float64, p part) float64 {
	if alg == Static {
		return math.Min(p.wants, static*p.weight)
	}
	return p.wants
}

// target is a part's share under the band's plan.
func (bp *bandPlan) target(alg Algorithm, static float64, p part) float64 {
	switch {
	case bp.zero:
		return 0
	case bp.full:
		return rawTarget(alg, static, p)
	case alg == FairShare:
		return math.Min(p.wants, bp.level*p.weight)
	case alg == ProportionalShare:
		eq := bp.equal * p.weight
		if p.wants <= eq || bp.exces <= 0 {
			return math.Min(p.wants, eq)
		}
		return eq + bp.extra*(p.wants-eq)/bp.exces
	}
	return rawTarget(alg, static, p)
}

// Share computes each wants' share of capacity under alg, all at one
// priority, as a Table's targets would be (StaticCapacity is static's
// per-client cap): the algorithms on their own, for tests and docs.
func Share(alg Algorithm, capacity, static float64, wants []float64) []float64 {
	return ShareBands(alg, capacity, static, wants, make([]int64, len(wants)))
}

// ShareBands is Share with a priority per client: a higher band is served
// first, the lower ones share what is left.
func ShareBands(alg Algorithm, capacity, static float64, wants []float64, prios []int64) []float64 {
	ps := make([]part, len(wants))
	for i, w := range wants {
		ps[i] = part{prio: prios[i], wants: w, weight: 1}
	}
	sorted := slices.Clone(ps)
	plans := plan(alg, static, capacity, sorted, nil)
	out := make([]float64, len(wants))
	for i, p := range ps {
		out[i] = findBand(plans, p.prio).target(alg, static, p)
	}
	return out
}

// findBand returns the plan of band prio (plans are few: a linear scan).
func findBand(plans []bandPlan, prio int64) *bandPlan {
	for i := range plans {
		if plans[i].prio == prio {
			return &plans[i]
		}
	}
	return nil
}

package lease

import (
	"math"
	"slices"
)

// This file holds an entry, one client of one resource, and the leases
// it may still hold (the newest and older ones a lost response may have
// left it on).

// A grant is a lease as the Table accounts for it.
type grant struct {
	units int64
	exp   int64 // microseconds since the epoch; the lease holds while now < exp
}

func (g grant) live(now int64) bool { return g.exp > now }

// An entry is one client of one resource.
type entry struct {
	rs      *resState
	client  string
	parts   []part
	weight  int64 // clients it stands for
	wants   float64
	cur     grant   // the newest lease granted
	olds    []grant // older leases it may still hold (a lost response): see addOld
	counted int64   // what it may hold, as counted in rs.held
	hidx    int     // index in the Table's expiry heap, -1 if none
	next    int64   // the heap key: its next lease expiry
	lidx    int     // index in rs.list
	inline  [1]part
}

// mayHold is the most the client may hold at now.
func (e *entry) mayHold(now int64) int64 {
	var u int64
	if e.cur.live(now) {
		u = e.cur.units
	}
	for _, g := range e.olds {
		if g.live(now) {
			return max(u, g.units) // the first live one is the largest
		}
	}
	return u
}

// nextExpiry is the earliest expiry after now of its leases, or 0 if all
// have expired.
func (e *entry) nextExpiry(now int64) int64 {
	var n int64
	if e.cur.live(now) {
		n = e.cur.exp
	}
	for _, g := range e.olds {
		if g.live(now) && (n == 0 || g.exp < n) {
			n = g.exp
		}
	}
	return n
}

// maxOlds bounds the older leases kept per entry; beyond it the two
// earliest are merged into one bound of both (larger capacity, later
// expiry): never less than the truth.
const maxOlds = 16

// addOld records g as a lease the client may still hold. The list is kept
// as what matters for the largest live lease at any later instant: sorted
// by expiry, capacities strictly decreasing; a lease ending no later than
// another at least as large is dropped, as are expired ones.
func (e *entry) addOld(g grant, now int64) {
	if !g.live(now) {
		return
	}
	kept := e.olds[:0]
	for _, o := range e.olds {
		if o.live(now) && !(o.units <= g.units && o.exp <= g.exp) {
			kept = append(kept, o)
		}
	}
	i := len(kept)
	for i > 0 && kept[i-1].exp > g.exp {
		i--
	}
	if i > 0 && kept[i-1].exp == g.exp && kept[i-1].units >= g.units || i < len(kept) && kept[i].units >= g.units {
		e.olds = kept // dominated by a lease kept
		return
	}
	kept = slices.Insert(kept, i, g)
	if len(kept) > maxOlds {
		kept[1] = grant{max(kept[0].units, kept[1].units), kept[1].exp}
		kept = slices.Delete(kept, 0, 1)
	}
	e.olds = kept
}

// setParts replaces the entry's demand, marking the plans dirty: callers
// skip it when the demand is unchanged.
func (e *entry) setParts(ps []part) {
	e.parts = ps
	var w int64
	var wants float64
	for _, p := range ps {
		w += int64(p.weight)
		wants += p.wants
	}
	e.rs.weight += w - e.weight
	e.rs.churn += math.Abs(wants - e.wants)
	e.weight, e.wants = w, wants
	e.rs.dirty = true
	e.rs.since++
}

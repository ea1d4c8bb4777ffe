package lease

import (
	"sort"
	"time"
)

// This file holds what the Table reports: its clients' demand for a
// parent, the capacity outstanding, and the figures of each resource.

// Demand returns, per resource, its clients' wants by priority band
// (highest first) and the lease held from the parent: what an intermediate
// server asks its parent for (Table.GetServer). Has is the newest parent
// lease, its Capacity raised to what this table's clients may still hold
// (Outstanding) when that is more: leases granted under an older, larger
// parent lease are still out, and the parent must go on counting them.
// Resources are sorted by id.
func (t *Table) Demand() []Demand {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expire(t.clock.NowMicro())
	out := make([]Demand, 0, len(t.res))
	for _, rs := range t.sorted() {
		d := Demand{Resource: rs.id}
		if rs.hasParent {
			// What this server may still have out under its parent: the
			// newest parent lease, or more while its clients still hold
			// leases granted under an older, larger one. Reporting only the
			// newest would let the parent take the older one for superseded
			// and grant it to a sibling while the clients here still use it.
			d.Has = Lease{Capacity: fromUnits(max(rs.parent.units, rs.held)), Expiry: time.UnixMicro(rs.parent.exp), Refresh: rs.conf.RefreshInterval}
		}
		bands := map[int64]*Band{}
		for _, e := range rs.list {
			for _, p := range e.parts {
				b := bands[p.prio]
				if b == nil {
					b = &Band{Priority: p.prio}
					bands[p.prio] = b
				}
				b.Clients += int64(p.weight)
				b.Wants += p.wants
			}
		}
		for _, b := range bands {
			d.Bands = append(d.Bands, *b)
		}
		sort.Slice(d.Bands, func(i, j int) bool { return d.Bands[i].Priority > d.Bands[j].Priority })
		out = append(out, d)
	}
	return out
}

func (t *Table) sorted() []*resState {
	rss := make([]*resState, 0, len(t.res))
	for _, rs := range t.res {
		rss = append(rss, rs)
	}
	sort.Slice(rss, func(i, j int) bool { return rss[i].id < rss[j].id })
	return rss
}

// Outstanding returns the capacity of resource in unexpired leases now,
// counting for each client the larger of its newest lease and any older
// one it may still hold: the sum that never exceeds the capacity.
func (t *Table) Outstanding(resource string) float64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expire(t.clock.NowMicro())
	if rs := t.res[resource]; rs != nil {
		return fromUnits(rs.held)
	}
	return 0
}

// Stats returns each resource's figures now, sorted by resource id, under
// the configuration live now (a Reload shows at once, not at the
// resource's next request). Clients counts the direct clients (an
// intermediate server is one).
func (t *Table) Stats() []Stats {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.clock.NowMicro()
	t.expire(now)
	out := make([]Stats, 0, len(t.res))
	for _, rs := range t.sorted() {
		t.state(rs.id) // a Reload applies now, not at the resource's next request
		s := Stats{Resource: rs.id, Capacity: fromUnits(t.capUnits(rs, now)), Granted: fromUnits(rs.held),
			Clients: int64(len(rs.clients)), Learning: now < rs.learnTo}
		for _, e := range rs.list {
			s.Wanted += e.wants
		}
		out = append(out, s)
	}
	return out
}

package server

import (
	"errors"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/floodgate/floodgate/internal/lease"
)

// candidate is a usage about to be granted.
type candidate struct {
	at    int         // its index in the report
	u     usage       // the usage
	b     *rlqsBucket // its bucket, nil for a new one
	entry *lease.Resource
	wants float64
}

// grant grants a report's usages (but those in skip) in one Table.Get and
// returns their actions in the report's order: an assignment per bucket
// granted, an abandon for a bucket the configuration no longer serves, one
// beyond MaxBuckets, or one the table has no room for. The stream's
// buckets change only as the actions say.
func (st *rlqsStream) grant(us []usage, skip map[string]bool, cfg *rlqsConfig, now time.Time) ([]*rlqsAction, error) {
	actions := make([]*rlqsAction, len(us))
	cands, fresh := st.candidates(us, skip, cfg, now, actions)
	leases, err := st.get(cands, now)
	if errors.Is(err, lease.ErrTooManyClients) && fresh > 0 {
		// The table is full: serve the buckets it has, abandon the new.
		kept := cands[:0]
		for _, c := range cands {
			if c.b == nil {
				actions[c.at] = abandon(c.u.id)
				st.r.metrics.abandons[abandonTableFull].Add(1)
			} else {
				kept = append(kept, c)
			}
		}
		cands = kept
		leases, err = st.get(cands, now)
	}
	if errors.Is(err, lease.ErrTooManyClients) {
		// Still full: the table forgot some of these buckets (their leases
		// expired) and has no room to take them back. Abandon them all.
		var gone []string
		for _, c := range cands {
			actions[c.at] = abandon(c.u.id)
			st.r.metrics.abandons[abandonTableFull].Add(1)
			delete(st.buckets, c.u.resource)
			gone = append(gone, c.u.resource)
		}
		st.r.table.Release(st.client, gone)
		return compact(actions), nil
	}
	if err != nil {
		return nil, status.Errorf(codes.Internal, "rlqs: granting: %v", err)
	}
	for j, c := range cands {
		actions[c.at] = st.commit(c, leases[j], cfg, now)
	}
	return compact(actions), nil
}

// candidates returns the usages to grant, and how many of them are new
// buckets, setting in actions the abandons of those not to grant: a
// bucket no configuration entry serves any more (released), or a new
// bucket beyond MaxBuckets.
func (st *rlqsStream) candidates(us []usage, skip map[string]bool, cfg *rlqsConfig, now time.Time, actions []*rlqsAction) ([]candidate, int) {
	var gone []string
	cands := make([]candidate, 0, len(us))
	fresh := 0
	for i, u := range us {
		if skip[u.resource] {
			continue
		}
		b := st.buckets[u.resource]
		entry, ok := st.entryOf(u.resource, b, cfg)
		switch {
		case !ok:
			actions[i] = abandon(u.id)
			st.r.metrics.abandons[abandonRemoved].Add(1)
			if b != nil {
				delete(st.buckets, u.resource)
				gone = append(gone, u.resource)
			}
			continue
		case b == nil && len(st.buckets)+fresh >= st.r.opts.MaxBuckets:
			actions[i] = abandon(u.id)
			st.r.metrics.abandons[abandonOverBound].Add(1)
			continue
		case b == nil:
			fresh++
		}
		cands = append(cands, candidate{at: i, u: u, b: b, entry: entry, wants: st.demand(u, b, now)})
	}
	if len(gone) > 0 {
		st.r.table.Release(st.client, gone)
	}
	return cands, fresh
}

// commit records candidate c's new lease l and returns its assignment.
func (st *rlqsStream) commit(c candidate, l lease.Lease, cfg *rlqsConfig, now time.Time) *rlqsAction {
	b := c.b
	if b == nil {
		b = &rlqsBucket{id: c.u.id, resource: c.u.resource, lastActive: now}
		st.buckets[c.u.resource] = b
	}
	if c.entry != nil {
		b.entry, b.gen, b.leaseLen = c.entry.ID, cfg.gen, leaseLength(c.entry)
	}
	b.lease, b.wants, b.lastReport = l, c.wants, now
	if c.u.count > 0 {
		b.lastActive = now
	}
	return st.assignment(b.id, b.lease, now)
}

// entryOf returns the configuration entry serving resource (nil if the
// bucket's is known current) and whether one does: not if the
// configuration has none, or if the bucket was served by another entry
// (removed or renamed since).
func (st *rlqsStream) entryOf(resource string, b *rlqsBucket, cfg *rlqsConfig) (*lease.Resource, bool) {
	if b != nil && b.gen == cfg.gen {
		return nil, true
	}
	entry := cfg.cfg.Find(resource)
	if entry == nil || b != nil && entry.ID != b.entry {
		return nil, false
	}
	return entry, true
}

// get asks the table for the candidates' leases. A bucket's lease held
// (Request.Has) is the last one sent on this stream; a bucket new to the
// stream reports what it held before as the rate its Envoy allowed (an
// Envoy that reconnects after a failover keeps enforcing the old master's
// assignment, and allowed no more than it): a new master in learning mode
// grants it back that much, no more (see the package lease's learning
// mode); outside learning mode the table ignores it.
func (st *rlqsStream) get(cands []candidate, now time.Time) ([]lease.Lease, error) {
	if len(cands) == 0 {
		return nil, nil
	}
	st.reqs = st.reqs[:0]
	for _, c := range cands {
		var has lease.Lease
		switch {
		case c.b != nil:
			has = c.b.lease
		case c.u.allowed > 0:
			elapsed := c.u.elapsed
			if elapsed <= 0 {
				elapsed = time.Second
			}
			has = lease.Lease{Capacity: min(c.u.allowed/elapsed.Seconds(), maxDemand), Expiry: now.Add(leaseLength(c.entry))}
		}
		st.reqs = append(st.reqs, lease.Request{Resource: c.u.resource, Wants: c.wants, Has: has})
	}
	out, err := st.r.table.Get(st.client, st.reqs, st.out)
	st.out = out
	return out, err
}

// sweep is the expiry pass over the stream's buckets (see RLQS.Sweep). It
// reports whether actions are pending.
func (st *rlqsStream) sweep() bool {
	now := st.r.now()
	cfg := st.r.config()
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.closed {
		return false
	}
	var gone []string
	var regrant []candidate
	for key, b := range st.buckets {
		reloaded := b.gen != cfg.gen
		entry, ok := st.entryOf(key, b, cfg)
		idle := st.r.opts.IdleAfter
		if idle <= 0 {
			idle = b.leaseLen
		}
		switch {
		case now.Sub(b.lastReport) >= b.leaseLen:
			// Envoy stopped reporting it: forget it, nothing to say.
		case !ok:
			st.pending[key] = abandon(b.id)
			st.r.metrics.abandons[abandonRemoved].Add(1)
		case now.Sub(b.lastActive) >= idle && now.Sub(b.lastReport) < idle:
			// Reported with no requests for IdleAfter (a bucket not
			// reported at all waits for the case above).
			st.pending[key] = abandon(b.id)
			st.r.metrics.abandons[abandonIdle].Add(1)
		case reloaded:
			b.entry, b.gen, b.leaseLen = entry.ID, cfg.gen, leaseLength(entry)
			regrant = append(regrant, candidate{u: usage{resource: key}, b: b, wants: b.wants})
			continue
		default:
			continue
		}
		delete(st.buckets, key)
		gone = append(gone, key)
	}
	if len(gone) > 0 {
		st.r.table.Release(st.client, gone)
	}
	if leases, err := st.get(regrant, now); err == nil {
		for j, c := range regrant {
			c.b.lease = leases[j]
			st.pending[c.b.resource] = st.assignment(c.b.id, c.b.lease, now)
		}
	}
	return len(st.pending) > 0
}

// leaseLength returns r's lease length, the default if it has none.
func leaseLength(r *lease.Resource) time.Duration {
	if r.LeaseLength > 0 {
		return r.LeaseLength
	}
	return lease.DefaultLeaseLength
}

// compact returns actions without its nils.
func compact(actions []*rlqsAction) []*rlqsAction {
	out := actions[:0]
	for _, a := range actions {
		if a != nil {
			out = append(out, a)
		}
	}
	return out
}

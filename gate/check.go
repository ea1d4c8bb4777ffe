package gate

import (
	"context"

	"github.com/floodgate/floodgate/rules"
)

// Check decides r, waiting for Delay actions, and fills v. A Verdict may
// be reused (from a sync.Pool, say): Check resets it.
func (g *Gate) Check(r *Request, v *Verdict) {
	ctx := r.ctx()
	v.Allowed, v.Deciding, v.Delayed, v.Soft, v.Err = true, nil, 0, false, nil
	v.Outcomes, v.RemoteHeaders = v.buf[:0], v.RemoteHeaders[:0]
	if len(g.limits) == 0 {
		return
	}
	host, path := hostOnly(r.host()), r.path()
	if g.index == nil {
		for _, l := range g.limits {
			g.consider(r, v, l, host, path)
		}
	} else {
		var lb [8][]int
		lists := g.index.lookup(host, path, lb[:0])
		for i := nextCandidate(lists); i >= 0; i = nextCandidate(lists) {
			g.consider(r, v, g.limits[i], host, path)
		}
	}
	if len(v.Outcomes) > 0 {
		if g.tracer != nil {
			g.decideTraced(ctx, r, v)
		} else {
			g.decideOutcomes(ctx, v)
		}
	}
}

// decideOutcomes decides v's outcomes, on the store or the remote service.
func (g *Gate) decideOutcomes(ctx context.Context, v *Verdict) {
	if g.cfg.Remote != nil {
		g.remote(ctx, v)
		if v.Err != nil {
			g.storeFailed(v, true)
		}
	} else {
		g.local(ctx, v)
	}
}

// consider adds l's outcome to v if l applies to r (whose host and path
// are host and path).
func (g *Gate) consider(r *Request, v *Verdict, l *limit, host, path string) {
	if !l.match(r, host, path) {
		return
	}
	if len(l.ExemptNets) > 0 {
		a := g.clientAddr(r)
		for _, n := range l.ExemptNets {
			if n.Contains(a) {
				return
			}
		}
	}
	if l.Policy == nil {
		g.considerEntries(r, v, l)
		return
	}
	var kb [128]byte
	key, ok := kb[:0], true
	for i := range l.parts {
		if i > 0 {
			key = append(key, '|')
		}
		if key, ok = g.value(r, &l.parts[i], key, false); !ok {
			return
		}
	}
	if l.exempt != nil && l.exempt[string(key)] {
		return
	}
	v.Outcomes = append(v.Outcomes, Outcome{Limit: l.Limit, Key: string(key), l: l, op: -1, banOp: -1, thrOp: -1})
}

// considerEntries is consider for a limit decided by descriptor entries
// (a rules file's, or a remote service's): the parts' values, as they
// are, are the entries (the decider bounds their store key), and the
// outcome's Key joins them as any limit's does.
func (g *Gate) considerEntries(r *Request, v *Verdict, l *limit) {
	var vb [128]byte
	var ends [maxKeyParts]int
	vals, ok := vb[:0], true
	for i := range l.parts {
		if vals, ok = g.value(r, &l.parts[i], vals, true); !ok {
			return
		}
		ends[i] = len(vals)
	}
	var kb [128]byte
	var kends [maxKeyParts]int
	key := kb[:0]
	for i, start := 0, 0; i < len(l.parts); i++ {
		if i > 0 {
			key = append(key, '|')
		}
		key = appendValue(key, vals[start:ends[i]])
		kends[i], start = len(key), ends[i]
	}
	if l.exempt != nil && l.exempt[string(key)] {
		return
	}
	// The entries' values: the key's own bytes where the key holds a value
	// as it is (neither escaped nor bounded), else copies.
	skey, all := string(key), ""
	ents := make([]rules.Entry, len(l.parts))
	for i, start, kstart := 0, 0, 0; i < len(l.parts); i++ {
		raw, kept := vals[start:ends[i]], key[kstart:kends[i]]
		ents[i] = rules.Entry{Key: l.parts[i].entry, Value: skey[kstart:kends[i]]}
		if string(raw) != string(kept) {
			if all == "" {
				all = string(vals)
			}
			ents[i].Value = all[start:ends[i]]
		}
		start, kstart = ends[i], kends[i]+1
	}
	v.Outcomes = append(v.Outcomes, Outcome{Limit: l.Limit, Key: skey, l: l, ents: ents, op: -1, banOp: -1, thrOp: -1})
}

// entries returns the descriptor entries of an outcome whose limit has no
// Policy (a rules file's or a remote service's): its parts' values as the
// request gave them.
func (o *Outcome) entries() []rules.Entry { return o.ents }

package redisstore

import (
	"context"

	"github.com/floodgate/floodgate"
)

// peek answers an OpPeek (Peek, PeekN, AllowN(0)) on a write-back key
// with hits of this node that Redis's count may not hold yet: it waits
// for the sync in flight, then sends the rest in a call that reads the
// count back, and answers from that count (with, conservatively, the hits
// of a sync still unanswered). ok is false when Redis's count holds every
// hit of this node: the usual peek answers.
func (w *writeBack) peek(ctx context.Context, now int64, op *floodgate.Op) (d floodgate.Decision, ok bool, err error) {
	wp := w.policy(op.Policy)
	if !wp.ok || w.closed.Load() || w.s.scriptMode.Load() {
		return d, false, nil
	}
	w.mu.Lock()
	e := w.m[lsKey{op.Policy.Name(), op.Key}]
	w.mu.Unlock()
	if e == nil || e.wp != wp {
		return d, false, nil
	}
	for waited := 0; ; waited++ {
		e.mu.Lock()
		pend, ch := e.pend, e.wait
		e.mu.Unlock()
		if pend == 0 {
			return d, false, nil
		}
		if ch == nil || waited == 2 {
			break
		}
		if err := waitFor(ctx, ch); err != nil {
			return d, true, err
		}
	}
	d, err = w.exactly(ctx, now, op, e)
	return d, true, err
}

// peekDecision is a peek of cost from the reply v of a sync (cost 0 to
// Lua), with others, hits of syncs not answered yet, added to its count.
func (e *wbEntry) peekDecision(v []int64, others, cost int64) floodgate.Decision {
	ws, prev, cur, now := v[3], v[4], v[5]+others, max(v[6], v[3])
	L := e.wp.p.Limit
	if cost > L {
		d := e.decision(false, ws, prev, cur, now, cost)
		d.Reason, d.RetryAfter = floodgate.ReasonCostTooLarge, 0
		return d
	}
	return e.decision(used(&e.wp.p, ws, prev, cur, now)+cost <= L, ws, prev, cur, now, cost)
}

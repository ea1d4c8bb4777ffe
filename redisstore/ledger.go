package redisstore

import (
	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/algo"
	"github.com/floodgate/floodgate/storekit"
)

// A key's ledger: what rules failing to local admitted on it, to charge
// back to Redis (localsync.go).

// A ledgerShape is the ledger's layout for a policy: its local rules at
// their full limits, each with its words, up to ledgerWords words in
// all; the rules beyond (a sliding log of a large limit takes a word a
// request) are booked in flat instead, which never decays.
type ledgerShape struct {
	ps    []algo.Params
	words int
	flat  bool
}

// ledgerWords bounds the words of one key's ledger.
const ledgerWords = 64

type ledgerKey struct{}

func shapeOf(p *floodgate.Policy, pl *plan) *ledgerShape {
	return storekit.Attached(p, ledgerKey{}, func() any {
		all := compiledOf(p).Params
		sh := &ledgerShape{}
		for _, i := range pl.index {
			q := all[i]
			if sh.words+q.Width > ledgerWords {
				sh.flat = true
				continue
			}
			q.Off = sh.words
			sh.words += q.Width
			sh.ps = append(sh.ps, q)
		}
		return sh
	}).(*ledgerShape)
}

// book records cost admitted locally at now under p.
func (e *lsEntry) book(p *floodgate.Policy, pl *plan, now, cost int64) {
	if e.pol != p {
		// a new policy (or the first booking): carry what the old one holds
		carry := int64(0)
		if e.owed {
			carry = e.used(now)
		}
		e.pol, e.lg = p, shapeOf(p, pl)
		e.ledger = make([]int64, e.lg.words)
		e.flat, e.owed = 0, false
		if carry > 0 {
			e.book(p, pl, now, carry)
		}
	}
	for i := range e.lg.ps {
		q := &e.lg.ps[i]
		s := e.ledger[q.Off : q.Off+q.Width]
		n := algo.Advance(q, s, now)
		algo.Commit(q, s, n, min(cost, q.MaxCeiling()))
		algo.Clamp(q, s, n)
	}
	if e.lg.flat {
		e.flat += cost
	}
	e.owed = true
}

// unbook gives back cost (a local refund), newest first.
func (e *lsEntry) unbook(now, cost int64) {
	if !e.owed || cost <= 0 {
		return
	}
	for i := range e.lg.ps {
		q := &e.lg.ps[i]
		s := e.ledger[q.Off : q.Off+q.Width]
		algo.Refund(q, s, algo.Advance(q, s, now), cost)
	}
	e.flat -= min(e.flat, cost)
}

// used is the weight the ledger still holds at now: the most any of its
// rules counts.
func (e *lsEntry) used(now int64) int64 {
	if !e.owed {
		return 0
	}
	u := e.flat
	for i := range e.lg.ps {
		q := &e.lg.ps[i]
		s := e.ledger[q.Off : q.Off+q.Width]
		u = max(u, algo.Used(q, s, algo.Advance(q, s, now)))
	}
	return u
}

func (e *lsEntry) clearLedger() {
	clear(e.ledger)
	e.flat, e.owed = 0, false
}

// Package storekit is what a floodgate.Store implementation needs of a
// Policy: the size of a key's state, the decision on it, how consumed it
// is, and how to carry it to another version of the policy.
//
// A store keeps Width(p) int64 words per key (all zero for a key never
// seen) and calls ApplyTo on them under whatever makes the key's update
// atomic. Users of the library need none of it; package storetest is the
// suite a store must pass.
package storekit

import (
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/algo"
	"github.com/floodgate/floodgate/internal/compiled"
)

var of = compiled.Of.(func(*floodgate.Policy) *compiled.Policy)

// Width returns the number of int64 state words a key of p needs.
func Width(p *floodgate.Policy) int { return of(p).Width }

// Version orders versions of policies: a later NewPolicy or WithLimit
// returns a larger version.
func Version(p *floodgate.Policy) uint64 { return of(p).Version }

// Attached returns the value kept with p under key (a store's own, say its
// prepared call arguments for p), made by build the first time it is
// asked for. The value lives as long as p does, so a store keeps nothing
// per policy in a map of its own, which every reload of the rules would
// grow. build may run more than once for one key when callers race; one
// of its values is kept.
func Attached(p *floodgate.Policy, key any, build func() any) any {
	c := of(p)
	if v, ok := c.Attached.Load(key); ok {
		return v
	}
	v, _ := c.Attached.LoadOrStore(key, build())
	return v
}

// Apply performs op on one key's state under p (op.Policy is not read:
// a store may decide under a newer version of it) at now, microseconds
// since the epoch, and returns the decision.
func Apply(p *floodgate.Policy, state []int64, now int64, op floodgate.Op) floodgate.Decision {
	var d floodgate.Decision
	ApplyTo(p, state, now, &op, &d)
	return d
}

// ApplyTo is Apply writing the decision into *d, for the hot path.
func ApplyTo(p *floodgate.Policy, state []int64, now int64, op *floodgate.Op, d *floodgate.Decision) {
	c := of(p)
	var maxDelay int64
	if op.Kind == floodgate.OpReserve {
		maxDelay = op.MaxDelay.Microseconds()
	}
	var r algo.Result
	algo.ApplyTo(c.Params, state[:c.Width], now, algo.Op(op.Kind), op.Cost, maxDelay, op.Spare, &r)
	d.Allowed = r.Allowed
	d.Limit = r.Limit
	d.Remaining = r.Remaining
	d.ResetAfter = time.Duration(r.ResetAfter) * time.Microsecond
	d.RetryAfter = time.Duration(r.RetryAfter) * time.Microsecond
	d.Delay = time.Duration(r.Delay) * time.Microsecond
	d.Rule = c.Names[r.Rule]
	d.Excess = r.Excess
	d.Degraded = false
	switch {
	case r.TooLarge:
		d.Reason = floodgate.ReasonCostTooLarge
	case !r.Allowed:
		d.Reason = floodgate.ReasonLimited
	default:
		d.Reason = floodgate.ReasonNone
	}
}

// Consumption reports how much of its capacity a key's most constrained
// rule has used, in thousandths, advancing the state to now; 0 means the
// state is fresh and may be dropped without changing any decision.
func Consumption(p *floodgate.Policy, state []int64, now int64) int64 {
	c := of(p)
	return algo.Consumption(c.Params, state[:c.Width], now)
}

// Valid reports whether state is one p's rules can be decided on. Every
// state the engine writes is; a store reading states from outside (a
// snapshot file) checks them, since a damaged one could index out of range.
func Valid(p *floodgate.Policy, state []int64) bool {
	c := of(p)
	if len(state) < c.Width {
		return false
	}
	for i := range c.Params {
		q := &c.Params[i]
		if !algo.Valid(q, state[q.Off:q.Off+q.Width]) {
			return false
		}
	}
	return true
}

// Migrate converts a key's state old under policy from (another version
// of p) into state under p, rule by rule matched by name, keeping what each
// rule consumed in requests, clamped to the new capacity. Rules new to p
// start fresh.
func Migrate(p, from *floodgate.Policy, old, state []int64, now int64) {
	c, f := of(p), of(from)
	clear(state[:c.Width])
	for i := range c.Params {
		for j := range f.Params {
			if f.Names[j] == c.Names[i] {
				np, op := &c.Params[i], &f.Params[j]
				algo.Convert(op, old[op.Off:op.Off+op.Width], np, state[np.Off:np.Off+np.Width], now)
			}
		}
	}
}

// MigrateOnto is Migrate onto a key's state under p that may already hold
// requests (decided under p while the state was being carried to it): what
// state had consumed is added, rule by rule, to what is carried from old,
// clamped to each rule's capacity. A fresh state makes it Migrate.
func MigrateOnto(p, from *floodgate.Policy, old, state []int64, now int64) {
	c := of(p)
	carried := make([]int64, c.Width)
	Migrate(p, from, old, carried, now)
	for i := range c.Params {
		np := &c.Params[i]
		had, dst := state[np.Off:np.Off+np.Width], carried[np.Off:np.Off+np.Width]
		used := algo.Used(np, had, algo.Advance(np, had, now))
		if used == 0 {
			continue
		}
		t := algo.Advance(np, dst, now)
		if np.Bucket() { // levels add exactly, fractions of a request too
			dst[0] = min(dst[0]+had[0], np.MaxCeiling()*np.Unit)
			continue
		}
		if room := np.MaxCeiling() - algo.Used(np, dst, t); room > 0 {
			algo.Commit(np, dst, t, min(used, room))
		}
	}
	copy(state[:c.Width], carried)
}

// SameLayout reports whether keys of p and q have interchangeable state:
// the same rules with the same parameters.
func SameLayout(p, q *floodgate.Policy) bool {
	c, d := of(p), of(q)
	if len(c.Params) != len(d.Params) {
		return false
	}
	for i := range c.Params {
		a, b := c.Params[i], d.Params[i]
		if c.Names[i] != d.Names[i] || a.Kind != b.Kind || a.Limit != b.Limit || a.Period != b.Period ||
			a.Burst != b.Burst || a.Gran != b.Gran || a.Cal != b.Cal || a.Loc != b.Loc || a.WeekDay0 != b.WeekDay0 ||
			a.Soft != b.Soft || a.Elastic != b.Elastic || a.CountRejected != b.CountRejected {
			return false
		}
	}
	return true
}

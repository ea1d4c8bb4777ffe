package refmodel

import (
	"fmt"
	"math/big"
)

// Op is an operation on a key.
type Op int

// The operations.
const (
	Allow   Op = iota // admit and consume if every rule admits, else consume nothing
	Peek              // report whether it would be admitted; consume nothing
	Reserve           // admit now against capacity freeing within maxDelay
	Charge            // record the cost whether or not it fits, clamped
	Refund            // give back the cost, newest consumption first
	Reset             // forget the key
)

func (o Op) String() string {
	return [...]string{"allow", "peek", "reserve", "charge", "refund", "reset"}[o]
}

// Reason says why a request was denied.
type Reason int

// Reasons.
const (
	ReasonNone Reason = iota
	ReasonLimited
	ReasonCostTooLarge
)

// Decision is the model's answer; times are microseconds.
type Decision struct {
	Allowed    bool
	Limit      int64
	Remaining  int64
	ResetAfter int64
	RetryAfter int64
	Delay      int64
	Rule       int // index of the deciding rule
	Reason     Reason
	Excess     bool
}

func (d Decision) String() string {
	return fmt.Sprintf("{allowed=%v limit=%d remaining=%d reset=%dus retry=%dus delay=%dus rule=%d reason=%d excess=%v}",
		d.Allowed, d.Limit, d.Remaining, d.ResetAfter, d.RetryAfter, d.Delay, d.Rule, d.Reason, d.Excess)
}

// rule is one rule's model for one key. Times passed in are never before the
// time enter last returned; usage is asked about t >= that time and assumes
// no request arrives in between.
type rule interface {
	// enter brings the rule to a clock reading and returns the time the
	// rule works at (the reading, unless it goes back before what the
	// rule's state has already seen).
	enter(now int64) int64
	usage(t int64) *big.Rat // what the rule counts at t, in requests
	record(t, c int64)      // consume c at t
	charge(t, c, most int64)
	refund(t, c int64)
	reset()
}

// Key is the state of one key under a policy: one model per rule.
type Key struct {
	specs []Spec
	rules []rule
}

// NewKey returns a fresh key of a policy of specs (rule i is specs[i]).
func NewKey(specs []Spec) *Key {
	k := &Key{specs: append([]Spec(nil), specs...)}
	for i := range k.specs {
		s := &k.specs[i]
		var r rule
		switch s.Kind {
		case TokenBucket, LeakyMeter, GCRA:
			r = newTokenBucket(s)
		case LeakyShaper:
			r = newShaper(s)
		case TokenBucketInterval:
			r = newIntervalBucket(s)
		case FixedWindow:
			r = newFixedWindow(s)
		case SlidingLog:
			r = &slidingLog{s: s}
		case SlidingWindow:
			r = &slidingWindow{s: s}
		case SlidingSubwindow:
			r = &subwindow{s: s}
		default:
			panic("refmodel: unknown kind")
		}
		k.rules = append(k.rules, r)
	}
	return k
}

// admits reports whether rule i admits a request of cost c at t under
// ceiling (without waiting): its usage plus c fits under the ceiling, and a
// shaper's queue must be empty for a request that costs anything.
func (k *Key) admits(i int, t, c, ceiling int64) bool {
	u := k.rules[i].usage(t)
	if k.specs[i].Kind == LeakyShaper && c > 0 && u.Sign() != 0 {
		return false
	}
	return new(big.Rat).Add(u, rat(c)).Cmp(rat(ceiling)) <= 0
}

func (k *Key) fresh(i int) func(int64) bool {
	return func(t int64) bool { return k.rules[i].usage(t).Sign() == 0 }
}

// Do performs op on the key at now and returns the decision. maxDelay bounds
// a reservation's delay; bit i of spare is rule i's elastic signal.
func (k *Key) Do(now int64, op Op, cost, maxDelay int64, spare uint64) Decision {
	n := len(k.rules)
	eff := make([]int64, n)
	ceil := make([]int64, n)
	for i, r := range k.rules {
		eff[i] = r.enter(now)
		ceil[i] = k.specs[i].Ceiling(spare&(1<<i) != 0)
	}
	d := Decision{Allowed: true}
	tooLarge := -1

	switch op {
	case Reset:
		for _, r := range k.rules {
			r.reset()
		}
	case Refund:
		for i, r := range k.rules {
			r.refund(eff[i], cost)
		}
	default:
		for i := range n {
			if cost > ceil[i] {
				tooLarge, d.Allowed = i, false
				break
			}
		}
		var delay int64
		if tooLarge < 0 {
			for i := range n {
				var ok bool
				var wait int64
				switch {
				case op == Reserve && k.specs[i].Kind == LeakyShaper:
					// Room in the queue; the request leaves once the queue
					// ahead of it has drained.
					ok = new(big.Rat).Add(k.rules[i].usage(eff[i]), rat(cost)).Cmp(rat(ceil[i])) <= 0
					wait = first(eff[i], k.fresh(i)) - eff[i]
				case k.admits(i, eff[i], cost, ceil[i]):
					ok = true
				case op == Reserve && k.specs[i].reservable():
					ok = true
					wait = first(eff[i], func(t int64) bool { return k.admits(i, t, cost, ceil[i]) }) - eff[i]
				}
				d.Allowed = d.Allowed && ok
				delay = max(delay, wait)
			}
			if op == Reserve && delay > maxDelay {
				d.Allowed = false
			}
		}
		switch {
		case op == Charge:
			for i, r := range k.rules {
				r.charge(eff[i], cost, k.specs[i].MaxCeiling())
			}
		case (op == Allow || op == Reserve) && d.Allowed:
			for i, r := range k.rules {
				r.record(eff[i], cost)
			}
			if op == Reserve {
				d.Delay = delay
			}
		case op == Allow && tooLarge < 0:
			for i, r := range k.rules {
				if k.specs[i].CountRejected {
					r.record(eff[i], cost)
				}
			}
		}
	}

	// Report, from the state after the operation. Reset-after is a search,
	// so it is found only for the rules that need it.
	rem := make([]int64, n)
	retry := make([]int64, n)
	reset := make([]int64, n)
	resetOf := func(i int) int64 {
		if reset[i] == 0 {
			reset[i] = first(eff[i], k.fresh(i)) - eff[i] + 1 // +1: known
		}
		return reset[i] - 1
	}
	for i, r := range k.rules {
		s := &k.specs[i]
		left := new(big.Rat).Sub(rat(s.B()), r.usage(eff[i]))
		rem[i] = max(0, floorRat(left))
		if !d.Allowed && tooLarge < 0 {
			retry[i] = first(eff[i], func(t int64) bool { return k.admits(i, t, cost, ceil[i]) }) - eff[i]
		}
		// Excess: admitted while a soft or elastic rule counts more than B
		// after the operation.
		if d.Allowed && (s.SoftPercent > 0 || s.ElasticCeiling > 0) && ceilRat(r.usage(eff[i])) > s.B() {
			d.Excess = true
		}
	}
	best := 0
	switch {
	case tooLarge >= 0:
		best = tooLarge
		d.Reason = ReasonCostTooLarge
	case !d.Allowed:
		d.Reason = ReasonLimited
		for i := range n {
			if retry[i] > retry[best] || (retry[i] == retry[best] && rem[i] < rem[best]) {
				best = i
			}
		}
		d.RetryAfter = retry[best]
	default:
		for i := range n {
			if rem[i] < rem[best] || (rem[i] == rem[best] && resetOf(i) > resetOf(best)) {
				best = i
			}
		}
	}
	d.Rule = best
	d.Limit = k.specs[best].Limit
	d.Remaining, d.ResetAfter = rem[best], resetOf(best)
	return d
}

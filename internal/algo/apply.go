package algo

// Op is what a request asks of a key.
type Op uint8

// The operations.
const (
	OpAllow   Op = iota // admit and consume if every rule fits, else consume nothing
	OpPeek              // report whether it would be admitted; consume nothing
	OpReserve           // admit now against capacity that frees within MaxDelay
	OpCharge            // record cost whether or not it fits (clamped at capacity)
	OpRefund            // give back cost, newest consumption first
	OpReset             // forget the key
)

// MaxRules is the most rules one policy may hold.
const MaxRules = 16

// Result is the decision for one key over all rules of its policy. Times
// are microseconds.
type Result struct {
	Allowed  bool
	TooLarge bool // the cost exceeds what Rule can ever admit
	Excess   bool // admitted beyond a rule's limit (soft or elastic mode)
	Rule     int  // index of the deciding rule

	Limit      int64
	Remaining  int64
	ResetAfter int64
	RetryAfter int64
	Delay      int64 // a reservation's wait before the request may proceed
}

// Apply performs op for one key under every rule of a policy, all or
// nothing: st holds the rules' state words back to back (rule i at
// ps[i].Off), spare has bit i set when rule i's elastic signal reports
// spare capacity. A request is admitted only if every rule admits it, and
// a denied request consumes nothing (except from sliding-log rules that
// count rejected requests, as they are asked to).
//
// The deciding rule is, for a denial, the denying rule with the longest
// retry-after; for an admission, the rule with the fewest remaining.
func Apply(ps []Params, st []int64, now int64, op Op, cost, maxDelay int64, spare uint64) Result {
	var r Result
	ApplyTo(ps, st, now, op, cost, maxDelay, spare, &r)
	return r
}

// ApplyTo is Apply writing its result into *out, which saves copying the
// result on the hot path.
func ApplyTo(ps []Params, st []int64, now int64, op Op, cost, maxDelay int64, spare uint64, out *Result) {
	if len(ps) == 1 {
		apply1(&ps[0], st, now, op, cost, maxDelay, spare&1 != 0, out)
		return
	}
	var k keyRules
	k.advance(ps, st, now, spare)
	*out = Result{Allowed: true}
	switch op {
	case OpReset:
		clear(st)
	case OpRefund:
		for i := range k.ps {
			Refund(&k.ps[i], k.state(i), k.nows[i], cost)
		}
	case OpPeek, OpCharge, OpAllow:
		k.check(op, cost, out)
	case OpReserve:
		k.reserve(cost, maxDelay, out)
	}
	k.report(cost, out)
}

// keyRules is one key's rules during a decision: each rule's time (after
// Advance) and ceiling.
type keyRules struct {
	ps    []Params
	st    []int64
	nows  [MaxRules]int64
	ceils [MaxRules]int64
}

// state returns rule i's state words.
func (k *keyRules) state(i int) []int64 {
	p := &k.ps[i]
	return k.st[p.Off : p.Off+p.Width]
}

// advance brings every rule to now and sets its ceiling.
func (k *keyRules) advance(ps []Params, st []int64, now int64, spare uint64) {
	k.ps, k.st = ps, st
	for i := range ps {
		k.nows[i] = Advance(&ps[i], k.state(i), now)
		k.ceils[i] = ps[i].Ceiling(spare&(1<<i) != 0)
	}
}

// check decides a peek, a charge or an allow: admitted if every rule
// fits, then consumed all or nothing (a charge always; on a denial, only
// sliding logs that count rejections).
func (k *keyRules) check(op Op, cost int64, r *Result) {
	for i := range k.ps {
		if cost > k.ceils[i] && !r.TooLarge {
			// Never admissible. A charge is still recorded (clamped)
			// but reports the rule as too large, not a wait.
			r.Allowed, r.TooLarge, r.Rule = false, true, i
			if op != OpCharge {
				break
			}
		}
		fit := cost <= k.ceils[i] && Fits(&k.ps[i], k.state(i), k.nows[i], cost, k.ceils[i])
		r.Allowed = r.Allowed && fit
	}
	for i := range k.ps {
		p, s := &k.ps[i], k.state(i)
		switch {
		case op == OpCharge:
			Commit(p, s, k.nows[i], min(cost, p.MaxCeiling()))
			Clamp(p, s, k.nows[i])
		case op == OpAllow && r.Allowed, op == OpAllow && !r.TooLarge && p.CountRejected:
			Commit(p, s, k.nows[i], cost)
		}
	}
}

// reserve admits against capacity that frees within maxDelay: bucket
// rules lend it, window rules must fit now.
func (k *keyRules) reserve(cost, maxDelay int64, r *Result) {
	var longest int64
	for i := range k.ps {
		p, s := &k.ps[i], k.state(i)
		if cost > k.ceils[i] {
			r.Allowed, r.TooLarge, r.Rule = false, true, i
			break
		}
		fit, delay := true, int64(0)
		switch {
		case p.Kind == LeakyShaper:
			fit = s[0]+cost*p.Unit <= k.ceils[i]*p.Unit // room in the queue
			delay = QueueDelay(p, s)
		case Fits(p, s, k.nows[i], cost, k.ceils[i]):
		case p.Reservable():
			delay = RetryAfter(p, s, k.nows[i], cost, k.ceils[i])
		default:
			fit = false
		}
		r.Allowed = r.Allowed && fit
		longest = max(longest, delay)
	}
	if longest > maxDelay {
		r.Allowed = false
	}
	if r.Allowed {
		r.Delay = longest
		for i := range k.ps {
			Commit(&k.ps[i], k.state(i), k.nows[i], cost)
		}
	}
}

// report fills the numbers from the deciding rule: for a denial, the
// denying rule with the longest retry-after; for an admission, the rule
// with the fewest remaining.
func (k *keyRules) report(cost int64, r *Result) {
	best := ruleReport{i: -1}
	for i := range k.ps {
		p, s := &k.ps[i], k.state(i)
		c := ruleReport{i: i, rem: Remaining(p, s, k.nows[i]), reset: ResetAfter(p, s, k.nows[i])}
		if !r.Allowed && !r.TooLarge {
			c.retry = RetryAfter(p, s, k.nows[i], cost, k.ceils[i])
		}
		if r.Allowed && (p.Soft > 0 || p.Elastic > 0) && Used(p, s, k.nows[i]) > p.Burst {
			r.Excess = true
		}
		if best.i < 0 || r.prefers(c, best) {
			best = c
		}
	}
	if best.i < 0 {
		return
	}
	if !r.TooLarge {
		r.Rule = best.i
	}
	p := &k.ps[r.Rule]
	r.Limit = p.Limit
	if r.Rule == best.i {
		r.Remaining, r.ResetAfter, r.RetryAfter = best.rem, best.reset, best.retry
	} else {
		s := k.state(r.Rule)
		r.Remaining, r.ResetAfter = Remaining(p, s, k.nows[r.Rule]), ResetAfter(p, s, k.nows[r.Rule])
	}
	if r.Allowed {
		r.RetryAfter = 0
	}
}

// ruleReport is one rule's numbers after a decision.
type ruleReport struct {
	i                 int
	rem, reset, retry int64
}

// prefers reports whether rule c decides rather than rule best: the rule
// too large, else the longest wait of a denial (then the fewest
// remaining), else the fewest remaining (then the longest reset).
func (r *Result) prefers(c, best ruleReport) bool {
	switch {
	case r.TooLarge:
		return c.i == r.Rule
	case !r.Allowed:
		return c.retry > best.retry || (c.retry == best.retry && c.rem < best.rem)
	}
	return c.rem < best.rem || (c.rem == best.rem && c.reset > best.reset)
}

// Consumption returns how much of its capacity the most constrained rule
// has used at now, in thousandths; 0 means the key's state is fresh and can
// be forgotten without changing any decision.
func Consumption(ps []Params, st []int64, now int64) int64 {
	var worst int64
	for i := range ps {
		p := &ps[i]
		s := st[p.Off : p.Off+p.Width]
		t := Advance(p, s, now)
		u := Used(p, s, t)
		if u > 0 {
			worst = max(worst, 1+mulDiv(u, 999, p.Burst))
		}
	}
	return worst
}

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
	var t ruleTimes
	for i := range ps { // every rule to now, with its ceiling
		p, s := rule(ps, st, i)
		t.nows[i] = Advance(p, s, now)
		t.ceils[i] = p.Ceiling(spare&(1<<i) != 0)
	}
	*out = Result{Allowed: true}
	switch op {
	case OpReset:
		clear(st)
	case OpRefund:
		for i := range ps {
			p, s := rule(ps, st, i)
			Refund(p, s, t.nows[i], cost)
		}
	case OpPeek, OpCharge, OpAllow:
		check(ps, st, &t, op, cost, out)
	case OpReserve:
		reserve(ps, st, &t, cost, maxDelay, out)
	}
	report(ps, st, &t, cost, out)
}

// ruleTimes holds each rule's time (after Advance) and ceiling during a
// decision.
type ruleTimes struct {
	nows  [MaxRules]int64
	ceils [MaxRules]int64
}

// rule returns rule i and its state words.
func rule(ps []Params, st []int64, i int) (*Params, []int64) {
	p := &ps[i]
	return p, st[p.Off : p.Off+p.Width]
}

// check decides a peek, a charge or an allow: admitted if every rule
// fits, then consumed all or nothing (a charge always; on a denial, only
// sliding logs that count rejections).
func check(ps []Params, st []int64, t *ruleTimes, op Op, cost int64, r *Result) {
	for i := range ps {
		if cost > t.ceils[i] && !r.TooLarge {
			// Never admissible. A charge is still recorded (clamped)
			// but reports the rule as too large, not a wait.
			r.Allowed, r.TooLarge, r.Rule = false, true, i
			if op != OpCharge {
				break
			}
		}
		p, s := rule(ps, st, i)
		fit := cost <= t.ceils[i] && Fits(p, s, t.nows[i], cost, t.ceils[i])
		r.Allowed = r.Allowed && fit
	}
	switch {
	case op == OpCharge:
		for i := range ps {
			p, s := rule(ps, st, i)
			Commit(p, s, t.nows[i], min(cost, p.MaxCeiling()))
			Clamp(p, s, t.nows[i])
		}
	case op == OpAllow && r.Allowed:
		for i := range ps {
			p, s := rule(ps, st, i)
			Commit(p, s, t.nows[i], cost)
		}
	case op == OpAllow && !r.TooLarge:
		for i := range ps {
			if p, s := rule(ps, st, i); p.CountRejected {
				Commit(p, s, t.nows[i], cost)
			}
		}
	}
}

// reserve admits against capacity that frees within maxDelay: bucket
// rules lend it, window rules must fit now.
func reserve(ps []Params, st []int64, t *ruleTimes, cost, maxDelay int64, r *Result) {
	var longest int64
	for i := range ps {
		p, s := rule(ps, st, i)
		if cost > t.ceils[i] {
			r.Allowed, r.TooLarge, r.Rule = false, true, i
			break
		}
		fit, delay := true, int64(0)
		switch {
		case p.Kind == LeakyShaper:
			fit = s[0]+cost*p.Unit <= t.ceils[i]*p.Unit // room in the queue
			delay = QueueDelay(p, s)
		case Fits(p, s, t.nows[i], cost, t.ceils[i]):
		case p.Reservable():
			delay = RetryAfter(p, s, t.nows[i], cost, t.ceils[i])
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
		for i := range ps {
			p, s := rule(ps, st, i)
			Commit(p, s, t.nows[i], cost)
		}
	}
}

// report fills the numbers from the deciding rule: for a denial, the
// denying rule with the longest retry-after; for an admission, the rule
// with the fewest remaining.
func report(ps []Params, st []int64, t *ruleTimes, cost int64, r *Result) {
	best := ruleReport{i: -1}
	for i := range ps {
		p, s := rule(ps, st, i)
		c := ruleReport{i: i, rem: Remaining(p, s, t.nows[i]), reset: ResetAfter(p, s, t.nows[i])}
		if !r.Allowed && !r.TooLarge {
			c.retry = RetryAfter(p, s, t.nows[i], cost, t.ceils[i])
		}
		if r.Allowed && (p.Soft > 0 || p.Elastic > 0) && Used(p, s, t.nows[i]) > p.Burst {
			r.Excess = true
		}
		if best.i < 0 || r.prefers(&c, &best) {
			best = c
		}
	}
	if best.i < 0 {
		return
	}
	if !r.TooLarge {
		r.Rule = best.i
	}
	r.Limit = ps[r.Rule].Limit
	if r.Rule == best.i {
		r.Remaining, r.ResetAfter, r.RetryAfter = best.rem, best.reset, best.retry
	} else { // a rule too large, not the one that would wait longest
		p, s := rule(ps, st, r.Rule)
		r.Remaining, r.ResetAfter = Remaining(p, s, t.nows[r.Rule]), ResetAfter(p, s, t.nows[r.Rule])
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
func (r *Result) prefers(c, best *ruleReport) bool {
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

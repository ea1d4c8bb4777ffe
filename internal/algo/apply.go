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
	var (
		nows  [MaxRules]int64
		ceils [MaxRules]int64
		delay [MaxRules]int64
		fit   [MaxRules]bool
	)
	n := len(ps)
	r := out
	*r = Result{Allowed: true}
	for i := range n {
		p := &ps[i]
		s := st[p.Off : p.Off+p.Width]
		nows[i] = Advance(p, s, now)
		ceils[i] = p.Ceiling(spare&(1<<i) != 0)
	}

	switch op {
	case OpReset:
		clear(st)
	case OpRefund:
		for i := range n {
			p := &ps[i]
			Refund(p, st[p.Off:p.Off+p.Width], nows[i], cost)
		}
	case OpPeek, OpCharge, OpAllow:
		for i := range n {
			p := &ps[i]
			s := st[p.Off : p.Off+p.Width]
			if cost > ceils[i] && !r.TooLarge {
				// Never admissible. A charge is still recorded (clamped)
				// but reports the rule as too large, not a wait.
				r.Allowed, r.TooLarge, r.Rule = false, true, i
				if op != OpCharge {
					break
				}
			}
			fit[i] = cost <= ceils[i] && Fits(p, s, nows[i], cost, ceils[i])
			r.Allowed = r.Allowed && fit[i]
		}
		switch {
		case op == OpCharge:
			for i := range n {
				p := &ps[i]
				s := st[p.Off : p.Off+p.Width]
				Commit(p, s, nows[i], min(cost, p.MaxCeiling()))
				Clamp(p, s, nows[i])
			}
		case op == OpAllow && r.Allowed:
			for i := range n {
				p := &ps[i]
				Commit(p, st[p.Off:p.Off+p.Width], nows[i], cost)
			}
		case op == OpAllow && !r.TooLarge:
			for i := range n {
				if p := &ps[i]; p.CountRejected {
					Commit(p, st[p.Off:p.Off+p.Width], nows[i], cost)
				}
			}
		}
	case OpReserve:
		var longest int64
		for i := range n {
			p := &ps[i]
			s := st[p.Off : p.Off+p.Width]
			if cost > ceils[i] {
				r.Allowed, r.TooLarge, r.Rule = false, true, i
				break
			}
			switch {
			case p.Kind == LeakyShaper:
				fit[i] = s[0]+cost*p.Unit <= ceils[i]*p.Unit // room in the queue
				delay[i] = QueueDelay(p, s)
			case Fits(p, s, nows[i], cost, ceils[i]):
				fit[i] = true
			case p.Reservable():
				fit[i] = true
				delay[i] = RetryAfter(p, s, nows[i], cost, ceils[i])
			}
			r.Allowed = r.Allowed && fit[i]
			longest = max(longest, delay[i])
		}
		if longest > maxDelay {
			r.Allowed = false
		}
		if r.Allowed {
			r.Delay = longest
			for i := range n {
				p := &ps[i]
				Commit(p, st[p.Off:p.Off+p.Width], nows[i], cost)
			}
		}
	}

	// Report from the deciding rule.
	best := -1
	var bestRemaining, bestReset, bestRetry int64
	for i := range n {
		p := &ps[i]
		s := st[p.Off : p.Off+p.Width]
		rem := Remaining(p, s, nows[i])
		reset := ResetAfter(p, s, nows[i])
		var retry int64
		if !r.Allowed && !r.TooLarge {
			retry = RetryAfter(p, s, nows[i], cost, ceils[i])
		}
		if r.Allowed && (p.Soft > 0 || p.Elastic > 0) && Used(p, s, nows[i]) > p.Burst {
			r.Excess = true
		}
		var better bool
		switch {
		case best < 0:
			better = true
		case r.TooLarge:
			better = i == r.Rule
		case !r.Allowed:
			better = retry > bestRetry || (retry == bestRetry && rem < bestRemaining)
		default:
			better = rem < bestRemaining || (rem == bestRemaining && reset > bestReset)
		}
		if better {
			best, bestRemaining, bestReset, bestRetry = i, rem, reset, retry
		}
	}
	if best >= 0 {
		if !r.TooLarge {
			r.Rule = best
		}
		p := &ps[r.Rule]
		r.Limit = p.Limit
		if r.Rule == best {
			r.Remaining, r.ResetAfter, r.RetryAfter = bestRemaining, bestReset, bestRetry
		} else {
			s := st[p.Off : p.Off+p.Width]
			r.Remaining, r.ResetAfter = Remaining(p, s, nows[r.Rule]), ResetAfter(p, s, nows[r.Rule])
		}
	}
	if r.Allowed {
		r.RetryAfter = 0
	}
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

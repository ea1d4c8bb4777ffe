package algo

// apply1 is Apply for a policy of one rule, the common case, without the
// per-rule bookkeeping arrays. It must decide exactly as Apply does; the
// property tests run both paths against the reference models.
func apply1(p *Params, st []int64, now int64, op Op, cost, maxDelay int64, spare bool, r *Result) {
	s := st[p.Off : p.Off+p.Width]
	if op == OpAllow && p.Soft == 0 && p.Elastic == 0 && (p.Kind == TokenBucket || p.Kind == GCRA || p.Kind == LeakyMeter) {
		allowBucket(p, s, now, cost, r)
		return
	}
	now = Advance(p, s, now)
	ceiling := p.Ceiling(spare)
	*r = Result{Allowed: true}
	switch op {
	case OpReset:
		clear(s)
	case OpRefund:
		Refund(p, s, now, cost)
	case OpCharge:
		r.TooLarge = cost > ceiling // recorded all the same, but no wait helps
		r.Allowed = !r.TooLarge && Fits(p, s, now, cost, ceiling)
		Commit(p, s, now, min(cost, p.MaxCeiling()))
		Clamp(p, s, now)
	case OpPeek, OpAllow:
		if cost > ceiling {
			r.Allowed, r.TooLarge = false, true
			break
		}
		r.Allowed = Fits(p, s, now, cost, ceiling)
		if op == OpAllow && (r.Allowed || p.CountRejected) {
			Commit(p, s, now, cost)
		}
	case OpReserve:
		reserve1(p, s, now, cost, maxDelay, ceiling, r)
	}
	r.Limit = p.Limit
	r.Remaining = Remaining(p, s, now)
	r.ResetAfter = ResetAfter(p, s, now)
	if !r.Allowed && !r.TooLarge {
		r.RetryAfter = RetryAfter(p, s, now, cost, ceiling)
	}
	if r.Allowed && (p.Soft > 0 || p.Elastic > 0) && Used(p, s, now) > p.Burst {
		r.Excess = true
	}
}

// reserve1 is apply1's OpReserve: bucket rules lend capacity that frees
// within maxDelay, window rules must fit now.
func reserve1(p *Params, s []int64, now, cost, maxDelay, ceiling int64, r *Result) {
	if cost > ceiling {
		r.Allowed, r.TooLarge = false, true
		return
	}
	var delay int64
	switch {
	case p.Kind == LeakyShaper:
		r.Allowed = s[0]+cost*p.Unit <= ceiling*p.Unit
		delay = QueueDelay(p, s)
	case Fits(p, s, now, cost, ceiling):
	case p.Reservable():
		delay = RetryAfter(p, s, now, cost, ceiling)
	default:
		r.Allowed = false
	}
	if delay > maxDelay {
		r.Allowed = false
	}
	if r.Allowed {
		r.Delay = delay
		Commit(p, s, now, cost)
	}
}

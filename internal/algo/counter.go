package algo

// Sliding window counter (SlidingCounter), as redisstore/lua/50_counter.lua.
// State: s[0] the current window's start, s[1] the previous window's count
// << 32 | the current count (both below 2^31). The estimate is
// current + floor(previous * (P - elapsed) / P).

func counterAdvance(p *Params, s []int64, now int64) int64 {
	if s[0] <= now && now-s[0] < p.Period { // the state's window: inlined
		return now
	}
	return counterRoll(p, s, now)
}

func counterRoll(p *Params, s []int64, now int64) int64 {
	ws := s[0]
	if now < s[0] || now-s[0] >= p.Period {
		ws = floorDiv(now, p.Period) * p.Period
	}
	switch {
	case ws < s[0]:
		now = s[0]
	case ws == s[0]:
	case ws == s[0]+p.Period:
		s[0], s[1] = ws, swcCur(s)<<32
	default:
		s[0], s[1] = ws, 0
	}
	return now
}

// prevWeight is the previous window's share (Used adds the current count): floor(prev * (P - elapsed) /
// P). Rounding down favours the client by less than one request, as the
// seed articles' example (6.5 counts as 6) reads.
func (p *Params) prevWeight(s []int64, now int64) int64 {
	prev := swcPrev(s)
	if prev == 0 {
		return 0
	}
	return mulDiv(prev, p.Period-(now-s[0]), p.Period)
}

// counterRefund gives back the current window's requests first (the
// newest), then the previous window's, which still count (weighted).
func counterRefund(s []int64, cost int64) {
	cur, prev := swcCur(s), swcPrev(s)
	x := min(cost, cur)
	s[1] = max(0, prev-(cost-x))<<32 | (cur - x)
}

func counterReset(p *Params, s []int64, now int64) int64 {
	if cur := swcCur(s); cur > 0 {
		return s[0] + p.Period + p.firstElapsed(cur, 0) - now
	}
	return max(0, s[0]+p.firstElapsed(swcPrev(s), 0)-now)
}

func counterRetry(p *Params, s []int64, now, cost, ceiling int64) int64 {
	if a := ceiling - cost - swcCur(s); a >= 0 {
		return max(0, s[0]+p.firstElapsed(swcPrev(s), a)-now)
	}
	return s[0] + p.Period + p.firstElapsed(swcCur(s), ceiling-cost) - now
}

// firstElapsed returns the least elapsed time e in a window at which
// floor(x*(P-e)/P) <= a, for a >= 0.
func (p *Params) firstElapsed(x, a int64) int64 {
	if x <= a {
		return 0
	}
	// floor(x(P-e)/P) <= a  <=>  x(P-e) < (a+1)P  <=>  P-e <= ceil((a+1)P/x)-1
	return max(0, p.Period-mulDivCeil(a+1, p.Period, x)+1)
}

// The two counts share one word.
func swcPrev(s []int64) int64 { return s[1] >> 32 }
func swcCur(s []int64) int64  { return s[1] & (1<<32 - 1) }

// swcSetCur stores the current count, saturating below 2^31 (limits are
// below 2^31, so saturation changes no decision).
func swcSetCur(s []int64, cur int64) {
	s[1] = s[1]&^(1<<32-1) | min(cur, 1<<31-1)
}

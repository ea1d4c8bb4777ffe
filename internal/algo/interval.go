package algo

// Token bucket with interval refill (TokenBucketInterval), as
// redisstore/lua/20_interval.lua. State: s[0] requests consumed, s[1] the
// anchor: Limit requests come back at anchor+P, anchor+2P, ..., the
// anchor set when a full bucket is first drawn on.

func intervalAdvance(p *Params, s []int64, now int64) int64 {
	if s[0] > 0 {
		if now < s[1] {
			now = s[1]
		}
		if d := now - s[1]; d >= p.Period {
			k := d / p.Period
			if k >= ceilDiv(s[0], p.Limit) {
				s[0] = 0
			} else {
				s[0] -= k * p.Limit
				s[1] += k * p.Period
			}
		}
	}
	return now
}

func intervalCommit(s []int64, now, cost int64) {
	if s[0] == 0 {
		s[1] = now
	}
	s[0] += cost
}

func intervalReset(p *Params, s []int64, now int64) int64 {
	if s[0] == 0 {
		return 0
	}
	return max(0, s[1]+ceilDiv(s[0], p.Limit)*p.Period-now)
}

func intervalRetry(p *Params, s []int64, now, cost, ceiling int64) int64 {
	k := ceilDiv(s[0]-(ceiling-cost), p.Limit)
	return max(0, s[1]+k*p.Period-now)
}

package algo

import "math/bits"

// The bucket math (TokenBucket, LeakyMeter, GCRA, LeakyShaper), as
// redisstore/lua/10_bucket.lua, in small functions the compiler inlines,
// shared by the per-rule dispatch (rule.go) and the single-rule fast path.
// State: s[0] the level, consumed capacity in units (Unit per request),
// draining Rate units per microsecond since s[1].

// bucketAdvance drains the level up to now (clamped to the last update).
func bucketAdvance(p *Params, s []int64, now int64) int64 {
	if now < s[1] {
		now = s[1]
	}
	if s[0] > 0 {
		hi, lo := bits.Mul64(uint64(now-s[1]), uint64(p.Rate))
		if hi != 0 || lo >= uint64(s[0]) {
			s[0] = 0
		} else {
			s[0] -= int64(lo)
		}
	}
	s[1] = now
	return now
}

// bucketFits reports whether cost fits under ceiling.
func bucketFits(p *Params, s []int64, cost, ceiling int64) bool {
	return s[0]+cost*p.Unit <= ceiling*p.Unit
}

// bucketRemaining is the whole requests left under the burst.
func bucketRemaining(p *Params, s []int64) int64 {
	return max(0, (p.Burst*p.Unit-s[0])/p.Unit)
}

// bucketReset is the time for the level to drain to zero.
func bucketReset(p *Params, s []int64) int64 {
	return ceilDiv(s[0], p.Rate)
}

// bucketRetry is the time until cost fits under ceiling.
func bucketRetry(p *Params, s []int64, cost, ceiling int64) int64 {
	return ceilDiv(s[0]-(ceiling-cost)*p.Unit, p.Rate)
}

// allowBucket is OpAllow on a single hard-mode meter bucket (token bucket,
// GCRA, leaky meter): the hot path of the whole engine.
func allowBucket(p *Params, s []int64, now, cost int64, r *Result) {
	bucketAdvance(p, s, now)
	*r = Result{Limit: p.Limit}
	switch {
	case cost > p.Burst:
		r.TooLarge = true
	case bucketFits(p, s, cost, p.Burst):
		s[0] += cost * p.Unit
		r.Allowed = true
	default:
		r.RetryAfter = bucketRetry(p, s, cost, p.Burst)
	}
	r.Remaining = bucketRemaining(p, s)
	r.ResetAfter = bucketReset(p, s)
}

// bucketRefund gives back up to cost requests.
func bucketRefund(p *Params, s []int64, cost int64) {
	if cost >= ceilDiv(s[0], p.Unit) {
		s[0] = 0
	} else {
		s[0] -= cost * p.Unit
	}
}

// shaperRetry is a shaper's wait: a peek waits only for the level to come
// down to the ceiling, a request for the queue to empty.
func shaperRetry(p *Params, s []int64, cost, ceiling int64) int64 {
	if cost == 0 {
		return bucketRetry(p, s, cost, ceiling)
	}
	return ceilDiv(s[0], p.Rate)
}

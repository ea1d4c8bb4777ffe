package algo

// This file is the per-rule math's dispatch: each function switches on the
// algorithm, as redisstore/lua/80_convert.lua's table does, to the files
// that hold one algorithm each (bucket.go, interval.go, fixed.go, log.go,
// counter.go, subwindow.go), which say how each keeps its state words s.

// Advance brings a rule's state up to now (drains buckets, rolls windows,
// drops expired log entries) and returns the time the rule works at: now,
// or the latest time the state has already seen if the clock went back.
// Advancing never changes a decision; it only normalises the state.
func Advance(p *Params, s []int64, now int64) int64 {
	switch p.Kind {
	case TokenBucket, LeakyMeter, GCRA, LeakyShaper:
		return bucketAdvance(p, s, now)
	case TokenBucketInterval:
		return intervalAdvance(p, s, now)
	case FixedWindow:
		return fixedAdvance(p, s, now)
	case SlidingLog:
		return logAdvance(p, s, now)
	case SlidingCounter:
		return counterAdvance(p, s, now)
	case SlidingSubwindow:
		return subAdvance(p, s, now)
	}
	return now
}

// Used returns the requests the rule counts against its key at now, after
// Advance (buckets round a partial request up).
func Used(p *Params, s []int64, now int64) int64 {
	switch p.Kind {
	case TokenBucket, LeakyMeter, GCRA, LeakyShaper:
		return ceilDiv(s[0], p.Unit)
	case SlidingLog:
		return s[0]
	case SlidingCounter:
		return swcCur(s) + p.prevWeight(s, now)
	case SlidingSubwindow, FixedWindow:
		return s[1]
	}
	return s[0] // TokenBucketInterval
}

// Fits reports whether a request of cost fits under ceiling at now. A
// shaper admits without waiting only when its queue is empty.
func Fits(p *Params, s []int64, now, cost, ceiling int64) bool {
	switch p.Kind {
	case TokenBucket, LeakyMeter, GCRA:
		return bucketFits(p, s, cost, ceiling)
	case LeakyShaper:
		return (cost == 0 || s[0] == 0) && bucketFits(p, s, cost, ceiling)
	}
	return Used(p, s, now)+cost <= ceiling
}

// Commit consumes cost from the rule's state.
func Commit(p *Params, s []int64, now, cost int64) {
	switch p.Kind {
	case TokenBucket, LeakyMeter, GCRA, LeakyShaper:
		s[0] += cost * p.Unit
	case TokenBucketInterval:
		intervalCommit(s, now, cost)
	case FixedWindow:
		s[1] += cost
	case SlidingLog:
		logCommit(s, now, cost)
	case SlidingCounter:
		swcSetCur(s, swcCur(s)+cost)
	case SlidingSubwindow:
		subCommit(p, s, cost)
	}
}

// Clamp caps what the state counts at the rule's largest ceiling (after a
// charge, which records events whether or not they fit).
func Clamp(p *Params, s []int64, now int64) {
	c := p.MaxCeiling()
	switch p.Kind {
	case TokenBucket, LeakyMeter, GCRA, LeakyShaper:
		s[0] = min(s[0], c*p.Unit)
	case TokenBucketInterval:
		s[0] = min(s[0], c)
	case FixedWindow:
		s[1] = min(s[1], c)
	case SlidingLog:
		logClamp(s, c)
	case SlidingCounter:
		swcSetCur(s, min(swcCur(s), c))
	case SlidingSubwindow:
		if x := s[1] - c; x > 0 {
			subRefund(p, s, x) // newest first, across sub-windows
		}
	}
}

// Refund gives back up to cost requests, newest consumption first.
func Refund(p *Params, s []int64, now, cost int64) {
	switch p.Kind {
	case TokenBucket, LeakyMeter, GCRA, LeakyShaper:
		bucketRefund(p, s, cost)
	case TokenBucketInterval:
		s[0] = max(0, s[0]-cost)
	case FixedWindow:
		s[1] = max(0, s[1]-cost)
	case SlidingLog:
		s[0] -= min(cost, s[0])
	case SlidingCounter:
		counterRefund(s, cost)
	case SlidingSubwindow:
		subRefund(p, s, cost)
	}
}

// Remaining returns the whole requests admissible at now against the
// rule's limit (the burst for buckets), not counting any soft or elastic
// allowance beyond it.
func Remaining(p *Params, s []int64, now int64) int64 {
	switch p.Kind {
	case TokenBucket, LeakyMeter, GCRA, LeakyShaper:
		return bucketRemaining(p, s)
	}
	return max(0, p.Burst-Used(p, s, now))
}

// ResetAfter returns the time from now until the rule's state is fresh
// again, if no more requests arrive.
func ResetAfter(p *Params, s []int64, now int64) int64 {
	switch p.Kind {
	case TokenBucket, LeakyMeter, GCRA, LeakyShaper:
		return bucketReset(p, s)
	case TokenBucketInterval:
		return intervalReset(p, s, now)
	case FixedWindow:
		return fixedReset(p, s, now)
	case SlidingLog:
		return logReset(p, s, now)
	case SlidingCounter:
		return counterReset(p, s, now)
	case SlidingSubwindow:
		return subReset(p, s, now)
	}
	return 0
}

// RetryAfter returns the time from now until a request of cost (at most
// ceiling) would fit, if no other request arrives; 0 when it fits now.
func RetryAfter(p *Params, s []int64, now, cost, ceiling int64) int64 {
	if Fits(p, s, now, cost, ceiling) {
		return 0
	}
	switch p.Kind {
	case TokenBucket, LeakyMeter, GCRA:
		return bucketRetry(p, s, cost, ceiling)
	case LeakyShaper:
		return shaperRetry(p, s, cost, ceiling)
	case TokenBucketInterval:
		return intervalRetry(p, s, now, cost, ceiling)
	case FixedWindow:
		return fixedRetry(p, s, now)
	case SlidingLog:
		return logRetry(p, s, now, cost, ceiling)
	case SlidingCounter:
		return counterRetry(p, s, now, cost, ceiling)
	case SlidingSubwindow:
		return subRetry(p, s, now, cost, ceiling)
	}
	return 0
}

// QueueDelay is a shaper's wait before a request admitted now may leave:
// the time for the queue ahead of it to drain.
func QueueDelay(p *Params, s []int64) int64 {
	return ceilDiv(s[0], p.Rate)
}

// Bounds of a sane state word (Valid): times are microseconds since the
// epoch, below 2^56 (the year 4253), and no count or level of a real state
// comes near 2^53.
const (
	maxStateTime  = 1 << 56
	maxStateCount = 1 << 53
)

func validTime(t int64) bool  { return t >= 0 && t < maxStateTime }
func validCount(n int64) bool { return n >= 0 && n < maxStateCount }

// Valid reports whether s is a state the rule's math can work on: indexes
// within its ring, counts and levels not negative nor absurdly large,
// times within maxStateTime. Every state this package writes is valid; a
// state read from outside (a snapshot file, damaged on disk) may not be,
// and an invalid one would index out of its ring or overflow.
func Valid(p *Params, s []int64) bool {
	if len(s) != p.Width {
		return false
	}
	switch p.Kind {
	case TokenBucket, LeakyMeter, GCRA, LeakyShaper, TokenBucketInterval:
		return validCount(s[0]) && validTime(s[1])
	case FixedWindow:
		return validTime(s[0]) && validCount(s[1])
	case SlidingLog:
		return logValid(s)
	case SlidingCounter:
		return validTime(s[0]) && s[1] >= 0 && uint32(s[1]) < 1<<31
	case SlidingSubwindow:
		// (the total may exceed the counters' sum: they saturate)
		return s[0] >= 0 && s[0] < maxStateTime/p.Gran && validCount(s[1])
	}
	return false
}

package algo

import "time"

// This file is the per-rule math: each function switches on the algorithm
// and works on the rule's own state words s. State layouts:
//
//	bucket kinds (TokenBucket, LeakyMeter, GCRA, LeakyShaper):
//	    s[0] level in units (consumed capacity), s[1] time of the last update
//	TokenBucketInterval: s[0] requests consumed, s[1] anchor (start of the
//	    current refill period)
//	FixedWindow:      s[0] window start, s[1] count
//	SlidingLog:       s[0] entries, s[1] ring head, s[2:] ring of timestamps
//	    (MaxCeiling of them, one more with CountRejected)
//	SlidingCounter:   s[0] current window start, s[1] previous count << 32 | current count
//	    (both below 2^31, so a key costs two words)
//	SlidingSubwindow: s[0] current sub-window index, s[1] total, s[2:] ring of
//	    counters packed CBits (16 or 32) to a word

// Advance brings a rule's state up to now (drains buckets, rolls windows,
// drops expired log entries) and returns the time the rule works at: now,
// or the latest time the state has already seen if the clock went back.
// Advancing never changes a decision; it only normalises the state.
func Advance(p *Params, s []int64, now int64) int64 {
	switch p.Kind {
	case TokenBucket, LeakyMeter, GCRA, LeakyShaper:
		now = bucketAdvance(p, s, now)
	case TokenBucketInterval:
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
	case FixedWindow:
		ws, _ := p.windowAt(s[0], now)
		switch {
		case ws > s[0]:
			s[0], s[1] = ws, 0
		case ws < s[0]:
			now = s[0]
		}
	case SlidingLog:
		n, head, ring := s[0], s[1], s[2:]
		if n > 0 {
			if newest := ring[(head+n-1)%int64(len(ring))]; now < newest {
				now = newest
			}
		}
		for n > 0 && ring[head] <= now-p.Period {
			head++
			if head == int64(len(ring)) {
				head = 0
			}
			n--
		}
		s[0], s[1] = n, head
	case SlidingCounter:
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
	case SlidingSubwindow:
		cur := floorDiv(now, p.Gran)
		switch {
		case cur < s[0]:
			now = s[0] * p.Gran
		case cur > s[0]:
			if s[1] != 0 {
				if cur-s[0] >= p.N {
					clear(s[2:])
					s[1] = 0
				} else {
					for j := s[0] + 1; j <= cur; j++ {
						k := j % p.N
						s[1] -= p.subGet(s, k)
						p.subSet(s, k, 0)
					}
				}
			}
			s[0] = cur
		}
	}
	return now
}

// Window returns the fixed window [start, end) holding now.
func (p *Params) Window(now int64) (int64, int64) { return p.window(now) }

// windowAt returns the fixed window holding now, knowing that the state's
// window starts at s0: most requests fall in it, which saves a division.
func (p *Params) windowAt(s0, now int64) (int64, int64) {
	if p.Cal == CalNone && s0 <= now && now-s0 < p.Period {
		return s0, s0 + p.Period
	}
	return p.window(now)
}

// window returns the fixed window [start, end) holding now.
func (p *Params) window(now int64) (int64, int64) {
	if p.Cal == CalNone {
		ws := floorDiv(now, p.Period) * p.Period
		return ws, ws + p.Period
	}
	t := time.UnixMicro(now).In(p.Loc)
	y, m, d := t.Date()
	switch p.Cal {
	case CalDay:
		return dayStart(y, m, d, p.Loc), dayStart(y, m, d+1, p.Loc)
	case CalWeek:
		back := (int(t.Weekday()) - int(p.WeekDay0) + 7) % 7
		return dayStart(y, m, d-back, p.Loc), dayStart(y, m, d-back+7, p.Loc)
	}
	return dayStart(y, m, 1, p.Loc), dayStart(y, m+1, 1, p.Loc)
}

// dayStart returns the first instant of the local day y-m-d (normalised as
// time.Date does), or of the next one if the zone skipped that date.
// time.Date alone gets it wrong when a clock change skips midnight (it
// returns 23:00 of the day before, making the window end before it starts)
// or repeats it (it returns the second midnight).
func dayStart(y int, m time.Month, d int, loc *time.Location) int64 {
	t := time.Date(y, m, d, 0, 0, 0, 0, loc)
	day := time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
	if localDay(t).Before(day) { // midnight skipped: the day begins at the change
		_, end := t.ZoneBounds()
		return end.UnixMicro()
	}
	if p := t.Add(-time.Microsecond); !localDay(p).Before(day) { // midnight repeated
		_, po := p.Zone()
		_, to := t.Zone()
		t = t.Add(time.Duration(to-po) * time.Second)
	}
	return t.UnixMicro()
}

// localDay returns t's local date as midnight UTC, for comparing dates.
func localDay(t time.Time) time.Time {
	y, m, d := t.Date()
	return time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
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

// prevWeight is the sliding-window counter's share of the previous window:
// floor(prev * (P - elapsed) / P). Rounding down favours the client by less
// than one request, as the seed articles' example (6.5 counts as 6) reads.
func (p *Params) prevWeight(s []int64, now int64) int64 {
	prev := swcPrev(s)
	if prev == 0 {
		return 0
	}
	return mulDiv(prev, p.Period-(now-s[0]), p.Period)
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
		if s[0] == 0 {
			s[1] = now
		}
		s[0] += cost
	case FixedWindow:
		s[1] += cost
	case SlidingLog:
		ring := s[2:]
		m := int64(len(ring))
		n, head := s[0], s[1]
		for range min(cost, m) {
			if n == m { // full: the oldest entry gives way
				head++
				if head == m {
					head = 0
				}
				n--
			}
			ring[(head+n)%m] = now
			n++
		}
		s[0], s[1] = n, head
	case SlidingCounter:
		swcSetCur(s, swcCur(s)+cost)
	case SlidingSubwindow:
		k := s[0] % p.N
		p.subSet(s, k, p.subGet(s, k)+cost)
		s[1] += cost
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
	case SlidingLog: // the oldest entries go (the ring holds c+1 when counting rejections)
		if x := s[0] - c; x > 0 {
			s[0], s[1] = c, (s[1]+x)%int64(len(s)-2)
		}
	case SlidingCounter:
		swcSetCur(s, min(swcCur(s), c))
	case SlidingSubwindow:
		if x := s[1] - c; x > 0 {
			Refund(p, s, now, x) // newest first, across sub-windows
		}
	}
}

// Refund gives back up to cost requests, newest consumption first.
func Refund(p *Params, s []int64, now, cost int64) {
	switch p.Kind {
	case TokenBucket, LeakyMeter, GCRA, LeakyShaper:
		if cost >= ceilDiv(s[0], p.Unit) {
			s[0] = 0
		} else {
			s[0] -= cost * p.Unit
		}
	case TokenBucketInterval:
		s[0] = max(0, s[0]-cost)
	case FixedWindow:
		s[1] = max(0, s[1]-cost)
	case SlidingLog:
		s[0] -= min(cost, s[0])
	case SlidingCounter:
		// The current window's requests are the newest; then the previous
		// window's, which still count (weighted).
		cur, prev := swcCur(s), swcPrev(s)
		x := min(cost, cur)
		s[1] = max(0, prev-(cost-x))<<32 | (cur - x)
	case SlidingSubwindow:
		for j := s[0]; cost > 0 && s[1] > 0 && j > s[0]-p.N; j-- {
			k := floorMod(j, p.N)
			v := p.subGet(s, k)
			x := min(cost, v)
			p.subSet(s, k, v-x)
			s[1] -= x
			cost -= x
		}
	}
}

func floorMod(a, b int64) int64 {
	m := a % b
	if m < 0 {
		m += b
	}
	return m
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
		if s[0] == 0 {
			return 0
		}
		return max(0, s[1]+ceilDiv(s[0], p.Limit)*p.Period-now)
	case FixedWindow:
		if s[1] == 0 {
			return 0
		}
		_, end := p.windowAt(s[0], now)
		return end - now
	case SlidingLog:
		if s[0] == 0 {
			return 0
		}
		ring := s[2:]
		return ring[(s[1]+s[0]-1)%int64(len(ring))] + p.Period - now
	case SlidingCounter:
		if cur := swcCur(s); cur > 0 {
			return s[0] + p.Period + p.firstElapsed(cur, 0) - now
		}
		return max(0, s[0]+p.firstElapsed(swcPrev(s), 0)-now)
	case SlidingSubwindow:
		if s[1] == 0 {
			return 0
		}
		for j := s[0]; ; j-- {
			if p.subGet(s, floorMod(j, p.N)) != 0 {
				return (j+p.N)*p.Gran - now
			}
		}
	}
	return 0
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
		if cost == 0 { // a peek waits only for the level to come down to the ceiling
			return bucketRetry(p, s, cost, ceiling)
		}
		return ceilDiv(s[0], p.Rate) // until the queue is empty
	case TokenBucketInterval:
		k := ceilDiv(s[0]-(ceiling-cost), p.Limit)
		return max(0, s[1]+k*p.Period-now)
	case FixedWindow:
		_, end := p.windowAt(s[0], now)
		return end - now
	case SlidingLog:
		ring := s[2:]
		k := s[0] - (ceiling - cost) // oldest entries that must expire
		return ring[(s[1]+k-1)%int64(len(ring))] + p.Period - now
	case SlidingCounter:
		if a := ceiling - cost - swcCur(s); a >= 0 {
			return max(0, s[0]+p.firstElapsed(swcPrev(s), a)-now)
		}
		return s[0] + p.Period + p.firstElapsed(swcCur(s), ceiling-cost) - now
	case SlidingSubwindow:
		total := s[1]
		for j := s[0] - p.N + 1; j <= s[0]; j++ {
			total -= p.subGet(s, floorMod(j, p.N))
			if total <= ceiling-cost {
				return (j+p.N)*p.Gran - now
			}
		}
	}
	return 0
}

// QueueDelay is a shaper's wait before a request admitted now may leave:
// the time for the queue ahead of it to drain.
func QueueDelay(p *Params, s []int64) int64 {
	return ceilDiv(s[0], p.Rate)
}

// The sliding window counter packs its two counts into one word.
func swcPrev(s []int64) int64 { return s[1] >> 32 }
func swcCur(s []int64) int64  { return s[1] & (1<<32 - 1) }

// swcSetCur stores the current count, saturating below 2^31 (limits are
// below 2^31, so saturation changes no decision).
func swcSetCur(s []int64, cur int64) {
	s[1] = s[1]&^(1<<32-1) | min(cur, 1<<31-1)
}

// subGet returns sub-window counter k of a SlidingSubwindow state.
func (p *Params) subGet(s []int64, k int64) int64 {
	per := 64 / p.CBits
	w := uint64(s[2+k/per])
	return int64(w >> (uint(k%per) * uint(p.CBits)) & (1<<p.CBits - 1))
}

// subSet stores sub-window counter k, saturating at the counter's width
// (which is at least twice the largest ceiling, so saturation never
// changes a decision).
func (p *Params) subSet(s []int64, k, v int64) {
	per := 64 / p.CBits
	sh := uint(k%per) * uint(p.CBits)
	mask := uint64(1<<p.CBits-1) << sh
	v = min(v, 1<<p.CBits-1)
	w := &s[2+k/per]
	*w = int64(uint64(*w)&^mask | uint64(v)<<sh)
}

// Bounds of a sane state word (Valid): times are microseconds since the
// epoch, below 2^56 (the year 4253), and no count or level of a real state
// comes near 2^53.
const (
	maxStateTime  = 1 << 56
	maxStateCount = 1 << 53
)

// Valid reports whether s is a state the rule's math can work on: indexes
// within its ring, counts and levels not negative nor absurdly large,
// times within maxStateTime. Every state this package writes is valid; a
// state read from outside (a snapshot file, damaged on disk) may not be,
// and an invalid one would index out of its ring or overflow.
func Valid(p *Params, s []int64) bool {
	if len(s) != p.Width {
		return false
	}
	time := func(t int64) bool { return t >= 0 && t < maxStateTime }
	count := func(n int64) bool { return n >= 0 && n < maxStateCount }
	switch p.Kind {
	case TokenBucket, LeakyMeter, GCRA, LeakyShaper, TokenBucketInterval:
		return count(s[0]) && time(s[1])
	case FixedWindow:
		return time(s[0]) && count(s[1])
	case SlidingLog:
		n, head, ring := s[0], s[1], s[2:]
		if len(ring) == 0 || n < 0 || n > int64(len(ring)) || head < 0 || head >= int64(len(ring)) {
			return false
		}
		for i := range n {
			if !time(ring[(head+i)%int64(len(ring))]) {
				return false
			}
		}
		return true
	case SlidingCounter:
		return time(s[0]) && s[1] >= 0 && uint32(s[1]) < 1<<31
	case SlidingSubwindow:
		// (the total may exceed the counters' sum: they saturate)
		return s[0] >= 0 && s[0] < maxStateTime/p.Gran && count(s[1])
	}
	return false
}

package algo

// Sliding log (SlidingLog), as redisstore/lua/40_log.lua. State: s[0]
// entries, s[1] the ring's head, s[2:] a ring of request times, oldest
// first: MaxCeiling of them, one more with CountRejected (a full window
// told from an overfull one). An entry counts while now - t < P.

func logAdvance(p *Params, s []int64, now int64) int64 {
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
	return now
}

// logCommit enters cost entries at now; in a full ring the oldest give way.
func logCommit(s []int64, now, cost int64) {
	ring := s[2:]
	m := int64(len(ring))
	n, head := s[0], s[1]
	for range min(cost, m) {
		if n == m {
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
}

// logClamp drops the oldest entries beyond c.
func logClamp(s []int64, c int64) {
	if x := s[0] - c; x > 0 {
		s[0], s[1] = c, (s[1]+x)%int64(len(s)-2)
	}
}

func logReset(p *Params, s []int64, now int64) int64 {
	if s[0] == 0 {
		return 0
	}
	ring := s[2:]
	return ring[(s[1]+s[0]-1)%int64(len(ring))] + p.Period - now
}

func logRetry(p *Params, s []int64, now, cost, ceiling int64) int64 {
	ring := s[2:]
	k := s[0] - (ceiling - cost) // oldest entries that must expire
	return ring[(s[1]+k-1)%int64(len(ring))] + p.Period - now
}

func logValid(s []int64) bool {
	n, head, ring := s[0], s[1], s[2:]
	if len(ring) == 0 || n < 0 || n > int64(len(ring)) || head < 0 || head >= int64(len(ring)) {
		return false
	}
	for i := range n {
		if !validTime(ring[(head+i)%int64(len(ring))]) {
			return false
		}
	}
	return true
}

package algo

// Sliding window of sub-window counters (SlidingSubwindow), as
// redisstore/lua/60_subwindow.lua. State: s[0] the current sub-window's
// index, s[1] the total, s[2:] a ring of N counters packed CBits (16 or
// 32) to a word: sub-window j's at j % N.

func subAdvance(p *Params, s []int64, now int64) int64 {
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
	return now
}

func subCommit(p *Params, s []int64, cost int64) {
	k := s[0] % p.N
	p.subSet(s, k, p.subGet(s, k)+cost)
	s[1] += cost
}

// subRefund gives back the newest sub-windows' requests first.
func subRefund(p *Params, s []int64, cost int64) {
	for j := s[0]; cost > 0 && s[1] > 0 && j > s[0]-p.N; j-- {
		k := floorMod(j, p.N)
		v := p.subGet(s, k)
		x := min(cost, v)
		p.subSet(s, k, v-x)
		s[1] -= x
		cost -= x
	}
}

func subReset(p *Params, s []int64, now int64) int64 {
	if s[1] == 0 {
		return 0
	}
	for j := s[0]; ; j-- {
		if p.subGet(s, floorMod(j, p.N)) != 0 {
			return (j+p.N)*p.Gran - now
		}
	}
}

func subRetry(p *Params, s []int64, now, cost, ceiling int64) int64 {
	total := s[1]
	for j := s[0] - p.N + 1; j <= s[0]; j++ {
		total -= p.subGet(s, floorMod(j, p.N))
		if total <= ceiling-cost {
			return (j+p.N)*p.Gran - now
		}
	}
	return 0
}

// subGet returns sub-window counter k.
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

func floorMod(a, b int64) int64 {
	m := a % b
	if m < 0 {
		m += b
	}
	return m
}

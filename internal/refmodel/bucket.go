package refmodel

import "math/big"

// tokenBucket models TokenBucket, LeakyMeter and GCRA: B tokens, starting
// full, refilled continuously at L tokens per P (exactly, as a rational),
// never above B. A request takes its cost in tokens; a reservation may take
// the bucket below zero. The rule's usage is B - tokens.
type tokenBucket struct {
	s    *Spec
	tok  *big.Rat // tokens at last
	last int64    // the latest time the rule has seen
	seen bool     // false while fresh: no time seen since the start or a reset
}

func newTokenBucket(s *Spec) *tokenBucket { return &tokenBucket{s: s, tok: rat(s.B())} }

func (b *tokenBucket) tokensAt(t int64) *big.Rat {
	x := rateTimes(t-b.last, b.s.Limit, b.s.Period)
	x.Add(x, b.tok)
	if bb := rat(b.s.B()); x.Cmp(bb) > 0 {
		x = bb
	}
	return x
}

// enter never lets the bucket's time go back: an earlier clock reading is
// taken as the latest time seen.
func (b *tokenBucket) enter(now int64) int64 {
	if b.seen && now < b.last {
		now = b.last
	}
	if b.seen {
		b.tok = b.tokensAt(now)
	}
	b.last, b.seen = now, true
	return now
}

func (b *tokenBucket) usage(t int64) *big.Rat {
	return new(big.Rat).Sub(rat(b.s.B()), b.tokensAt(t))
}

func (b *tokenBucket) record(t, c int64) { b.tok.Sub(b.tok, rat(c)) }

// charge takes c tokens but leaves at least B - max (usage at most max).
func (b *tokenBucket) charge(t, c, most int64) {
	b.record(t, c)
	if floor := rat(b.s.B() - most); b.tok.Cmp(floor) < 0 {
		b.tok = floor
	}
}

func (b *tokenBucket) refund(t, c int64) {
	b.tok.Add(b.tok, rat(c))
	if bb := rat(b.s.B()); b.tok.Cmp(bb) > 0 {
		b.tok = bb
	}
}

func (b *tokenBucket) reset() { *b = *newTokenBucket(b.s) }

// shaper models LeakyShaper: a queue whose level (rational, >= 0) drains at
// L per P; an admitted request adds its cost to the level.
type shaper struct {
	s     *Spec
	level *big.Rat
	last  int64
	seen  bool
}

func newShaper(s *Spec) *shaper { return &shaper{s: s, level: new(big.Rat)} }

func (q *shaper) levelAt(t int64) *big.Rat {
	x := new(big.Rat).Sub(q.level, rateTimes(t-q.last, q.s.Limit, q.s.Period))
	if x.Sign() < 0 {
		x.SetInt64(0)
	}
	return x
}

func (q *shaper) enter(now int64) int64 {
	if q.seen && now < q.last {
		now = q.last
	}
	if q.seen {
		q.level = q.levelAt(now)
	}
	q.last, q.seen = now, true
	return now
}

func (q *shaper) usage(t int64) *big.Rat { return q.levelAt(t) }
func (q *shaper) record(t, c int64)      { q.level.Add(q.level, rat(c)) }

func (q *shaper) charge(t, c, most int64) {
	q.record(t, c)
	if m := rat(most); q.level.Cmp(m) > 0 {
		q.level = m
	}
}

func (q *shaper) refund(t, c int64) {
	q.level.Sub(q.level, rat(c))
	if q.level.Sign() < 0 {
		q.level.SetInt64(0)
	}
}

func (q *shaper) reset() { *q = *newShaper(q.s) }

// intervalBucket models TokenBucketInterval: B tokens, starting full. When a
// request takes tokens from a full bucket, a refill period is anchored at
// that instant; L tokens are added at anchor+P, anchor+2P, ... (never above
// B); once the bucket is full again the anchor is dropped.
type intervalBucket struct {
	s      *Spec
	tok    int64 // tokens (B when full; below 0 after a reservation)
	anchor int64 // start of the current refill period, while not full
}

func newIntervalBucket(s *Spec) *intervalBucket { return &intervalBucket{s: s, tok: s.B()} }

func (b *intervalBucket) full() bool { return b.tok >= b.s.B() }

// refills returns how many refill instants anchor+kP, k >= 1, lie in (anchor, t].
func (b *intervalBucket) refills(t int64) int64 { return floorDiv(t-b.anchor, b.s.Period) }

func (b *intervalBucket) tokensAt(t int64) int64 {
	if b.full() {
		return b.tok
	}
	k := b.refills(t)
	need := b.s.B() - b.tok // tokens missing
	if k*1 >= (need+b.s.Limit-1)/b.s.Limit {
		return b.s.B()
	}
	return b.tok + k*b.s.Limit
}

// enter never lets time go back before the start of the current refill
// period (the anchor, or the last refill instant the bucket has seen).
func (b *intervalBucket) enter(now int64) int64 {
	if b.full() {
		return now
	}
	if now < b.anchor {
		now = b.anchor
	}
	k := b.refills(now)
	b.tok = b.tokensAt(now)
	if !b.full() {
		b.anchor += k * b.s.Period
	}
	return now
}

func (b *intervalBucket) usage(t int64) *big.Rat { return rat(b.s.B() - b.tokensAt(t)) }

func (b *intervalBucket) record(t, c int64) {
	if b.full() && c > 0 {
		b.anchor = t
	}
	b.tok -= c
}

func (b *intervalBucket) charge(t, c, most int64) {
	b.record(t, c)
	b.tok = max(b.tok, b.s.B()-most)
}

func (b *intervalBucket) refund(t, c int64) { b.tok = min(b.s.B(), b.tok+c) }
func (b *intervalBucket) reset()            { *b = *newIntervalBucket(b.s) }

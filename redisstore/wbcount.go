package redisstore

import (
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/algo"
)

// at returns Redis's previous and current counts as of window ws, from the
// last reply.
func (e *wbEntry) at(ws int64) (prev, cur int64) {
	P := e.wp.p.Period
	switch {
	case e.ws >= ws: // Redis's window (or one ahead of this clock)
		return e.prev, e.cur
	case e.ws+P == ws:
		if e.wp.p.Kind == algo.SlidingCounter {
			return e.cur, 0
		}
		return 0, 0
	}
	return 0, 0
}

// used is a window algorithm's count at now: the current count, plus the
// previous window's weighted by its overlap for a sliding window counter.
func used(p *algo.Params, ws, prev, cur, now int64) int64 {
	if p.Kind != algo.SlidingCounter || prev == 0 {
		return cur
	}
	el := min(max(now-ws, 0), p.Period)
	return cur + mulDiv(prev, p.Period-el, p.Period)
}

// mulDiv is floor(a×b/c) for a, b >= 0 and c > 0, without overflow for
// the counts and periods here (a below 2^31, b and c periods in µs).
func mulDiv(a, b, c int64) int64 {
	q, r := b/c, b%c
	return a*q + a*r/c
}

// decision is a local (or reply's) decision on the entry's rule, the
// counts prev and cur of window ws being those after it.
func (e *wbEntry) decision(allowed bool, ws, prev, cur, now, cost int64) floodgate.Decision {
	p := &e.wp.p
	L := p.Limit
	u := used(p, ws, prev, cur, now)
	d := floodgate.Decision{Allowed: allowed, Limit: L, Remaining: max(0, L-u), Rule: e.wp.name}
	end := ws + p.Period
	d.ResetAfter = time.Duration(end-now) * time.Microsecond
	if p.Kind == algo.SlidingCounter && cur > 0 {
		d.ResetAfter += time.Duration(p.Period) * time.Microsecond
	}
	if !allowed {
		d.Reason = floodgate.ReasonLimited
		d.RetryAfter = time.Duration(retryAt(p, ws, prev, cur, cost)-now) * time.Microsecond
		if d.RetryAfter < 0 {
			d.RetryAfter = 0
		}
	}
	return d
}

// retryAt is when a request of cost fits (the Lua's counter.retry; the
// window's end for a fixed window).
func retryAt(p *algo.Params, ws, prev, cur, cost int64) int64 {
	P, L := p.Period, p.Limit
	if p.Kind != algo.SlidingCounter {
		return ws + P
	}
	first := func(x, a int64) int64 { // least elapsed e with floor(x(P-e)/P) <= a
		if x <= a {
			return 0
		}
		return max(0, P-ceilMulDiv(a+1, P, x)+1)
	}
	if a := L - cost - cur; a >= 0 {
		return ws + first(prev, a)
	}
	return ws + P + first(cur, L-cost)
}

func ceilMulDiv(a, b, c int64) int64 {
	q := mulDiv(a, b, c)
	if q*c < a*b {
		return q + 1
	}
	return q
}

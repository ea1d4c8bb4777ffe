package algo

// Convert carries one rule's state from old parameters to new ones (a limit
// change, say), keeping what the key has consumed in requests, clamped to
// the new rule's largest ceiling. os is advanced in place; ns must be zero.
func Convert(op *Params, os []int64, np *Params, ns []int64, now int64) {
	t := Advance(op, os, now)
	used := Used(op, os, t)
	if used == 0 {
		return
	}
	c := np.MaxCeiling()
	switch {
	case op.Bucket() && np.Bucket():
		// Keep the exact fraction of a request: level/Unit requests.
		ns[0] = min(mulDivCeil(os[0], np.Unit, op.Unit), c*np.Unit)
		ns[1] = t
		return
	case op.Kind == TokenBucketInterval && np.Kind == op.Kind:
		ns[0], ns[1] = min(os[0], c), os[1]
		return
	case op.Kind == FixedWindow && np.Kind == op.Kind && op.Period == np.Period &&
		op.Cal == np.Cal && op.Loc == np.Loc && op.WeekDay0 == np.WeekDay0:
		ns[0], ns[1] = os[0], min(os[1], c)
		return
	case op.Kind == SlidingLog && np.Kind == op.Kind && op.Period == np.Period:
		oring, nring := os[2:], ns[2:]
		n := min(os[0], c, int64(len(nring)))
		for i := range n {
			nring[i] = oring[(os[1]+os[0]-n+i)%int64(len(oring))]
		}
		ns[0], ns[1] = n, 0
		return
	case op.Kind == SlidingCounter && np.Kind == op.Kind && op.Period == np.Period:
		// Clamp the weighted total: the current count first, then the
		// previous window's count, to the most whose weight still fits.
		prev, cur := swcPrev(os), min(swcCur(os), c)
		if prev > 0 {
			lim := mulDivCeil(c-cur+1, np.Period, np.Period-(t-os[0])) - 1
			prev = min(prev, lim)
		}
		ns[0], ns[1] = os[0], prev<<32|cur
		return
	case op.Kind == SlidingSubwindow && np.Kind == op.Kind && op.Gran == np.Gran && op.N == np.N && op.CBits == np.CBits:
		copy(ns, os)
		Clamp(np, ns, t)
		return
	}
	// Different algorithm or window: count what was consumed as consumed now.
	Advance(np, ns, t)
	Commit(np, ns, t, min(used, c))
}

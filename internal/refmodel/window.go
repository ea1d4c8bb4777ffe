package refmodel

import "math/big"

// event is a recorded request: its time and cost.
type event struct{ t, c int64 }

// events is a list of recorded requests, oldest first.
type events []event

// sum returns the cost of the events for which in holds.
func (es events) sum(in func(t int64) bool) int64 {
	var n int64
	for _, e := range es {
		if in(e.t) {
			n += e.c
		}
	}
	return n
}

// keep drops the events for which live does not hold.
func (es events) keep(live func(t int64) bool) events {
	out := es[:0]
	for _, e := range es {
		if live(e.t) {
			out = append(out, e)
		}
	}
	return out
}

// refund takes back up to c from the newest events for which in holds.
func (es events) refund(c int64, in func(t int64) bool) events {
	for i := len(es) - 1; i >= 0 && c > 0; i-- {
		if !in(es[i].t) {
			continue
		}
		x := min(c, es[i].c)
		es[i].c -= x
		c -= x
	}
	out := es[:0]
	for _, e := range es {
		if e.c > 0 {
			out = append(out, e)
		}
	}
	return out
}

// fixedWindow counts requests per window: [kP, (k+1)P) from the epoch, or
// calendar days, weeks or months in a time zone.
type fixedWindow struct {
	s    *Spec
	cal  *calendar
	ev   events
	win  int64 // start of the latest window seen
	seen bool
}

func newFixedWindow(s *Spec) *fixedWindow {
	w := &fixedWindow{s: s}
	if s.Cal != CalNone {
		w.cal = newCalendar(s.Cal, s.Loc, s.WeekStart)
	}
	return w
}

func (w *fixedWindow) window(t int64) (int64, int64) {
	if w.cal != nil {
		return w.cal.window(t)
	}
	ws := floorDiv(t, w.s.Period) * w.s.Period
	return ws, ws + w.s.Period
}

// enter never lets time go back to an earlier window: a reading in a window
// before the latest one seen is taken as that window's start.
func (w *fixedWindow) enter(now int64) int64 {
	ws, _ := w.window(now)
	if w.seen && ws < w.win {
		now, ws = w.win, w.win
	}
	w.win, w.seen = max(w.win, ws), true
	cur := w.win
	w.ev = w.ev.keep(func(t int64) bool { s, _ := w.window(t); return s == cur })
	return now
}

func (w *fixedWindow) count(t int64) int64 {
	ws, _ := w.window(t)
	return w.ev.sum(func(e int64) bool { s, _ := w.window(e); return s == ws })
}

func (w *fixedWindow) usage(t int64) *big.Rat { return rat(w.count(t)) }

func (w *fixedWindow) record(t, c int64) {
	if c > 0 {
		w.ev = append(w.ev, event{t, c})
	}
}

// charge records c, but no more than brings the window's count to max.
func (w *fixedWindow) charge(t, c, most int64) { w.record(t, min(c, most-w.count(t))) }

func (w *fixedWindow) refund(t, c int64) {
	ws, _ := w.window(t)
	w.ev = w.ev.refund(c, func(e int64) bool { s, _ := w.window(e); return s == ws })
}

func (w *fixedWindow) reset() { *w = fixedWindow{s: w.s, cal: w.cal} }

// slidingWindow is the sliding window counter: windows [kP, (k+1)P) from the
// epoch; at elapsed e into the current window the estimate is
// cur + ⌊prev·(P-e)/P⌋.
type slidingWindow struct {
	s    *Spec
	ev   events
	win  int64
	seen bool
}

func (w *slidingWindow) start(t int64) int64 { return floorDiv(t, w.s.Period) * w.s.Period }

func (w *slidingWindow) enter(now int64) int64 {
	ws := w.start(now)
	if w.seen && ws < w.win {
		now, ws = w.win, w.win
	}
	w.win, w.seen = max(w.win, ws), true
	horizon := w.win - w.s.Period
	w.ev = w.ev.keep(func(t int64) bool { return t >= horizon })
	return now
}

// counts returns the current and previous windows' counts at t.
func (w *slidingWindow) counts(t int64) (cur, prev int64) {
	ws, p := w.start(t), w.s.Period
	cur = w.ev.sum(func(e int64) bool { return e >= ws && e < ws+p })
	prev = w.ev.sum(func(e int64) bool { return e >= ws-p && e < ws })
	return cur, prev
}

func (w *slidingWindow) usage(t int64) *big.Rat {
	cur, prev := w.counts(t)
	ws, p := w.start(t), w.s.Period
	return rat(cur + floorMulDiv(prev, p-(t-ws), p))
}

func (w *slidingWindow) record(t, c int64) {
	if c > 0 {
		w.ev = append(w.ev, event{t, c})
	}
}

// charge records c, but no more than brings the current window's count to
// max (the previous window's weighted share is not clamped).
func (w *slidingWindow) charge(t, c, most int64) {
	cur, _ := w.counts(t)
	w.record(t, min(c, most-cur))
}

// refund takes back the newest consumption that still counts: the current
// window's, then the previous window's.
func (w *slidingWindow) refund(t, c int64) {
	ws := w.start(t)
	w.ev = w.ev.refund(c, func(e int64) bool { return e >= ws-w.s.Period })
}

func (w *slidingWindow) reset() { *w = slidingWindow{s: w.s} }

// subwindow counts requests per sub-window of G; the count at t is the sum
// over sub-windows with index in (⌊t/G⌋ - n, ⌊t/G⌋], n = P/G.
type subwindow struct {
	s    *Spec
	ev   events
	idx  int64 // latest sub-window index seen
	seen bool
}

func (w *subwindow) index(t int64) int64 { return floorDiv(t, w.s.Gran) }
func (w *subwindow) n() int64            { return w.s.Period / w.s.Gran }

func (w *subwindow) enter(now int64) int64 {
	i := w.index(now)
	if w.seen && i < w.idx {
		now, i = w.idx*w.s.Gran, w.idx
	}
	w.idx, w.seen = max(w.idx, i), true
	oldest := w.idx - w.n()
	w.ev = w.ev.keep(func(t int64) bool { return w.index(t) > oldest })
	return now
}

func (w *subwindow) counted(t int64) func(int64) bool {
	i := w.index(t)
	return func(e int64) bool { j := w.index(e); return j > i-w.n() && j <= i }
}

func (w *subwindow) count(t int64) int64     { return w.ev.sum(w.counted(t)) }
func (w *subwindow) usage(t int64) *big.Rat  { return rat(w.count(t)) }
func (w *subwindow) charge(t, c, most int64) { w.record(t, min(c, most-w.count(t))) }
func (w *subwindow) refund(t, c int64)       { w.ev = w.ev.refund(c, w.counted(t)) }
func (w *subwindow) reset()                  { *w = subwindow{s: w.s} }
func (w *subwindow) record(t, c int64) {
	if c > 0 {
		w.ev = append(w.ev, event{t, c})
	}
}

// slidingLog keeps one timestamp per request; an entry at e counts at t
// while t - e < P. The log holds at most MaxCeiling entries, one more when
// it counts rejections (so that a window holding more than the limit
// refuses even a peek): recording into a full log drops the oldest. A
// charge keeps at most MaxCeiling.
type slidingLog struct {
	s  *Spec
	ts []int64 // oldest first
}

// enter never lets time go back before the newest entry.
func (l *slidingLog) enter(now int64) int64 {
	if n := len(l.ts); n > 0 && now < l.ts[n-1] {
		now = l.ts[n-1]
	}
	k := 0
	for k < len(l.ts) && now-l.ts[k] >= l.s.Period {
		k++
	}
	l.ts = l.ts[k:]
	return now
}

func (l *slidingLog) usage(t int64) *big.Rat {
	var n int64
	for _, e := range l.ts {
		if t-e < l.s.Period {
			n++
		}
	}
	return rat(n)
}

func (l *slidingLog) record(t, c int64) {
	m := l.s.MaxCeiling()
	if l.s.CountRejected {
		m++
	}
	for range min(c, m) {
		l.ts = append(l.ts, t)
	}
	l.keep(m)
}

// keep drops the oldest entries beyond m.
func (l *slidingLog) keep(m int64) {
	if int64(len(l.ts)) > m {
		l.ts = append([]int64(nil), l.ts[int64(len(l.ts))-m:]...)
	}
}

func (l *slidingLog) charge(t, c, most int64) {
	l.record(t, c)
	l.keep(most)
}

func (l *slidingLog) refund(t, c int64) { l.ts = l.ts[:int64(len(l.ts))-min(c, int64(len(l.ts)))] }
func (l *slidingLog) reset()            { l.ts = nil }

package lease

import (
	"time"
)

// This file holds what keeps a new master or a restarted server from
// granting again what its clients still hold: learning mode, the lease
// watermark and the horizon.

// raiseWatermark durably saves a new watermark, now + 2 × the longest
// lease length (at least exp), before a lease ending at exp is granted, so
// that saves come about once per lease length. It reports whether the save
// succeeded.
func (t *Table) raiseWatermark(now, exp int64) bool {
	w := max(now+2*t.maxLease, exp)
	if err := t.wsave(time.UnixMicro(w)); err != nil {
		return false
	}
	t.wmark = w
	return true
}

// SetWatermark makes the table keep a lease watermark: before granting any
// lease that ends after the watermark (initially until), it calls save with
// a new one, now + 2 × the longest lease length configured, which save must
// write durably before it returns. If save fails, the lease is granted with
// capacity 0. A server restarted from the saved watermark knows that no
// lease it granted before ends after it (StartLearningUntil). save is
// called with the table locked, about once per lease length.
func (t *Table) SetWatermark(until time.Time, save func(until time.Time) error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.wmark, t.wsave = until.UnixMicro(), save
	if until.IsZero() {
		t.wmark = 0
	}
}

// StartLearning puts every resource in learning mode for its LearningMode
// duration, from now: called on becoming master. In learning mode a client
// gets back what it reports holding (Request.Has, capped so that the sum
// stays within the capacity), and a client holding nothing gets 0.
func (t *Table) StartLearning() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.learning, t.learnAt, t.learnEnd = true, t.clock.NowMicro(), 0
	for _, rs := range t.res {
		rs.learnTo = t.learnAt + rs.conf.LearningMode.Microseconds()
	}
}

// StartLearningUntil puts every resource in learning mode until end (as
// StartLearning does, but to a fixed end): called on a restart when leases
// granted before it may be outstanding until end (SetWatermark's saved
// watermark). An end not after now changes nothing.
func (t *Table) StartLearningUntil(end time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now, e := t.clock.NowMicro(), end.UnixMicro()
	if e <= now {
		return
	}
	t.learning, t.learnAt, t.learnEnd = true, now, e
	for _, rs := range t.res {
		rs.learnTo = e
	}
}

// Horizon returns when the last lease that a client may still hold ends:
// the latest expiry of every unexpired lease the table granted (older ones
// a lost response may have left included), and, after StartLearningUntil,
// that end while it is ahead (leases granted before a restart). The zero
// time when nothing may be held. A server that stops gracefully saves it
// as its watermark, so that a restart learns only while leases are out.
func (t *Table) Horizon() time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.clock.NowMicro()
	t.expire(now)
	var h int64
	if t.learning && t.learnEnd > now {
		h = t.learnEnd
	}
	for _, rs := range t.res {
		for _, e := range rs.list {
			if e.cur.live(now) {
				h = max(h, e.cur.exp)
			}
			for _, g := range e.olds {
				if g.live(now) {
					h = max(h, g.exp)
				}
			}
		}
	}
	if h == 0 {
		return time.Time{}
	}
	return time.UnixMicro(h)
}

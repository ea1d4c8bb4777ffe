// Package clock provides the clocks Floodgate reads time from: Coarse, a
// cached wall clock cheap enough to read on every decision; Precise, which
// reads the system clock each time; and Manual, a clock that moves only
// when told to, for exact and fast tests.
//
// All of them report time as microseconds since the Unix epoch, the unit
// of every Floodgate state, and can sleep, so that waiting code sleeps on
// the same clock it measures with.
package clock

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Resolution is the granularity of the Coarse clock.
const Resolution = time.Millisecond

// Coarse is a wall clock cached in memory and refreshed every Resolution
// by a background goroutine, so reading it costs an atomic load instead of
// a system call (time.Now costs about 50 ns on a virtual machine, more than
// the rest of a decision). The goroutine runs only while the clock is read:
// it stops after a second without readers and restarts on the next read.
// Readings are at most about one Resolution behind real time, which makes
// a limiter at most that much stricter, never looser.
var Coarse = &coarse{}

type coarse struct {
	now     atomic.Int64
	used    atomic.Bool
	running atomic.Bool
	mu      sync.Mutex
}

// NowMicro returns the cached time in microseconds since the epoch.
func (c *coarse) NowMicro() int64 {
	if !c.used.Load() {
		// The first read after an idle second: start the loop unless it
		// runs, under c.mu, which the loop holds while it decides to stop.
		// used is set there, after now is current: a reader that finds
		// used set reads the time of a running loop. Setting it before
		// start let a concurrent reader take the time the clock held
		// before the start (0, the epoch, in a new process; the loop's
		// last tick after an idle stop) and decide a key's first request
		// at it: the key's next decision, at the real time, refilled what
		// that one took (a bucket of 5 admitted 6).
		c.start()
	}
	return c.now.Load()
}

// start refreshes the time and starts the loop unless it runs, then marks
// the clock used (under c.mu, so that the loop cannot decide to stop in
// between and leave it frozen).
func (c *coarse) start() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.running.Load() {
		c.now.Store(time.Now().UnixMicro())
		c.running.Store(true)
		go c.loop()
	}
	c.used.Store(true)
}

func (c *coarse) loop() {
	t := time.NewTicker(Resolution)
	defer t.Stop()
	idle := int(time.Second / Resolution)
	for i := 1; ; i++ {
		<-t.C
		c.now.Store(time.Now().UnixMicro())
		if i%idle != 0 || c.used.Swap(false) {
			continue
		}
		c.mu.Lock()
		if c.used.Load() {
			c.mu.Unlock()
			continue
		}
		c.running.Store(false)
		c.mu.Unlock()
		return
	}
}

// Sleep waits for d or until ctx is done, whichever is first.
func (c *coarse) Sleep(ctx context.Context, d time.Duration) error {
	return sleep(ctx, d)
}

// Precise reads the system clock on every call.
var Precise precise

type precise struct{}

// NowMicro returns time.Now in microseconds since the epoch.
func (precise) NowMicro() int64 { return time.Now().UnixMicro() }

// Sleep waits for d or until ctx is done, whichever is first.
func (precise) Sleep(ctx context.Context, d time.Duration) error { return sleep(ctx, d) }

func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Manual is a clock that moves only when Advance or Set is called. Sleepers
// wake when the clock reaches their wake time. The zero value starts at the
// Unix epoch; it is safe for concurrent use.
type Manual struct {
	mu      sync.Mutex
	now     int64
	waiters []waiter
	changed chan struct{} // closed when the set of sleepers changes
}

type waiter struct {
	at int64
	ch chan struct{}
}

// NewManual returns a manual clock set to t.
func NewManual(t time.Time) *Manual { return &Manual{now: t.UnixMicro()} }

// NowMicro returns the clock's time in microseconds since the epoch.
func (m *Manual) NowMicro() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.now
}

// Now returns the clock's time.
func (m *Manual) Now() time.Time { return time.UnixMicro(m.NowMicro()) }

// Advance moves the clock forward by d and wakes the sleepers it passes.
func (m *Manual) Advance(d time.Duration) { m.SetMicro(m.NowMicro() + d.Microseconds()) }

// Set moves the clock to t (backwards too, to test clock skew).
func (m *Manual) Set(t time.Time) { m.SetMicro(t.UnixMicro()) }

// SetMicro moves the clock to us microseconds since the epoch.
func (m *Manual) SetMicro(us int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.now = us
	kept := m.waiters[:0]
	for _, w := range m.waiters {
		if w.at <= us {
			close(w.ch)
		} else {
			kept = append(kept, w)
		}
	}
	m.waiters = kept
	m.notify()
}

func (m *Manual) notify() {
	if m.changed != nil {
		close(m.changed)
		m.changed = nil
	}
}

// Sleep blocks until the clock has advanced by d or ctx is done.
func (m *Manual) Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	m.mu.Lock()
	w := waiter{at: m.now + d.Microseconds(), ch: make(chan struct{})}
	m.waiters = append(m.waiters, w)
	m.notify()
	m.mu.Unlock()
	select {
	case <-w.ch:
		return nil
	case <-ctx.Done():
		m.mu.Lock()
		for i, x := range m.waiters {
			if x.ch == w.ch {
				m.waiters = append(m.waiters[:i], m.waiters[i+1:]...)
				break
			}
		}
		m.notify()
		m.mu.Unlock()
		return ctx.Err()
	}
}

// Sleepers returns how many goroutines are sleeping on the clock.
func (m *Manual) Sleepers() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.waiters)
}

// WaitForSleepers blocks until at least n goroutines sleep on the clock or
// ctx is done, so a test can advance the clock exactly when its sleepers
// are in place instead of sleeping and hoping.
func (m *Manual) WaitForSleepers(ctx context.Context, n int) error {
	for {
		m.mu.Lock()
		if len(m.waiters) >= n {
			m.mu.Unlock()
			return nil
		}
		if m.changed == nil {
			m.changed = make(chan struct{})
		}
		ch := m.changed
		m.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

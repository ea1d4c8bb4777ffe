package redisstore

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/floodgate/floodgate"
)

// A busy host looks like a dead Redis: a process that the machine starves
// of CPU (a load of 15 on 2 cores) notices Redis's replies late, and its
// calls run out of time though Redis answered each in microseconds. Counted
// as Redis's failures, those timeouts opened the breaker, and every
// decision went to the failure modes for the cooldown: a healthy Redis,
// and a fail-open quota admitting all comers.
//
// So the store tells a slow caller from a slow Redis. A goroutine of its
// own (the lag monitor) sleeps lagEvery again and again and records each
// wake-up that came late, when and by how much: the time this process was
// runnable and not running (the machine's other processes had the CPU, or
// this process's other goroutines did, or the garbage collector stopped
// the world). A call that timed out is not held against Redis (the breaker
// is not told) when both:
//
//   - this process lost at least a quarter of the call's time to such
//     lag, between the call's start and the moment its caller noticed the
//     timeout (a wake-up still owed counts too: the monitor itself may
//     not have run yet), or a quarter of the time since Redis last
//     answered (a timeout can surface later than it happened: a new
//     connection whose handshake ran out of time while the process was
//     stopped fails the next calls at once, with that timeout); and
//   - Redis answered some call of this store within the last
//     max(500ms, 2 × the timeout) of time this process ran (lag
//     excluded).
//
// For a Redis on this host the host's CPU pressure counts as lost time too
// (pressure.go): Redis waits for the CPU like this process.
//
// The first says the time went to waiting for a CPU, not to Redis's work;
// the second bounds the excuse: a Redis that is silent (paused, or a
// partition that drops packets) answers nothing, and once the process has
// run that long without an answer, its timeouts count again, whatever the
// lag, so the breaker still opens on a dead Redis on a busy host. Errors
// other than timeouts (refused connections, replies in error) always
// count. An excused call is still degraded (its caller's time is gone),
// counted in Stats.Timeouts and Stats.Starved, and logged.
const (
	lagEvery    = 5 * time.Millisecond // the monitor's sleep
	lagMinStall = time.Millisecond     // later than this is a stall
	lagRing     = 512                  // stalls kept (at most one per wake-up)
	// refreshEvery is how often the monitor refreshes the adaptive
	// timeout and the lag it reports (Stats.Lag), in wake-ups.
	refreshEvery = int(adaptWindow / lagEvery)
	// excuseFor is how long this process may run without an answer from
	// Redis and still have its timeouts excused (2 × the timeout, if
	// that is longer).
	excuseFor = 500 * time.Millisecond
)

// A stall is a span, in microseconds since the epoch, during which the
// monitor was due to run and did not.
type stall struct{ from, to int64 }

// lagMonitor measures this process's scheduling lag (see above). Its
// methods take times from its clock; only its loop reads the clock.
type lagMonitor struct {
	clk   floodgate.Clock
	every int64        // µs
	last  atomic.Int64 // µs: when the loop last woke (or started)

	mu     sync.Mutex
	stalls [lagRing]stall
	n      int   // stalls recorded so far; the next goes at n % lagRing
	worst  int64 // µs: the longest stall since the last refresh

	lag atomic.Int64 // µs: the longest stall of the last refresh period
}

func newLagMonitor(clk floodgate.Clock) *lagMonitor {
	m := &lagMonitor{clk: clk, every: lagEvery.Microseconds()}
	m.last.Store(clk.NowMicro())
	return m
}

// run samples until ctx ends, calling wake (if not nil) at every wake-up
// with its time, and tick every refreshEvery wake-ups (both after
// observing the wake-up).
func (m *lagMonitor) run(ctx context.Context, tick func(), wake func(now int64)) {
	for i := 1; ; i++ {
		t0 := m.clk.NowMicro()
		m.last.Store(t0)
		if m.clk.Sleep(ctx, lagEvery) != nil {
			return
		}
		now := m.clk.NowMicro()
		m.observe(t0+m.every, now)
		if wake != nil {
			wake(now)
		}
		if i%refreshEvery == 0 {
			m.refresh()
			if tick != nil {
				tick()
			}
		}
	}
}

// observe records a wake-up due at due that came at woke.
func (m *lagMonitor) observe(due, woke int64) {
	m.last.Store(woke)
	if woke-due < lagMinStall.Microseconds() {
		return
	}
	m.mu.Lock()
	m.stalls[m.n%lagRing] = stall{due, woke}
	m.n++
	m.worst = max(m.worst, woke-due)
	m.mu.Unlock()
}

// refresh publishes the longest stall since the last refresh (Stats.Lag).
func (m *lagMonitor) refresh() {
	m.mu.Lock()
	m.lag.Store(m.worst)
	m.worst = 0
	m.mu.Unlock()
}

// starved returns how much of [from, to] this process spent stalled: the
// recorded stalls' overlap with it, and the part after the wake-up the
// monitor still owes (due at its last wake-up plus lagEvery, and late by
// more than lagMinStall at to).
func (m *lagMonitor) starved(from, to int64) time.Duration {
	if to <= from {
		return 0
	}
	overlap := func(a, b int64) int64 { return max(0, min(b, to)-max(a, from)) }
	var us int64
	if due := m.last.Load() + m.every; to-due >= lagMinStall.Microseconds() {
		us += overlap(due, to)
	}
	m.mu.Lock()
	for i := m.n - 1; i >= 0 && i >= m.n-lagRing; i-- {
		s := m.stalls[i%lagRing]
		if s.to <= from {
			break // stalls are recorded in order of time
		}
		us += overlap(s.from, s.to)
	}
	m.mu.Unlock()
	return time.Duration(min(us, to-from)) * time.Microsecond
}

// excuse is the store's side of the above: the monitor, the host's
// pressure (for a Redis on this host: pressure.go), and the last time
// Redis answered.
type excuse struct {
	mon    *lagMonitor
	host   *hostPressure // nil: Redis is elsewhere, or the host has no PSI
	lastOK atomic.Int64  // µs: when a call last came back from Redis
	// lag is mon.starved: how long this process was stalled between two
	// times (µs); hostLag is host.starved, or nil. Tests set their own.
	lag, hostLag func(from, to int64) time.Duration
	stop         context.CancelFunc
	done         chan struct{}
}

// startMonitor starts the store's lag monitor, which also reads the host's
// pressure when Redis is on this host (local) and refreshes the adaptive
// timeout; Close stops it.
func (s *Store) startMonitor(clk floodgate.Clock, local bool) {
	m := newLagMonitor(clk)
	ctx, cancel := context.WithCancel(context.Background())
	ex := &excuse{mon: m, lag: m.starved, stop: cancel, done: make(chan struct{})}
	if read := readPressureFile(); local && read != nil {
		ex.host = &hostPressure{read: read}
		ex.hostLag = ex.host.starved
	}
	ex.lastOK.Store(clk.NowMicro()) // rueidis connected: Redis answered
	s.ex = ex
	go func() {
		defer close(ex.done)
		i := 0
		m.run(ctx, func() {
			if s.adapt != nil {
				s.adapt.refresh()
			}
		}, func(now int64) {
			if i++; ex.host != nil && i%pressureEvery == 0 {
				ex.host.sample(now)
			}
		})
	}()
}

// stopMonitor stops the lag monitor and waits for it.
func (s *Store) stopMonitor() {
	s.ex.stop()
	<-s.ex.done
}

// answered notes that a call that started at start (µs) came back from
// Redis: Redis answers, and the call's latency feeds the adaptive timeout.
func (s *Store) answered(start int64) {
	now := time.Now().UnixMicro()
	if s.adapt != nil {
		s.adapt.observe(now - start)
	}
	// a store per millisecond at most: the field is shared by every caller
	if now-s.ex.lastOK.Load() >= 1000 {
		s.ex.lastOK.Store(now)
	}
}

// excused reports whether err, the failure of a call that started at start
// (µs) under sctx, is this process's (or, for a Redis on this host, the
// host's) starvation rather than Redis's failure (see above and
// pressure.go), and the time the call lost.
func (s *Store) excused(err error, sctx context.Context, start int64) (bool, time.Duration) {
	if !errors.Is(err, context.DeadlineExceeded) {
		return false, 0
	}
	dl, ok := sctx.Deadline()
	if !ok {
		return false, 0
	}
	now := time.Now().UnixMicro()
	lost := func(from int64) time.Duration {
		l := s.ex.lag(from, now)
		if s.ex.hostLag != nil {
			l = max(l, s.ex.hostLag(from, now))
		}
		return l
	}
	budget := dl.UnixMicro() - start
	lostCall := lost(start)
	ok1 := s.ex.lastOK.Load()
	starved := budget > 0 && lostCall.Microseconds()*4 >= budget
	if !starved && ok1 < start {
		// an error left by an earlier attempt in the same starvation (a
		// connection whose handshake ran out of time), which rueidis
		// gives the next calls at once
		starved = lost(ok1).Microseconds()*4 >= now-ok1
	}
	if !starved {
		return false, lostCall
	}
	ran := time.Duration(now-ok1)*time.Microsecond - s.ex.lag(ok1, now)
	return ran <= max(excuseFor, 2*s.timeout()), lostCall
}

// breakerOpens is how many times the store's breakers opened.
func (s *Store) breakerOpens() int64 {
	var n int64
	for i := range s.brks {
		n += s.brks[i].opens.Load()
	}
	return n
}

package throttle

import (
	"context"
	"errors"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/clock"
)

// Config configures a Throttler.
type Config struct {
	// Clock is what the throttler reads time from: clock.Precise if nil
	// (the coarse clock's millisecond is too long for the latency of a
	// cheap request). Tests use a clock.Manual.
	Clock floodgate.Clock
	// Limit is the concurrency limit, the requests run at once: fixed,
	// or the starting point of the adaptive controller. 2×GOMAXPROCS if 0.
	Limit int
	// Adaptive, if set, learns the limit from latency (see AdaptiveConfig).
	Adaptive *AdaptiveConfig
	// MaxQueueCost bounds the queue by the total predicted cost (CPU
	// time) of the requests it holds, not by their count. An arrival that
	// does not fit evicts less critical queued requests, or is refused.
	// 0 means no queue: a request that cannot run at once is refused.
	// MaxWait × the processors (the work the server can do in the
	// longest wait it allows) is a good size: a smaller queue fills with
	// critical requests during a stall of the host and refuses them.
	MaxQueueCost time.Duration
	// MaxWait bounds a request's wait in the queue: one still queued
	// after it is dropped before it runs (as is one past the deadline it
	// came with). 0 means only the request's own deadline bounds it.
	// Once the throttler has measured how fast it drains, a request
	// below CRITICAL predicted to wait past its deadline is refused at
	// arrival, and one a more critical arrival pushes past it is evicted
	// at once (see ErrQueueFull, ErrEvicted).
	MaxWait time.Duration
	// Rate, if above 0, makes the throttler a shaper with a fixed
	// outflow (the leaky bucket of the seed articles): requests start at
	// most Rate a second, evenly spaced, whatever their number in flight
	// (Limit still caps it if set; Adaptive is ignored). Queued requests
	// are started by a goroutine sleeping on Clock, which runs only while
	// the queue holds something.
	Rate float64
	// CPUs is the number of processors the wall-time cost estimate scales
	// by (see Ticket.Done); GOMAXPROCS if 0.
	CPUs int
	// ProcessCPU returns the CPU time the process has used so far, for
	// the utilization the wall-time cost estimate scales by (Ticket.Done):
	// on Linux getrusage(RUSAGE_SELF) if nil; elsewhere, or if it returns
	// a negative value, the process is taken to have all CPUs to itself.
	ProcessCPU func() time.Duration
	// Cost configures the cost model.
	Cost CostConfig
}

// Errors a request is refused with. All of them mean the server sheds
// the request (HTTP 503, gRPC UNAVAILABLE), not that a quota is spent.
var (
	// ErrQueueFull: the queue's predicted cost is at its bound and holds
	// nothing less critical to evict; or, for a level below CRITICAL,
	// its predicted wait (the cost queued ahead of it over what the
	// server drains for its level) exceeds its deadline, so it would be
	// dropped there: it is refused at once instead.
	ErrQueueFull = errors.New("throttle: admission queue full")
	// ErrEvicted: a more critical arrival took the request's place.
	ErrEvicted = errors.New("throttle: evicted from the admission queue by a more critical request")
	// ErrExpired: the request waited past its deadline (or MaxWait) and
	// was dropped before it ran.
	ErrExpired = errors.New("throttle: deadline passed in the admission queue")
)

// Throttler is the admission controller: a concurrency limit, a queue
// bounded by predicted cost, criticality. Safe for concurrent use.
type Throttler struct {
	clock   floodgate.Clock
	maxCost int64 // µs
	maxWait int64 // µs
	cpus    float64
	procCPU func() time.Duration

	mu         sync.Mutex
	util       utilization
	limit      int
	interval   int64 // µs between two starts with a Rate; 0: no rate
	next       int64 // the earliest start of the next request with a Rate
	pacing     bool  // the pacer goroutine runs
	inflight   int
	queue      [numLevels]tlist
	queued     int
	queuedCost int64 // µs, the sum of the queued tickets' predictions
	model      *costModel
	adaptive   *vegas
	drain      drainRate

	stats counters
}

// counters are read without the lock, by Stats and the metrics.
type counters struct {
	admitted                  atomic.Uint64
	suspended, readmitted     atomic.Uint64
	refused, evicted, expired [numLevels]atomic.Uint64
	withdrawn                 [numLevels]atomic.Uint64
	predicted, actual, absErr atomic.Int64 // µs, over completions
	completions               atomic.Uint64
	limit, inflight, queued   atomic.Int64
	queuedCost                atomic.Int64
}

// invariant, when set by a test, is called under the lock after every
// change of the queue or of in-flight: the cost bound and the limit must
// hold at every instant, not only when someone looks.
var invariant func(t *Throttler)

// New returns a Throttler.
func New(c Config) *Throttler {
	t := &Throttler{clock: c.Clock, maxCost: c.MaxQueueCost.Microseconds(),
		maxWait: c.MaxWait.Microseconds(), cpus: float64(c.CPUs), limit: c.Limit}
	if t.clock == nil {
		t.clock = clock.Precise
	}
	if t.cpus <= 0 {
		t.cpus = float64(runtime.GOMAXPROCS(0))
	}
	t.procCPU = c.ProcessCPU
	if t.procCPU == nil {
		t.procCPU = processCPU
	}
	t.util.share = 1 // until measured
	if t.limit <= 0 {
		t.limit = 2 * runtime.GOMAXPROCS(0)
	}
	t.model = newCostModel(c.Cost)
	if c.Rate > 0 {
		t.interval = max(1, int64(1e6/c.Rate))
		if c.Limit <= 0 {
			t.limit = math.MaxInt32
		}
		c.Adaptive = nil
	}
	if c.Adaptive != nil {
		t.adaptive = newVegas(*c.Adaptive, t.limit)
		t.limit = t.adaptive.limit
	}
	t.stats.limit.Store(int64(t.limit))
	return t
}

// Ticket is one request's passage through the throttler, from Enter to
// Done.
type Ticket struct {
	th         *Throttler
	key        RouteKey
	crit       Criticality
	predicted  int64 // µs
	deadline   int64 // µs since the epoch; 0: none
	given      int64 // the deadline the caller gave (before MaxWait), for Resume
	start      int64 // when it was admitted
	startLoad  int   // in flight when it was admitted, itself included
	cpu0       int64 // the process's CPU time when it was admitted (µs, estimated)
	state      uint8
	again      bool          // entered again by Resume: its admission is a readmission
	ready      chan struct{} // closed when a queued ticket leaves the queue
	prev, next *Ticket
	dctx       ticketCtx // Context's
}

const (
	waiting uint8 = iota
	admitted
	evicted
	expired
	withdrawn
	finished
	suspended // gave its slot back for a delay (Suspend), to Resume
)

// Enter asks to run a request of route key and criticality crit whose
// caller gives up at deadline (µs since the epoch on the throttler's
// clock; 0 for none). It returns a ticket that is either admitted (run
// the request, then call Done) or queued (call Wait), or an error when
// the request is refused at once (ErrQueueFull).
func (t *Throttler) Enter(key RouteKey, crit Criticality, deadline int64) (*Ticket, error) {
	if !crit.Valid() {
		crit = DefaultCriticality
	}
	return t.enter(&Ticket{}, key, crit, deadline)
}

// enter is Enter into a zeroed ticket the caller provides (the
// middleware's come from a pool).
func (t *Throttler) enter(tk *Ticket, key RouteKey, crit Criticality, deadline int64) (*Ticket, error) {
	now := t.clock.NowMicro()
	tk.given = deadline
	if t.maxWait > 0 && (deadline == 0 || now+t.maxWait < deadline) {
		deadline = now + t.maxWait
	}
	tk.th, tk.key, tk.crit, tk.deadline = t, key, crit, deadline
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.queued == 0 && t.canStart(now) {
		t.admit(tk, now)
		t.changed()
		return tk, nil
	}
	tk.predicted = t.model.predict(key)
	if crit < Critical && t.wouldExpire(crit, deadline, now) || !t.makeRoom(tk.predicted, crit, now) {
		t.stats.refused[crit].Add(1)
		return nil, ErrQueueFull
	}
	tk.ready = make(chan struct{})
	t.queue[crit].pushBack(tk)
	t.queued++
	t.queuedCost += tk.predicted
	t.drain.queuedCost(crit, tk.predicted)
	t.dropPushedBack(crit, now)
	t.ensurePacer()
	t.changed()
	return tk, nil
}

// wouldExpire reports whether a request of level crit arriving at now
// would still be queued at its deadline: the predicted cost queued at
// its level and above (what dispatch starts before it) exceeds what the
// server drains for its level by then. That is the measured drain rate
// less the rate at which more critical work arrives (it will be
// dispatched first). Such a request is refused at once rather than after
// waiting to its deadline: the refusal is cheaper for the server and
// earlier for the client. Nothing is refused this way before the rate
// has been measured under saturation.
func (t *Throttler) wouldExpire(crit Criticality, deadline, now int64) bool {
	r := t.drain.rate
	if r <= 0 || deadline == 0 {
		return false
	}
	for l := crit + 1; l < numLevels; l++ {
		r -= t.drain.arrival[l]
	}
	ahead := func() (c int64) {
		for l := crit; l < numLevels; l++ {
			c += t.queue[l].cost
		}
		return c
	}
	budget := max(r, 0) * float64(deadline-now)
	if float64(ahead()) <= budget {
		return false
	}
	t.dropExpired(now)
	return float64(ahead()) > budget
}

// dropPushedBack evicts, at once, the queued requests below level crit
// that an arrival of crit pushed past their deadline: the newest of each
// lower level while the predicted cost ahead of it (everything queued at
// its level and above) exceeds what the server drains by its deadline.
// They would be dropped at their deadline anyway; now their callers hear
// it without waiting. As wouldExpire, nothing before the drain rate is
// measured.
func (t *Throttler) dropPushedBack(crit Criticality, now int64) {
	r := t.drain.rate
	if r <= 0 {
		return
	}
	var above int64 // queued cost at the levels above l
	for l := numLevels - 1; l >= int(crit); l-- {
		above += t.queue[l].cost
	}
	for l := int(crit) - 1; l >= 0; l-- {
		for v := t.queue[l].tail; v != nil && v.deadline != 0; v = t.queue[l].tail {
			ahead := above + t.queue[l].cost - v.predicted
			if float64(ahead) <= r*float64(v.deadline-now) {
				break
			}
			t.remove(v, evicted)
			t.stats.evicted[l].Add(1)
		}
		above += t.queue[l].cost
	}
}

// drainRate is the rate at which the server completes predicted cost
// (CPU µs per µs), and the rate at which each level's requests join the
// queue (their predicted cost per µs), measured only while requests
// wait (the server runs at its limit, so what completes is its capacity,
// not its demand): averages over 100 ms spans, weighted 1/4 for the
// newest.
type drainRate struct {
	rate    float64 // 0 until measured
	arrival [numLevels]float64
	acc     int64 // cost completed since since
	joined  [numLevels]int64
	since   int64 // start of the span (µs); 0 when not saturated
}

// queuedCost books a request of level l and predicted cost c joining the
// queue.
func (d *drainRate) queuedCost(l Criticality, c int64) {
	if d.since != 0 {
		d.joined[l] += c
	}
}

// completed books a completion of cost at now; saturated says whether
// requests wait.
func (d *drainRate) completed(cost, now int64, saturated bool) {
	switch {
	case !saturated:
		d.since = 0
	case d.since == 0:
		d.since, d.acc, d.joined = now, 0, [numLevels]int64{}
	default:
		d.acc += cost
		if el := now - d.since; el >= 100_000 {
			first := d.rate == 0
			d.rate = ewma(d.rate, float64(d.acc)/float64(el), first)
			for l := range d.arrival {
				d.arrival[l] = ewma(d.arrival[l], float64(d.joined[l])/float64(el), first)
			}
			d.since, d.acc, d.joined = now, 0, [numLevels]int64{}
		}
	}
}

func ewma(old, v float64, first bool) float64 {
	if first {
		return v
	}
	return old + (v-old)/4
}

// makeRoom reports whether a request of predicted cost c and level crit
// fits in the queue, after dropping expired requests and, if that is not
// enough, evicting less critical ones (the least critical first, the
// newest of a level first). It evicts nothing unless that makes it fit.
func (t *Throttler) makeRoom(c int64, crit Criticality, now int64) bool {
	if c > t.maxCost {
		return false
	}
	if t.queuedCost+c <= t.maxCost {
		return true
	}
	t.dropExpired(now)
	need := t.queuedCost + c - t.maxCost
	if need <= 0 {
		return true
	}
	var lower int64
	for l := Criticality(0); l < crit; l++ {
		lower += t.queue[l].cost
	}
	if lower < need {
		return false
	}
	for l := Criticality(0); need > 0; l++ {
		for need > 0 && t.queue[l].tail != nil {
			v := t.queue[l].tail
			t.remove(v, evicted)
			t.stats.evicted[l].Add(1)
			need -= v.predicted
		}
	}
	return true
}

// dropExpired drops the queued requests whose deadline passed, from the
// head of each level (the oldest) while they are expired.
func (t *Throttler) dropExpired(now int64) {
	for l := range t.queue {
		for h := t.queue[l].head; h != nil && h.deadline != 0 && h.deadline <= now; h = t.queue[l].head {
			t.remove(h, expired)
			t.stats.expired[l].Add(1)
		}
	}
}

// remove takes a queued ticket out of the queue with its new state and
// wakes its waiter.
func (t *Throttler) remove(tk *Ticket, state uint8) {
	t.queue[tk.crit].remove(tk)
	t.queued--
	t.queuedCost -= tk.predicted
	tk.state = state
	close(tk.ready)
}

// canStart reports whether a request may start at now: a free slot and,
// with a Rate, its turn.
func (t *Throttler) canStart(now int64) bool {
	return t.inflight < t.limit && (t.interval == 0 || now >= t.next)
}

// ensurePacer starts the pacer if a Rate is set, something is queued, a
// slot is free and it does not run (under t.mu).
func (t *Throttler) ensurePacer() {
	if t.interval > 0 && !t.pacing && t.queued > 0 && t.inflight < t.limit {
		t.pacing = true
		go t.pace()
	}
}

// pace starts queued requests at the Rate, sleeping on the clock until
// each one's turn. It ends when the queue is empty or the limit is full
// (a completion starts it again).
func (t *Throttler) pace() {
	for {
		t.mu.Lock()
		now := t.clock.NowMicro()
		t.dispatch(now)
		t.changed()
		if t.queued == 0 || t.inflight >= t.limit {
			t.pacing = false
			t.mu.Unlock()
			return
		}
		wait := max(t.next-now, 1)
		t.mu.Unlock()
		t.clock.Sleep(context.Background(), time.Duration(wait)*time.Microsecond) //nolint:errcheck // never canceled
	}
}

func (t *Throttler) admit(tk *Ticket, now int64) {
	if t.interval > 0 {
		t.next = max(t.next, now) + t.interval
	}
	t.inflight++
	tk.state = admitted
	tk.start = now
	tk.startLoad = t.inflight
	tk.cpu0 = t.cpuAt(now)
	if tk.again {
		t.stats.readmitted.Add(1) // a request is admitted once: see Resume
	} else {
		t.stats.admitted.Add(1)
	}
}

// dispatch admits queued requests, the most critical first and FIFO
// within a level, while the limit allows; expired ones are dropped, not
// run.
func (t *Throttler) dispatch(now int64) {
	for t.queued > 0 && t.canStart(now) {
		l := numLevels - 1
		for t.queue[l].head == nil {
			l--
		}
		tk := t.queue[l].head
		if tk.deadline != 0 && tk.deadline <= now {
			t.remove(tk, expired)
			t.stats.expired[l].Add(1)
			continue
		}
		t.remove(tk, admitted)
		t.admit(tk, now)
	}
}

func (t *Throttler) changed() {
	t.stats.inflight.Store(int64(t.inflight))
	t.stats.queued.Store(int64(t.queued))
	t.stats.queuedCost.Store(t.queuedCost)
	t.stats.limit.Store(int64(t.limit))
	if invariant != nil {
		invariant(t)
	}
}

// Admitted reports whether the ticket may run now.
func (tk *Ticket) Admitted() bool {
	tk.th.mu.Lock()
	defer tk.th.mu.Unlock()
	return tk.state == admitted
}

// Criticality returns the level the ticket entered with.
func (tk *Ticket) Criticality() Criticality { return tk.crit }

// Predicted returns the cost predicted for the request when it was
// queued (0 for one admitted at once, which was never predicted).
func (tk *Ticket) Predicted() time.Duration { return time.Duration(tk.predicted) * time.Microsecond }

// Wait waits until a queued ticket is admitted (nil: run the request,
// then call Done), evicted (ErrEvicted), dropped at its deadline
// (ErrExpired), or ctx ends (ctx's error: the ticket leaves the queue).
// For a ticket admitted at Enter it returns nil at once.
func (tk *Ticket) Wait(ctx context.Context) error {
	if tk.ready == nil {
		return nil
	}
	select {
	case <-tk.ready:
	case <-ctx.Done():
		t := tk.th
		t.mu.Lock()
		if tk.state == waiting {
			t.remove(tk, withdrawn)
			t.stats.withdrawn[tk.crit].Add(1)
			t.changed()
			t.mu.Unlock()
			return ctx.Err()
		}
		t.mu.Unlock()
	}
	return tk.result()
}

func (tk *Ticket) result() error {
	tk.th.mu.Lock()
	defer tk.th.mu.Unlock()
	switch tk.state {
	case admitted:
		return nil
	case evicted:
		return ErrEvicted
	case expired:
		return ErrExpired
	}
	return context.Canceled
}

// Done ends an admitted request whose cost was not measured: its cost is
// estimated as the CPU time the process used while it ran, shared among
// the requests in flight (their count at its start and end averaged), at
// most its wall time. The process's CPU time is read at most every 10 ms
// (Config.ProcessCPU) and extrapolated in between. That is right for
// CPU-bound handlers, whether the host gives the process all its
// processors or a part of them, and stalls of the process cost nothing;
// a handler waiting on I/O in a busy process is charged a share of what
// the others burn.
func (tk *Ticket) Done() { tk.finish(-1) }

// DoneCost ends an admitted request that cost cpu (measured, for example
// as its thread's CPU time: see Middleware's ThreadCPU option).
func (tk *Ticket) DoneCost(cpu time.Duration) { tk.finish(max(0, cpu.Microseconds())) }

func (tk *Ticket) finish(cost int64) {
	t := tk.th
	now := t.clock.NowMicro()
	t.mu.Lock()
	defer t.mu.Unlock()
	if tk.state == suspended {
		tk.state = finished // it holds nothing: its delay ended it (the client left)
		return
	}
	if tk.state != admitted {
		return // Done twice, or on a ticket that never ran: nothing to give back
	}
	tk.state = finished
	wall := max(0, now-tk.start)
	if cost < 0 {
		cost = t.wallCost(tk, now, wall)
	}
	t.inflight--
	pred := t.model.predict(tk.key)
	rc := t.model.observe(tk.key, cost)
	t.stats.predicted.Add(pred)
	t.stats.actual.Add(cost)
	t.stats.absErr.Add(max(pred-cost, cost-pred))
	t.stats.completions.Add(1)
	// A probe's spans are not the server's capacity: it runs below its limit.
	t.drain.completed(cost, now, t.queued > 0 && (t.adaptive == nil || !t.adaptive.probing))
	if t.adaptive != nil {
		t.limit = t.adaptive.sample(rc, now, tk.start, wall, tk.startLoad)
	}
	t.dispatch(now)
	t.ensurePacer()
	t.changed()
}

// utilization follows the process's CPU time, read at most every 10 ms
// of the throttler's clock and extrapolated in between at the last
// interval's rate, so that reading it per request costs no system call.
type utilization struct {
	at, cpu int64   // when last read (µs), and the process CPU then (µs)
	share   float64 // CPU time / (CPUs × elapsed) over the last interval, in (0, 1]
	last    int64   // the last value returned: the estimate never goes back
}

// cpuAt returns the process's CPU time at now (µs), estimated (under t.mu).
func (t *Throttler) cpuAt(now int64) int64 {
	u := &t.util
	if now-u.at >= 10_000 || u.at == 0 {
		cpu := t.procCPU().Microseconds()
		switch {
		case cpu < 0:
			u.share, u.cpu = 1, int64(t.cpus*float64(now))
		case u.at != 0 && cpu >= u.cpu && now > u.at:
			u.share = min(1, max(0.01, float64(cpu-u.cpu)/(t.cpus*float64(now-u.at))))
			u.cpu = cpu
		default:
			u.cpu = cpu
		}
		u.at = now
	}
	est := u.cpu + int64(u.share*t.cpus*float64(max(0, now-u.at)))
	u.last = max(u.last, est)
	return u.last
}

// wallCost estimates the CPU cost of a request that ran from its start
// to now: the process's CPU time over that span shared among the
// requests in flight (the count at its start and end averaged), at most
// its wall time (under t.mu).
func (t *Throttler) wallCost(tk *Ticket, now, wall int64) int64 {
	used := t.cpuAt(now) - tk.cpu0
	load := max(1, float64(tk.startLoad+t.inflight)/2)
	return min(wall, max(0, int64(float64(used)/load)))
}

// Stats is a snapshot of a throttler's state and counters.
type Stats struct {
	Limit, InFlight, Queued int
	QueuedCost              time.Duration // predicted, of what the queue holds
	// Admitted counts the requests admitted, each once: a request
	// admitted again when its delay ends (Resume) is counted in
	// Readmitted, not here.
	Admitted uint64
	// Suspended counts the admitted requests that gave their slot back
	// to wait out a delay (Ticket.Suspend); Readmitted, those of them
	// admitted again when it ended (Ticket.Resume). The rest were shed
	// then (and are counted in Refused, Evicted, Expired or Withdrawn),
	// their clients left during the delay, or they are in it now.
	Suspended, Readmitted uint64
	// Refused (queue full), Evicted, Expired (dropped at the deadline) and
	// Withdrawn (the caller left) count by criticality.
	Refused, Evicted, Expired, Withdrawn [numLevels]uint64
	// Completions, with the sums of their predicted and measured costs
	// and of the absolute differences.
	Completions                    uint64
	Predicted, Actual, AbsoluteErr time.Duration
}

// Stats returns the throttler's current state and counters.
func (t *Throttler) Stats() Stats {
	s := &t.stats
	st := Stats{Limit: int(s.limit.Load()), InFlight: int(s.inflight.Load()), Queued: int(s.queued.Load()),
		QueuedCost: us(s.queuedCost.Load()), Admitted: s.admitted.Load(), Completions: s.completions.Load(),
		Suspended: s.suspended.Load(), Readmitted: s.readmitted.Load(),
		Predicted: us(s.predicted.Load()), Actual: us(s.actual.Load()), AbsoluteErr: us(s.absErr.Load())}
	for l := range numLevels {
		st.Refused[l], st.Evicted[l] = s.refused[l].Load(), s.evicted[l].Load()
		st.Expired[l], st.Withdrawn[l] = s.expired[l].Load(), s.withdrawn[l].Load()
	}
	return st
}

func us(v int64) time.Duration { return time.Duration(v) * time.Microsecond }

// Predict returns the cost the model predicts now for a request of route
// k.
func (t *Throttler) Predict(k RouteKey) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	return us(t.model.predict(k))
}

// tlist is one level's FIFO of queued tickets, with their summed cost.
type tlist struct {
	head, tail *Ticket
	cost       int64
}

func (l *tlist) pushBack(t *Ticket) {
	t.prev, t.next = l.tail, nil
	if l.tail != nil {
		l.tail.next = t
	} else {
		l.head = t
	}
	l.tail = t
	l.cost += t.predicted
}

func (l *tlist) remove(t *Ticket) {
	if t.prev != nil {
		t.prev.next = t.next
	} else {
		l.head = t.next
	}
	if t.next != nil {
		t.next.prev = t.prev
	} else {
		l.tail = t.prev
	}
	t.prev, t.next = nil, nil
	l.cost -= t.predicted
}

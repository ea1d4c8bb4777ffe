package redisstore

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/algo"
)

// Write-back (floodgate.TierWriteBack; docs/REDIS.md "Write-back").
//
// A hot key of a write-back rule is decided in memory: from the count Redis
// last returned for its window plus this process's unsynced hits. The hits
// of every such key go to Redis in one pipelined call (WriteBackFunction,
// one FCALL per key) every Options.WriteBackInterval, or sooner once a key
// has taken half its hit threshold, and each reply brings back the key's
// global count.
//
// The bound. With n live nodes (heartbeats: nodes.go) and a rule of limit
// L and budget B, a node admits locally at most N = floor(B×L/n) hits
// after the start of its last successful sync; past N it decides exactly
// (one call that also carries its unsynced hits). So at any moment each
// node holds at most N admissions the others cannot see, and a window ends
// at most n×N <= B×L over its limit. A node also decides exactly when
// N < 1 (the budget cannot be kept: B×L < n) and, for a fixed window,
// while the count it read is within n×N of the limit (a margin for a node
// count that has grown since the heartbeats last said). It refuses locally only when the count it read
// plus its own hits leave no room, which the true count (never lower)
// confirms. Redis lost: local admissions go on up to N, then the exact
// decisions meet the rule's failure mode.
//
// Scope: policies of one rule, a fixed window with a period or a sliding
// window counter, mode hard; OpAllow only, and not in an all-or-nothing
// group. Anything else is decided exactly.
//
// Memory: at most Options.WriteBackKeys entries; a key is promoted (hot)
// when it takes at least wbHotHits decisions in wbRateSpan, demoted when it
// falls below a quarter of that, and forgotten after wbIdle without
// decisions. A full table replaces a cold entry, or decides the new key
// exactly.
type writeBack struct {
	s        *Store
	interval time.Duration
	maxKeys  int
	hotHits  int64
	nodes    *nodeSet

	mu      sync.Mutex
	m       map[lsKey]*wbEntry
	dmu     sync.Mutex
	dirty   []*wbEntry // entries with something to sync (wbEntry.dirty)
	rules   sync.Map   // label → *wbRuleStats
	lastNow atomic.Int64

	local, syncs, exact, full atomic.Int64
	// admitted is every local admission's cost, summed: a new entry's
	// running total starts from it (idempotent syncs)
	admitted  atomic.Int64
	recSuffix string // ":wb:" and this node's id: its record of a key

	once   sync.Once
	kick   chan struct{}
	stop   chan struct{}
	wg     sync.WaitGroup
	closed atomic.Bool
}

const (
	wbRateSpan = 100 * time.Millisecond // the span a key's rate is measured over
	wbIdle     = 2 * time.Second        // an entry without decisions this long goes
)

// wbRuleStats is a rule's measured error (Store.TierErrors).
type wbRuleStats struct {
	over, under, unmeasured atomic.Int64
}

// TierError is a write-back rule's measured error since the store started:
// the requests a window admitted beyond the rule's limit (Overshoot), and
// the requests refused locally that Redis's count showed room for
// (Undershoot). Each process counts what its own syncs measured; a fleet's
// error is the sum over its processes. Unmeasured counts admitted hits
// that reached Redis after their window had left its state (two windows
// on), or in a sync whose reply was lost (sent again, it applies nothing:
// wbsync.go): the overshoot of that window may be larger by as much.
type TierError struct {
	Rule                              string // the policy's name, '/', the rule's name
	Overshoot, Undershoot, Unmeasured int64
}

// TierErrors returns every write-back rule's measured error.
func (s *Store) TierErrors() []TierError {
	var out []TierError
	s.wb.rules.Range(func(k, v any) bool {
		rs := v.(*wbRuleStats)
		out = append(out, TierError{Rule: k.(string), Overshoot: rs.over.Load(), Undershoot: rs.under.Load(), Unmeasured: rs.unmeasured.Load()})
		return true
	})
	return out
}

// wbPolicy is what write-back needs of a policy, kept with it.
type wbPolicy struct {
	ok     bool
	p      algo.Params
	name   string // the rule's
	sig    string
	budget float64
	rs     *wbRuleStats
}

type wbAttach struct{}

// noWBPolicy is every exact policy's wbPolicy: not write-back.
var noWBPolicy wbPolicy

func (w *writeBack) policy(pol *floodgate.Policy) *wbPolicy {
	c := compiledOf(pol)
	if !c.Tiered {
		return &noWBPolicy // an exact policy pays no lookup
	}
	if v, ok := c.Attached.Load(wbAttach{}); ok {
		return v.(*wbPolicy)
	}
	wp := &wbPolicy{}
	rules := pol.Rules()
	if len(rules) == 1 && rules[0].Tier == floodgate.TierWriteBack {
		p := c.Params[0]
		if (p.Kind == algo.FixedWindow && p.Cal == algo.CalNone || p.Kind == algo.SlidingCounter) && p.Soft == 0 && p.Elastic == 0 {
			pa := newPolicyArgs(pol)
			label := pol.Name() + "/" + rules[0].Name
			v, _ := w.rules.LoadOrStore(label, &wbRuleStats{})
			wp = &wbPolicy{ok: true, p: p, name: pa.static[0], sig: pa.static[1], budget: rules[0].Budget, rs: v.(*wbRuleStats)}
		}
	}
	v, _ := c.Attached.LoadOrStore(wbAttach{}, wp)
	return v.(*wbPolicy)
}

// window returns the start of the window now is in.
func (wp *wbPolicy) window(now int64) int64 {
	ws := now / wp.p.Period * wp.p.Period
	if now < 0 && ws != now {
		ws -= wp.p.Period
	}
	return ws
}

// threshold is N, the most hits a node admits locally between syncs, with
// n live nodes: floor(Budget × Limit / n).
func (wp *wbPolicy) threshold(n int64) int64 {
	if n <= 0 {
		return 0
	}
	return int64(wp.budget * float64(wp.p.Limit) / float64(n))
}

// A wbEntry is one key's write-back state; mu guards it.
type wbEntry struct {
	mu   sync.Mutex
	rkey string
	wp   *wbPolicy
	last int64 // the caller's clock at the last decision (µs)

	rateAt, rateHits int64
	hot              bool

	synced         bool  // the fields below hold a reply
	ws, prev, cur  int64 // Redis's state at the last reply
	pendWin, pend  int64 // unsynced admitted hits, of window pendWin
	flying         int64 // of pend, sent in a sync not yet answered
	adm, syncedAdm int64 // local admissions; adm at the start of the last successful sync

	refWin, refused, refMin int64 // local refusals in window refWin not yet checked
	refAt                   int64 // the last one's time
	refCheck                int64 // when the refusals last asked for a sync

	// total is the node's running total of hits admitted locally on the
	// key, from writeBack.admitted at the entry's making (so above all a
	// former entry of the key sent): a sync carries it (idempotent syncs)
	total int64

	wait  chan struct{} // closed when the sync in flight with hits answers
	dirty bool          // in writeBack.dirty
}

func newWriteBack(s *Store, opts Options) *writeBack {
	w := &writeBack{s: s, interval: opts.WriteBackInterval, maxKeys: opts.WriteBackKeys,
		m: make(map[lsKey]*wbEntry), kick: make(chan struct{}, 1), stop: make(chan struct{})}
	// hot: at least two decisions per sync interval, measured over wbRateSpan
	w.hotHits = max(2, int64(2*wbRateSpan/w.interval))
	w.nodes = s.nodes
	w.recSuffix = ":wb:" + s.nodes.id
	return w
}

// begin starts the flusher and the heartbeats, on the first write-back
// decision.
func (w *writeBack) begin() {
	w.once.Do(func() {
		if w.closed.Load() {
			return
		}
		w.wg.Add(1)
		go w.run()
	})
}

func (w *writeBack) close() {
	if w.closed.Swap(true) {
		return
	}
	w.once.Do(func() {}) // none starts after this
	close(w.stop)
	w.wg.Wait()
}

// decide makes op's decision if its key is a hot write-back key; ok is
// false when the store decides it as usual.
func (w *writeBack) decide(ctx context.Context, now int64, op *floodgate.Op) (d floodgate.Decision, ok bool, err error) {
	wp := w.policy(op.Policy)
	// (before Redis 7 there is no function library: exact)
	if !wp.ok || op.Cost <= 0 || w.closed.Load() || w.s.scriptMode.Load() {
		return d, false, nil
	}
	w.begin()
	w.noteNow(now)
	e := w.entry(op, wp, now)
	if e == nil {
		return d, false, nil
	}
	e.mu.Lock()
	e.last = now
	if !e.rate(now, w.hotHits) {
		e.mu.Unlock()
		return d, false, nil
	}
	e.mu.Unlock()
	d, err = w.hot(ctx, now, op, e)
	return d, true, err
}

// hot decides op on its hot key's entry e.
func (w *writeBack) hot(ctx context.Context, now int64, op *floodgate.Op, e *wbEntry) (floodgate.Decision, error) {
	wp := e.wp
	n := w.nodes.live()
	L, cost := wp.p.Limit, op.Cost
	N := wp.threshold(n)
	waited := false
again:
	e.mu.Lock()
	ws := wp.window(now)
	if e.mustCall(N, cost, ws) {
		e.mu.Unlock()
		return w.exactly(ctx, now, op, e)
	}
	prev, cur := e.at(ws)
	if e.pend > 0 {
		cur += e.pend
	}
	est := used(&wp.p, ws, prev, cur, now)
	if est+cost > L { // the true count is no lower: exact refuses too
		w.refused(e, ws, now, cost)
		d := e.decision(false, ws, prev, cur, now, cost)
		e.mu.Unlock()
		w.local.Add(1)
		return d, nil
	}
	g := used(&wp.p, ws, prev, cur-e.pend, now)
	// Near a fixed window's limit, exactly: that costs about Budget×Limit
	// calls a window. A saturated sliding window counter frees room all
	// the time, so it would be exact always; its threshold bounds it.
	if wp.p.Kind != algo.SlidingCounter && g+n*N+cost > L {
		e.mu.Unlock()
		return w.exactly(ctx, now, op, e)
	}
	if e.adm-e.syncedAdm+cost > N {
		// past the threshold: wait once for the sync in flight, whose
		// reply may leave room, rather than call Redis beside it
		ch := e.wait
		e.mu.Unlock()
		if ch == nil || waited {
			return w.exactly(ctx, now, op, e)
		}
		if err := waitFor(ctx, ch); err != nil {
			return floodgate.Decision{}, err
		}
		waited = true
		goto again
	}
	e.pend += cost
	e.pendWin = ws
	e.adm += cost
	e.total += cost
	w.admitted.Add(cost)
	w.markDirty(e)
	d := e.decision(true, ws, prev, cur+cost, now, cost)
	half := e.adm-e.syncedAdm >= max(1, N/2)
	e.mu.Unlock()
	w.local.Add(1)
	if half { // the flusher syncs now, not at its next tick
		select {
		case w.kick <- struct{}{}:
		default:
		}
	}
	return d, nil
}

// mustCall reports whether e (locked) is to be decided in Redis whatever
// its count: the budget cannot be kept (N < 1), the cost is above the
// limit (Redis says it is too large), Redis's count is not known yet, or
// hits of an ended window are unsynced.
func (e *wbEntry) mustCall(N, cost, ws int64) bool {
	return N < 1 || cost > e.wp.p.Limit || !e.synced || (e.pend > 0 && e.pendWin != ws)
}

// refused books a local refusal on e (locked), to be checked against
// Redis's count (checkRefusals).
func (w *writeBack) refused(e *wbEntry, ws, now, cost int64) {
	if e.refWin != ws || e.refused == 0 {
		e.refWin, e.refused, e.refMin = ws, 0, cost
	}
	e.refused += cost
	e.refMin = min(e.refMin, cost)
	e.refAt = now
	// refusals alone ask for a sync (to be checked) at most every ten
	// intervals: a key that only refuses costs Redis little
	if now-e.refCheck >= 10*w.interval.Microseconds() {
		e.refCheck = now
		w.markDirty(e)
	}
}

func (w *writeBack) noteNow(now int64) {
	for {
		l := w.lastNow.Load()
		if now <= l || w.lastNow.CompareAndSwap(l, now) {
			return
		}
	}
}

// rate counts a decision and reports whether the key is hot.
func (e *wbEntry) rate(now, hotHits int64) bool {
	e.rateHits++
	if span := wbRateSpan.Microseconds(); now-e.rateAt >= span {
		switch {
		case e.rateAt == 0:
		case e.rateHits >= hotHits*(now-e.rateAt)/span:
			e.hot = true
		case e.hot && e.rateHits < hotHits*(now-e.rateAt)/span/4 && e.pend == 0:
			e.hot, e.synced = false, false
		}
		e.rateAt, e.rateHits = now, 0
	}
	return e.hot
}

// entry returns op's key's entry, made if there is room; nil when the
// table is full of hot keys.
func (w *writeBack) entry(op *floodgate.Op, wp *wbPolicy, now int64) *wbEntry {
	k := lsKey{op.Policy.Name(), op.Key}
	w.mu.Lock()
	defer w.mu.Unlock()
	if e := w.m[k]; e != nil {
		if e.wp == wp {
			return e
		}
		// a new version of the policy: its state starts again from Redis
		e.mu.Lock()
		idle := e.pend == 0 && e.flying == 0
		e.mu.Unlock()
		if !idle {
			return nil
		}
		delete(w.m, k)
	}
	if len(w.m) >= w.maxKeys && !w.evictCold() {
		w.full.Add(1)
		return nil
	}
	e := &wbEntry{rkey: w.s.Key(op.Policy.Name(), op.Key), wp: wp, rateAt: now, total: w.admitted.Load()}
	w.m[k] = e
	return e
}

// evictCold removes, of the first few cold entries the map yields, the one
// with the fewest decisions in its current rate span (a flood's keys have
// one or two; a key turning hot has many).
func (w *writeBack) evictCold() bool {
	var victim lsKey
	least, tried := int64(-1), 0
	for k, e := range w.m {
		if tried++; tried > 8 {
			break
		}
		e.mu.Lock()
		cold, hits := !e.hot && e.pend == 0 && e.flying == 0, e.rateHits
		e.mu.Unlock()
		if cold && (least < 0 || hits < least) {
			victim, least = k, hits
		}
	}
	if least < 0 {
		return false
	}
	delete(w.m, victim)
	return true
}

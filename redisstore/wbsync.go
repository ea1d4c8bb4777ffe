package redisstore

import (
	"context"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/algo"
)

// A wbSync is one key's part of a sync: what it sends.
type wbSync struct {
	e             *wbEntry
	done          chan struct{} // e.wait, made by this sync
	tag, hits     int64
	total         int64 // e.total as the sync left (0: no hits)
	adm           int64
	refWin, refdn int64
}

// snapshot takes what a sync of e sends: its hits not yet sent (with their
// window), or, with none, the window of refusals to check.
func (e *wbEntry) snapshot() wbSync {
	sn := wbSync{e: e, hits: e.pend - e.flying, adm: e.adm}
	switch {
	case sn.hits > 0:
		sn.tag = e.pendWin
	case e.refused > 0:
		sn.tag = e.refWin
	}
	e.flying += sn.hits
	if sn.hits > 0 {
		sn.total = e.total
	}
	if sn.hits > 0 && e.wait == nil {
		e.wait = make(chan struct{})
		sn.done = e.wait
	}
	return sn
}

// applyReply takes a sync's reply v (or its failure) into e, and counts the
// error it measured.
func (e *wbEntry) applyReply(sn wbSync, v []int64, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.flying -= sn.hits
	if sn.done != nil {
		close(sn.done)
		e.wait = nil
	}
	if err != nil || len(v) < 7 {
		return
	}
	e.pend -= sn.hits
	e.syncedAdm = max(e.syncedAdm, sn.adm)
	ws, prev, cur := v[3], v[4], v[5]
	switch {
	case !e.synced || ws > e.ws:
		e.ws, e.prev, e.cur = ws, prev, cur
	case ws == e.ws:
		e.prev, e.cur = max(e.prev, prev), max(e.cur, cur)
	}
	e.synced = true
	applied := sn.hits
	if sn.total > 0 && len(v) >= 8 {
		applied = v[7]
	}
	e.measure(applied, v[1], v[2])
	// hits an earlier sync applied: one whose reply was lost (its overshoot
	// went unmeasured), or one that arrived after this one
	if n := sn.hits - applied; n > 0 {
		e.wp.rs.unmeasured.Add(n)
	}
	if sn.tag != 0 && sn.tag == e.refWin && e.refused > 0 {
		e.checkRefusals(sn.tag, v)
	}
}

// args are WriteBackFunction's arguments for a sync sn deciding cost.
func (w *writeBack) args(now int64, sn wbSync, cost int64) []string {
	if !w.s.opts.ClientTime {
		now = 0
	}
	wp := sn.e.wp
	return []string{strconv.FormatInt(now, 10), wp.name, wp.sig, strconv.FormatInt(sn.tag, 10),
		strconv.FormatInt(sn.hits, 10), strconv.FormatInt(cost, 10)}
}

// fcall is WriteBackFunction's call for sync sn; one with hits carries
// the node's record of the key and its running total (idempotent syncs).
func (w *writeBack) fcall(sn wbSync, args []string) rueidis.Completed {
	e := sn.e
	if sn.total > 0 {
		return w.s.client.B().Fcall().Function(WriteBackFunction).Numkeys(2).Key(e.rkey, e.rkey+w.recSuffix).
			Arg(args...).Arg(strconv.FormatInt(sn.total, 10)).Build()
	}
	return w.s.client.B().Fcall().Function(WriteBackFunction).Numkeys(1).Key(e.rkey).Arg(args...).Build()
}

// exactly decides op in Redis, in the call that carries the key's unsynced
// hits; when Redis cannot answer, the rule's failure mode decides.
func (w *writeBack) exactly(ctx context.Context, now int64, op *floodgate.Op, e *wbEntry) (floodgate.Decision, error) {
	s := w.s
	brk := s.breakerFor(e.rkey)
	if !brk.allow() {
		return s.degrade(ctx, now, op, nil), nil
	}
	start := time.Now()
	sctx, ok := s.storeContextAt(ctx, start)
	if !ok {
		if ctx.Err() != nil {
			return floodgate.Decision{}, ctx.Err()
		}
		return s.degrade(ctx, now, op, errNoTime), nil
	}
	e.mu.Lock()
	sn := e.snapshot()
	others := e.flying - sn.hits // in syncs not answered yet
	e.mu.Unlock()
	cost := op.Cost
	if op.Kind == floodgate.OpPeek {
		cost = 0
	}
	s.calls.Add(1)
	w.exact.Add(1)
	v, err := w.do(sctx, []rueidis.Completed{w.fcall(sn, w.args(now, sn, cost))})[0].AsIntSlice()
	w.replied(sn, v, err)
	if err == nil && len(v) >= 7 {
		s.answered(start.UnixMicro())
		brk.success()
		e.mu.Lock()
		defer e.mu.Unlock()
		if op.Kind == floodgate.OpPeek {
			return e.peekDecision(v, others, op.Cost), nil
		}
		return e.decision(v[0] == 1, v[3], v[4], v[5], max(v[6], v[3]), op.Cost), nil
	}
	if ctx.Err() != nil {
		return floodgate.Decision{}, ctx.Err()
	}
	s.failed(brk, err, sctx, start.UnixMicro())
	return s.degrade(ctx, now, op, err), nil
}

// do sends cmds in one pipeline, loading the library first if Redis lacks
// it.
func (w *writeBack) do(ctx context.Context, cmds []rueidis.Completed) []rueidis.RedisResult {
	s := w.s
	if !s.libLoaded.Load() {
		if err := s.loadLibrary(ctx); err != nil {
			return errResults(len(cmds), err)
		}
	}
	// pinned: rueidis recycles a sent command unless pinned, and a
	// library that Redis lost (a restart without its data) sends them
	// again (unpinned, that second send panicked)
	for i := range cmds {
		cmds[i] = cmds[i].Pin()
	}
	res := s.client.DoMulti(ctx, cmds...)
	if len(res) > 0 && notLoaded(res[0].Error()) {
		s.libLoaded.Store(false)
		if err := s.loadLibrary(ctx); err != nil {
			return errResults(len(cmds), err)
		}
		res = s.client.DoMulti(ctx, cmds...)
	}
	return res
}

func errResults(n int, err error) []rueidis.RedisResult {
	res := make([]rueidis.RedisResult, n)
	for i := range res {
		res[i] = rueidis.NewErrorResult(err)
	}
	return res
}

// run is the flusher: every interval (or when a key has taken half its
// threshold) it syncs every key with unsynced hits, and every second it
// drops idle entries. It runs the heartbeats too.
func (w *writeBack) run() {
	defer w.wg.Done()
	tick := time.NewTicker(w.interval)
	defer tick.Stop()
	w.nodes.beat()
	lastBeat, lastSweep := time.Now(), time.Now()
	for {
		select {
		case <-w.stop:
			w.flush()
			w.nodes.leave()
			return
		case <-tick.C:
		case <-w.kick:
		}
		w.flush()
		if time.Since(lastBeat) >= nodesBeatEvery {
			w.nodes.beat()
			lastBeat = time.Now()
		}
		if time.Since(lastSweep) >= time.Second {
			w.sweep()
			lastSweep = time.Now()
		}
	}
}

// flush syncs, in one pipelined call, every key with unsynced hits or
// refusals to check.
func (w *writeBack) flush() {
	w.dmu.Lock()
	dirty := w.dirty
	w.dirty = nil
	w.dmu.Unlock()
	var sns []wbSync
	for _, e := range dirty {
		e.mu.Lock()
		e.dirty = false
		if e.pend-e.flying > 0 || e.refused > 0 {
			sns = append(sns, e.snapshot())
		}
		e.mu.Unlock()
	}
	if len(sns) == 0 {
		return
	}
	s := w.s
	brk := s.breakerFor(sns[0].e.rkey)
	if !brk.allow() {
		for _, sn := range sns {
			w.replied(sn, nil, errBreakerOpen)
		}
		return
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout())
	defer cancel()
	cmds := make([]rueidis.Completed, len(sns))
	now := w.lastNow.Load()
	for i, sn := range sns {
		cmds[i] = w.fcall(sn, w.args(now, sn, 0))
	}
	w.syncs.Add(1)
	var firstErr error
	for i, r := range w.do(ctx, cmds) {
		v, err := r.AsIntSlice()
		w.replied(sns[i], v, err)
		if err != nil && firstErr == nil {
			firstErr = err
		}
	}
	if firstErr == nil {
		brk.success()
	} else {
		s.failed(brk, firstErr, ctx, start.UnixMicro())
	}
}

// sweep drops the entries idle for wbIdle with nothing to sync.
func (w *writeBack) sweep() {
	cut := w.lastNow.Load() - wbIdle.Microseconds()
	w.mu.Lock()
	defer w.mu.Unlock()
	for k, e := range w.m {
		e.mu.Lock()
		idle := e.last < cut && e.pend == 0 && e.flying == 0
		e.mu.Unlock()
		if idle {
			delete(w.m, k)
		}
	}
}

// wbStats are Stats' write-back counters.
func (w *writeBack) stats(st *Stats) {
	st.WriteBackLocal, st.WriteBackExact, st.WriteBackSyncs = w.local.Load(), w.exact.Load(), w.syncs.Load()
	st.WriteBackNodes = w.nodes.live()
	w.mu.Lock()
	st.WriteBackKeys = len(w.m)
	w.mu.Unlock()
}

// alone reports whether op, in a batch, is decided on its own (Do): an
// OpAllow or OpPeek of a write-back policy.
func (w *writeBack) alone(op *floodgate.Op) bool {
	return (op.Kind == floodgate.OpAllow || op.Kind == floodgate.OpPeek) && w.policy(op.Policy).ok
}

// split decides a batch (no group) whose write-back ops go one by one
// (each is a local decision or its own call), the others as a batch.
func (s *Store) split(ctx context.Context, now int64, ops []floodgate.Op, out []floodgate.Decision) (bool, error) {
	var rest []int
	for i := range ops {
		if !s.wb.alone(&ops[i]) {
			rest = append(rest, i)
		}
	}
	if len(rest) == len(ops) {
		return false, nil
	}
	for i := range ops {
		if s.wb.alone(&ops[i]) {
			d, err := s.Do(ctx, now, ops[i])
			if err != nil {
				return true, err
			}
			out[i] = d
		}
	}
	if len(rest) == 0 {
		return true, nil
	}
	rops, rout := make([]floodgate.Op, len(rest)), make([]floodgate.Decision, len(rest))
	for j, i := range rest {
		rops[j] = ops[i]
	}
	if err := s.doBatch(ctx, now, rops, nil, rout); err != nil {
		return true, err
	}
	for j, i := range rest {
		out[i] = rout[j]
	}
	return true, nil
}

// measure counts what hits took their window's count from before to
// after beyond the limit (after -1: the window was gone).
func (e *wbEntry) measure(hits, before, after int64) {
	L := e.wp.p.Limit
	switch {
	case hits > 0 && after >= 0:
		if o := max(0, after-L) - max(0, before-L); o > 0 {
			e.wp.rs.over.Add(o)
		}
	case hits > 0:
		e.wp.rs.unmeasured.Add(hits)
	}
}

// checkRefusals counts as undershoot the local refusals of window tag that
// the reply v shows Redis had room for: its count for the window (with,
// for a sliding window counter, the window before, weighted at the last
// refusal) plus the smallest refused cost within the limit.
func (e *wbEntry) checkRefusals(tag int64, v []int64) {
	p := &e.wp.p
	after, prev := v[2], int64(0)
	if p.Kind == algo.SlidingCounter {
		if v[3] != tag {
			after = -1 // the window before is gone from the reply
		}
		prev = v[4]
	}
	if after >= 0 {
		if u := used(p, tag, prev, after, e.refAt); u+e.refMin <= p.Limit {
			e.wp.rs.under.Add(min(e.refused, p.Limit-u))
		}
	}
	e.refused = 0
}

// markDirty puts e (locked) on the flusher's list, once.
func (w *writeBack) markDirty(e *wbEntry) {
	if e.dirty {
		return
	}
	e.dirty = true
	w.dmu.Lock()
	w.dirty = append(w.dirty, e)
	w.dmu.Unlock()
}

// replied applies a sync's reply to its entry, which goes back on the
// flusher's list if something is still to sync (a failed sync's hits).
func (w *writeBack) replied(sn wbSync, v []int64, err error) {
	e := sn.e
	e.applyReply(sn, v, err)
	e.mu.Lock()
	if e.pend-e.flying > 0 || e.refused > 0 {
		w.markDirty(e)
	}
	e.mu.Unlock()
}

// waitFor waits for ch to close, or for ctx's end.
func waitFor(ctx context.Context, ch chan struct{}) error {
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

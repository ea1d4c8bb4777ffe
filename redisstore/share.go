package redisstore

import (
	"context"
	"errors"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/algo"
	"github.com/floodgate/floodgate/storekit"
)

// Local share (floodgate.TierLocalShare; docs/REDIS.md "Local share").
//
// A hot key of a policy whose every rule is local_share is decided from a
// slice: a number of requests of the current window that this store took
// from Redis in one call of ShareFunction (97_share.lua), which counts the
// slice on Redis as admitted at once. The store spends the slice in
// memory until the window ends, and gives back what is left when the key
// goes idle and on Close. No node can spend what Redis did not count, so
// the fleet never admits more than exact mode; a slice stranded on a node
// that died is lost until its window ends.
//
// Slices are sized from the key's rate on this node (what it asks for in
// shareHorizon) and capped at the remaining quota over twice the live
// nodes (heartbeats on Redis), so a key near its limit gets slices of one
// request: exact. Only keys asked for at least Options.ShareHotRate times
// in a second on this node are promoted, at most Options.ShareKeys at once;
// the others are decided exactly.

const (
	shareSweep    = 50 * time.Millisecond
	shareHorizon  = 100_000 // µs of this node's demand a slice is sized for (at most a tenth of the window)
	shareIdle     = 250_000 // µs without a decision after which a key's slice is given back
	shareBackWait = time.Second
)

// noSharePlan is every exact policy's sharePlan: not local share.
var noSharePlan sharePlan

// sharePlan is what local share needs of a policy: whether every rule is
// local_share (a fixed window with a period), and their windows.
type sharePlan struct {
	ok      bool
	periods []int64 // µs, per rule
	limit   int64   // the smallest limit
	names   []string
	mixed   bool // periods differ: a slice that expires is still counted by the longer windows
}

type sharePlanKey struct{}

func sharePlanOf(p *floodgate.Policy) *sharePlan {
	if !compiledOf(p).Tiered {
		return &noSharePlan // an exact policy pays no lookup
	}
	return storekit.Attached(p, sharePlanKey{}, func() any {
		rules := p.Rules()
		pl := &sharePlan{ok: true, limit: math.MaxInt64}
		for i, pa := range compiledOf(p).Params {
			if rules[i].Tier != floodgate.TierLocalShare || pa.Kind != algo.FixedWindow || pa.Cal != algo.CalNone {
				return &sharePlan{}
			}
			pl.periods = append(pl.periods, pa.Period)
			pl.names = append(pl.names, rules[i].Name)
			pl.limit = min(pl.limit, pa.Limit)
			if pa.Period != pl.periods[0] {
				pl.mixed = true
			}
		}
		return pl
	}).(*sharePlan)
}

// window is the part of every rule's window around t: [from, to).
func (pl *sharePlan) window(t int64) (from, to int64) {
	from, to = math.MinInt64, math.MaxInt64
	for _, p := range pl.periods {
		ws := t - ((t%p)+p)%p
		from, to = max(from, ws), min(to, ws+p)
	}
	return from, to
}

// slice is one key's slice on this node.
type slice struct {
	fetch sync.Mutex // held by the one caller taking a slice for the key
	mu    sync.Mutex // guards the fields below
	dead  bool       // swept: decide exactly
	pol   *floodgate.Policy
	left  int64 // requests of the slice not spent
	t0    int64 // Redis's time when it was taken (µs)
	from  int64 // this node's time the slice may be spent from (µs)
	until int64 // and until
	full  bool  // Redis had nothing left: refuse until until
	// from the last take: the deciding rule, its limit, what Redis had left
	rule             int
	limit, remaining int64
	last             int64   // this node's time of the last decision
	lastTake         int64   // and of the last take
	demand           int64   // requests asked for since the last take
	rate             float64 // requests per µs, smoothed
}

// shares are a store's slices.
type shares struct {
	s       *Store
	max     int
	hot     int32
	mu      sync.RWMutex
	keys    map[string]*slice
	seen    map[string]int32 // cold keys' decisions in second seenAt
	seenAt  int64
	start   sync.Once
	started atomic.Bool
	stop    chan struct{}
	done    chan struct{}
	now     atomic.Int64 // the latest time a decision was made at (ClientTime's sweep clock)
	closed  atomic.Bool

	takes, local, back, lost atomic.Int64
}

func newShares(s *Store) *shares {
	return &shares{s: s, max: s.opts.ShareKeys, hot: int32(s.opts.ShareHotRate),
		keys: map[string]*slice{}, seen: map[string]int32{}, stop: make(chan struct{}), done: make(chan struct{})}
}

// lookup returns key's slice, promoting the key when it is hot and there
// is room; nil: decide exactly.
func (sh *shares) lookup(ctx context.Context, key string, now int64, p *floodgate.Policy) *slice {
	sh.mu.RLock()
	e := sh.keys[key]
	sh.mu.RUnlock()
	if e != nil || sh.closed.Load() {
		return e
	}
	sh.mu.Lock()
	if e = sh.keys[key]; e != nil {
		sh.mu.Unlock()
		return e
	}
	if sec := now / 1e6; sec != sh.seenAt || len(sh.seen) >= 4*sh.max {
		clear(sh.seen)
		sh.seenAt = sec
	}
	sh.seen[key]++
	if sh.seen[key] < sh.hot || len(sh.keys) >= sh.max {
		sh.mu.Unlock()
		return nil
	}
	delete(sh.seen, key)
	e = &slice{pol: p, last: now}
	sh.keys[key] = e
	sh.mu.Unlock()
	sh.start.Do(func() {
		sh.started.Store(true)
		sh.s.nodes.beat() // the live count before the first slice is sized
		go sh.run()
	})
	return e
}

// decide decides op from key's slice; handled false: decide exactly.
//
// Slices are spent by the store's own clock t, which Redis's windows are
// mapped onto (took): the caller's now (ClientTime, tests), else the
// system clock read here, not a cached clock that may lag (clock.Coarse),
// which would let a slice be spent past its window's end.
func (sh *shares) decide(ctx context.Context, now int64, op *floodgate.Op, key string, pl *sharePlan) (floodgate.Decision, bool, error) {
	if op.Cost <= 0 || op.Cost > pl.limit {
		return floodgate.Decision{}, false, nil
	}
	t := now
	if sh.s.opts.ClientTime {
		sh.saw(now)
	} else {
		t = time.Now().UnixMicro()
	}
	e := sh.lookup(ctx, key, t, op.Policy)
	if e == nil {
		return floodgate.Decision{}, false, nil
	}
	e.mu.Lock()
	if e.dead || t < e.from {
		// t is before the slice's window (a caller that read the clock
		// before another took it): Redis decides
		e.mu.Unlock()
		return floodgate.Decision{}, false, nil
	}
	e.last = t
	e.demand += op.Cost
	if d, ok := e.spend(t, op.Cost, pl); ok {
		e.mu.Unlock()
		sh.local.Add(1)
		return d, true, nil
	}
	e.mu.Unlock()
	return sh.refill(ctx, now, t, op, key, pl, e)
}

// saw keeps now as the latest time a decision was made at.
func (sh *shares) saw(now int64) {
	for {
		t := sh.now.Load()
		if now <= t || sh.now.CompareAndSwap(t, now) {
			return
		}
	}
}

// spend decides from the slice alone, if it can: admits when it holds
// cost, refuses when Redis had nothing left. e.mu is held.
func (e *slice) spend(t, cost int64, pl *sharePlan) (floodgate.Decision, bool) {
	if t < e.from || t >= e.until {
		return floodgate.Decision{}, false
	}
	d := floodgate.Decision{Limit: e.limit, Rule: pl.names[e.rule], ResetAfter: time.Duration(e.until-t) * time.Microsecond}
	switch {
	case e.left >= cost:
		e.left -= cost
		d.Allowed, d.Remaining = true, e.remaining+e.left
		return d, true
	case e.full:
		d.Reason, d.Remaining, d.RetryAfter = floodgate.ReasonLimited, e.remaining+e.left, d.ResetAfter
		return d, true
	}
	return floodgate.Decision{}, false
}

// want sizes the next slice at t. e.mu is held.
func (e *slice) want(t, cost int64, pl *sharePlan, live int64) int64 {
	if e.lastTake > 0 && t > e.lastTake {
		r := float64(e.demand) / float64(t-e.lastTake)
		if e.rate == 0 {
			e.rate = r
		} else {
			e.rate = (e.rate + r) / 2
		}
	}
	horizon := float64(shareHorizon)
	for _, p := range pl.periods {
		horizon = min(horizon, float64(p)/10)
	}
	w := int64(math.Min(e.rate*horizon, float64(pl.limit))) + cost
	base := pl.limit
	if t >= e.from && t < e.until { // what Redis had left in this window
		base = e.remaining
	}
	return max(cost, min(w, base/(2*max(live, 1))))
}

// refill takes a slice for op (giving back what is left of an expired one
// whose longer windows still count it) and decides op from it, or by the
// rules' failure modes when Redis cannot answer: prepare, take, finish.
// now is the caller's time, t the store's (decide).
func (sh *shares) refill(ctx context.Context, now, t int64, op *floodgate.Op, key string, pl *sharePlan, e *slice) (floodgate.Decision, bool, error) {
	e.fetch.Lock()
	defer e.fetch.Unlock()
	a, d, step := sh.prepare(t, op.Cost, pl, e)
	switch step {
	case stepExact:
		return floodgate.Decision{}, false, nil
	case stepDecided:
		return d, true, nil
	}
	r, d, err := sh.take(ctx, now, op, key, a)
	if err != nil || d.Degraded {
		sh.giveUp(a.back)
		return d, true, err
	}
	sh.back.Add(a.back)
	recv := t
	if !sh.s.opts.ClientTime {
		recv = time.Now().UnixMicro()
	}
	return sh.finish(t, recv, r, op.Cost, pl, e), true, nil
}

// shareAsk is what a take gives back (back, of a slice taken at t0) and
// asks for (want).
type shareAsk struct{ back, t0, want int64 }

type refillStep uint8

const (
	stepTake    refillStep = iota // ask Redis
	stepDecided                   // another caller took a slice meanwhile: decided from it
	stepExact                     // the slice is gone, or t is before its window: Redis decides
)

// prepare settles the slice before a take: decided from it if another
// caller refilled it meanwhile, else what to give back and ask for.
func (sh *shares) prepare(t, cost int64, pl *sharePlan, e *slice) (shareAsk, floodgate.Decision, refillStep) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.dead || t < e.from {
		return shareAsk{}, floodgate.Decision{}, stepExact
	}
	if d, ok := e.spend(t, cost, pl); ok {
		sh.local.Add(1)
		return shareAsk{}, d, stepDecided
	}
	var a shareAsk
	if t >= e.until {
		if pl.mixed {
			a.back, a.t0 = e.left, e.t0
		} else if e.left > 0 {
			sh.lost.Add(e.left) // its window is over
		}
		e.left, e.full = 0, false
	}
	a.want = e.want(t, cost-e.left, pl, sh.s.nodes.live())
	return a, floodgate.Decision{}, stepTake
}

// take asks Redis for a slice under the store's breaker and deadline; when
// Redis cannot answer, the rules' failure modes decide op (a Degraded
// decision), or the caller's context ended (an error).
func (sh *shares) take(ctx context.Context, now int64, op *floodgate.Op, key string, a shareAsk) (shareReply, floodgate.Decision, error) {
	brk := sh.s.breakerFor(key)
	if !brk.allow() {
		return shareReply{}, sh.s.degrade(ctx, now, op, nil), nil
	}
	start := time.Now()
	sctx, ok := sh.s.storeContextAt(ctx, start)
	if !ok {
		if ctx.Err() != nil {
			return shareReply{}, floodgate.Decision{}, ctx.Err()
		}
		return shareReply{}, sh.s.degrade(ctx, now, op, errNoTime), nil
	}
	if sh.s.local.busy.Load() > 0 { // local admitted on some key: Redis learns it first
		sh.s.local.settle(sctx, now, []floodgate.Op{*op})
	}
	sh.s.calls.Add(1)
	r, err := sh.call(sctx, brk, now, op.Policy, key, a.t0, a.back, a.want)
	if err != nil {
		if ctx.Err() != nil {
			return shareReply{}, floodgate.Decision{}, ctx.Err()
		}
		sh.s.failed(brk, err, sctx, start.UnixMicro())
		return shareReply{}, sh.s.degrade(ctx, now, op, err), nil
	}
	sh.s.answered(start.UnixMicro())
	brk.success()
	return r, floodgate.Decision{}, nil
}

// finish records the take's reply r and decides a request of cost from
// the slice.
func (sh *shares) finish(t, recv int64, r shareReply, cost int64, pl *sharePlan, e *slice) floodgate.Decision {
	e.mu.Lock()
	defer e.mu.Unlock()
	sh.lost.Add(e.took(r, t, recv, pl))
	if d, ok := e.spend(max(t, e.from), cost, pl); ok {
		return d
	}
	// Redis had less than cost left, or its window ended on the way
	return floodgate.Decision{Limit: e.limit, Rule: pl.names[e.rule], Reason: floodgate.ReasonLimited,
		Remaining: e.remaining, RetryAfter: time.Duration(max(e.until-t, 1000)) * time.Microsecond}
}

// giveUp counts a leftover that could not be given back as lost.
func (sh *shares) giveUp(back int64) { sh.lost.Add(back) }

var errShareReply = errors.New("redisstore: ShareFunction returned fewer than 6 values")

// shareReply is ShareFunction's answer.
type shareReply struct{ granted, now, rule, limit, remaining int64 }

// took records a take answered r, asked at now and answered at recv
// (this node's clock), and returns what it dropped of the earlier slice:
// a leftover of another window than the new slice's. e.mu is held.
func (e *slice) took(r shareReply, now, recv int64, pl *sharePlan) (lost int64) {
	from, to := pl.window(r.now)
	if old, _ := pl.window(e.t0); e.left > 0 && old != from {
		lost, e.left = e.left, 0
	}
	// map Redis's window onto this node's clock, inside it: from by the
	// answer's time, to by the question's (Redis decided in between)
	e.from, e.until = recv+(from-r.now), now+(to-r.now)
	e.t0 = r.now
	e.left += r.granted
	e.rule, e.limit, e.remaining = int(min(max(r.rule, 0), int64(len(pl.names)-1))), r.limit, r.remaining
	e.full = r.remaining == 0 && e.left == 0
	e.lastTake, e.demand = now, 0
	return lost
}

// call makes one call of ShareFunction.
func (sh *shares) call(sctx context.Context, brk *breaker, now int64, p *floodgate.Policy, key string, t0, back, want int64) (shareReply, error) {
	_, args := sh.s.scriptArgs(now, &floodgate.Op{Policy: p, Key: key, Kind: floodgate.OpAllow, Cost: 1})
	args[1], args[2], args[3], args[4] = strconv.FormatInt(t0, 10), strconv.FormatInt(back, 10), strconv.FormatInt(want, 10), "0"
	keys := []string{key}
	do := func() rueidis.RedisResult {
		return sh.s.callFunction(sctx, sh.s.client, ShareFunction, sh.s.shareScript, keys, args)
	}
	var res rueidis.RedisResult
	if brk.troubled.Load() || sh.closed.Load() { // closing: never wait past sctx
		res = within(sctx, do, rueidis.NewErrorResult)
	} else {
		res = do()
	}
	sh.takes.Add(1)
	v, err := res.AsIntSlice()
	if err != nil {
		return shareReply{}, err
	}
	if len(v) < 6 {
		return shareReply{}, errShareReply
	}
	return shareReply{granted: v[0], now: v[1], rule: v[2], limit: v[3], remaining: v[4]}, nil
}

// run beats and sweeps until the store closes.
func (sh *shares) run() {
	defer close(sh.done)
	sweep := time.NewTicker(shareSweep)
	defer sweep.Stop()
	beat := time.NewTicker(nodesBeatEvery)
	defer beat.Stop()
	for {
		select {
		case <-sh.stop:
			return
		case <-beat.C:
			sh.s.nodes.beat()
		case <-sweep.C:
			sh.sweep(sh.clock(), false)
		}
	}
}

// clock is the time sweeps go by: the latest decision's with ClientTime
// (tests' clocks), else the real clock.
func (sh *shares) clock() int64 {
	if sh.s.opts.ClientTime {
		return sh.now.Load()
	}
	return time.Now().UnixMicro()
}

// shareGive is a slice to give back.
type shareGive struct {
	key      string
	t0, left int64
	pol      *floodgate.Policy
}

// sweep forgets the keys idle at now (all of them when all is set), and
// gives back what is left of their slices.
func (sh *shares) sweep(now int64, all bool) {
	var gives []shareGive
	sh.mu.Lock()
	for key, e := range sh.keys {
		if g, ok := sh.retire(e, key, now, all); ok {
			gives = append(gives, g)
		}
	}
	sh.mu.Unlock()
	for _, g := range gives {
		ctx, cancel := context.WithTimeout(context.Background(), shareBackWait)
		_, err := sh.call(ctx, sh.s.breakerFor(g.key), now, g.pol, g.key, g.t0, g.left, 0)
		cancel()
		if err != nil {
			sh.lost.Add(g.left)
		} else {
			sh.back.Add(g.left)
		}
	}
}

// retire forgets key if it is idle at now (or all is set), and returns
// what of its slice to give back: a leftover still in its window (or in a
// longer rule's). sh.mu is held.
func (sh *shares) retire(e *slice, key string, now int64, all bool) (shareGive, bool) {
	if !e.fetch.TryLock() { // a take in flight: not idle, and its slice must find the key
		return shareGive{}, false
	}
	defer e.fetch.Unlock()
	e.mu.Lock()
	defer e.mu.Unlock()
	if !all && now-e.last < shareIdle {
		return shareGive{}, false
	}
	e.dead = true
	delete(sh.keys, key)
	left := e.left
	e.left = 0
	if left > 0 && (now >= e.from && now < e.until || sharePlanOf(e.pol).mixed) {
		return shareGive{key: key, t0: e.t0, left: left, pol: e.pol}, true
	}
	sh.lost.Add(left)
	return shareGive{}, false
}

// close gives back every slice and leaves the live nodes.
func (sh *shares) close() {
	if sh.closed.Swap(true) {
		return
	}
	sh.start.Do(func() {}) // none after this
	close(sh.stop)
	if !sh.started.Load() {
		return
	}
	<-sh.done
	sh.sweep(sh.clock(), true)
	sh.s.nodes.leave()
}

// ShareStats are local share's counters (Stats.Share).
type ShareStats struct {
	Takes    int64 // calls of ShareFunction (takes and give-backs)
	Local    int64 // decisions made from a slice, without Redis
	Keys     int   // keys holding a slice now
	Nodes    int64 // live nodes, last read
	Returned int64 // requests of slices given back to Redis
	Lost     int64 // requests of slices that expired unspent or could not be given back
}

func (sh *shares) stats() ShareStats {
	sh.mu.RLock()
	n := len(sh.keys)
	sh.mu.RUnlock()
	return ShareStats{Takes: sh.takes.Load(), Local: sh.local.Load(), Keys: n, Nodes: sh.s.nodes.live(),
		Returned: sh.back.Load(), Lost: sh.lost.Load()}
}

// drop forgets key's slice (a reset: the key starts again on Redis).
func (sh *shares) drop(key string) {
	sh.mu.Lock()
	e := sh.keys[key]
	delete(sh.keys, key)
	sh.mu.Unlock()
	if e != nil {
		e.mu.Lock()
		e.dead, e.left = true, 0
		e.mu.Unlock()
	}
}

// anyShared reports whether some op of a batch is a local share's.
func (sh *shares) anyShared(ops []floodgate.Op) bool {
	for i := range ops {
		if ops[i].Policy != nil && ops[i].Kind == floodgate.OpAllow && sharePlanOf(ops[i].Policy).ok {
			return true
		}
	}
	return false
}

// batch decides the ops of a batch (independent decisions, DoBatch) that
// are a local share's from their slices, and the others by rest.
func (sh *shares) batch(ctx context.Context, now int64, ops []floodgate.Op, out []floodgate.Decision, rest func([]floodgate.Op, []floodgate.Decision) error) error {
	var idx []int
	for i := range ops {
		op := &ops[i]
		if op.Policy != nil && op.Kind == floodgate.OpAllow {
			if pl := sharePlanOf(op.Policy); pl.ok {
				d, ok, err := sh.decide(ctx, now, op, sh.s.Key(op.Policy.Name(), op.Key), pl)
				if err != nil {
					return err
				}
				if ok {
					out[i] = d
					continue
				}
			}
		}
		idx = append(idx, i)
	}
	if len(idx) == 0 {
		return nil
	}
	rops, rout := make([]floodgate.Op, len(idx)), make([]floodgate.Decision, len(idx))
	for j, i := range idx {
		rops[j] = ops[i]
	}
	if err := rest(rops, rout); err != nil {
		return err
	}
	for j, i := range idx {
		out[i] = rout[j]
	}
	return nil
}

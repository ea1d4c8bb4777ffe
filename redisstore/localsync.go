package redisstore

import (
	"context"
	"hash/maphash"
	"math/bits"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/memstore"
	"github.com/floodgate/floodgate/storekit"
)

// Where Redis and local decisions meet (failure_mode local).
//
// A rule that fails to a local limit is decided in process memory while
// Redis cannot answer, at LocalPercent of its limit. Two things join the
// two deciders, so that a window in which the decider changes does not
// admit the limit twice over:
//
//   - Seeding. The store keeps, for each key of a policy with local rules
//     (and none failing closed) that Redis recently decided, what Redis
//     last said of it: the deciding rule and its remaining. When the key is
//     next decided locally, its local state starts from that: the local
//     rule is charged ceil(used × local capacity / capacity), the share of
//     what Redis had counted (used = capacity − remaining; the capacity is
//     the burst for buckets, the limit for windows), at the time Redis said
//     it, so a window that has ended since or a bucket that has refilled
//     counts for what it still does. With N instances at 100/N percent,
//     each thus admits its share of what was left. The charge is exact for
//     the rule the reply named (the one with the fewest remaining, or for
//     a denial the one that denied); a policy's other local rules are
//     charged the same count. A reply that named a rule not failing to
//     local seeds nothing.
//
//   - Charging back. What local admits is booked in a ledger of the key's
//     local rules at their full limits (the same algorithms, so an
//     admission in a window that has ended, or that a bucket has since
//     refilled, weighs nothing); when Redis answers again, the key's
//     booked weight (the largest any of its rules still holds) is charged
//     to Redis (OpCharge, clamped at capacity), one call for the keys at
//     hand: before the key's next decision on Redis (which waits for it),
//     for every other key by a flush after a call succeeds, and, while
//     anything is owed, every BreakerCooldown after a PING answers (an
//     instance no caller sends to Redis still charges it; a paused Redis
//     is not sent charges it would run on resuming). A charge stays in the
//     ledger until Redis answers for it: one that fails is charged again
//     later, and meanwhile the local limiter still counts it. A local
//     decision after Redis answered for the key starts again from Redis's
//     latest word, plus what is still booked.
//
// The bound this gives, and its measures, are in docs/REDIS.md.
//
// Memory is bounded: the table holds at most Options.LocalKeys entries,
// replaced by CLOCK (second chance). An entry is pinned, never replaced,
// while its key is decided locally (since Redis last answered for it) or
// owes Redis a charge. When every entry of a key's part of the table is
// pinned (an outage met by a flood of distinct keys), a new key is decided
// locally as before this mechanism: from zero, and never charged back;
// such decisions are counted (Stats.LocalUntracked), as are keys over
// lsMaxKey bytes. A key whose entry was replaced is decided locally from
// zero too; replaced entries were only seeds, never charges.
type localSync struct {
	s        *Store
	fb       *fallback
	mem      *memstore.Store
	perShard int
	seed     maphash.Seed
	shards   [lsShards]lsShard

	busy      atomic.Int64 // entries owing a charge or with one in flight
	flushing  atomic.Bool
	lastFlush atomic.Int64 // time.Now().UnixNano() of the last flush
	lastNow   atomic.Int64 // the latest caller's clock seen: the retries' now
	mu        sync.Mutex   // closed, retrying and wg.Add
	closed    bool
	retrying  bool // retry runs
	stop      chan struct{}
	wg        sync.WaitGroup

	charged, untracked atomic.Int64
}

// lsShards is the number of parts of the table, each with its lock.
const lsShards = 32

// lsMaxKey is the longest key the table holds: a longer one is decided
// locally unseeded and not charged back (counted as untracked), so that
// the table's memory stays within LocalKeys × (lsMaxKey + an entry).
const lsMaxKey = 256

// flushEvery is the least time between two flushes' scans of the table.
const flushEvery = 10 * time.Millisecond

type lsShard struct {
	mu   sync.Mutex
	m    map[lsKey]*lsEntry
	ring []*lsEntry
	hand int
}

type lsKey struct{ policy, key string }

// An lsEntry is one key's meeting point; its shard's lock guards it.
type lsEntry struct {
	k   lsKey
	ref bool // CLOCK's second chance

	// What Redis last said of the key: the deciding rule, its remaining,
	// and when (the caller's clock, microseconds).
	seen bool
	rule string
	rem  int64
	at   int64

	local bool // decided locally since Redis last answered: seeded

	// The ledger: admissions made locally and not yet on Redis, under pol
	// (the policy of the latest local decision).
	pol    *floodgate.Policy
	lg     *ledgerShape
	ledger []int64
	flat   int64 // admissions of rules too wide for the ledger: never decay
	owed   bool
	// charging is closed when the charge in flight is done.
	charging chan struct{}
	counted  bool // counted in busy
}

func newLocalSync(s *Store, fb *fallback, keys int) *localSync {
	ls := &localSync{s: s, fb: fb, mem: fb.mem, perShard: max(1, (keys+lsShards-1)/lsShards), seed: maphash.MakeSeed(),
		stop: make(chan struct{})}
	for i := range ls.shards {
		ls.shards[i].m = make(map[lsKey]*lsEntry)
	}
	return ls
}

// close stops the retries and waits for a flush in flight; none starts
// after it.
func (ls *localSync) close() {
	ls.mu.Lock()
	if !ls.closed {
		ls.closed = true
		close(ls.stop)
	}
	ls.mu.Unlock()
	ls.wg.Wait()
}

// retry charges what is owed every BreakerCooldown while anything is, on
// keys whose breaker is open too, so that an instance that no caller
// sends to Redis still tells Redis what it admitted within a cooldown of
// Redis's return. A charge that succeeds closes its breaker: Redis
// answers. It runs while charges are owed (recount starts it).
func (ls *localSync) retry() {
	defer ls.wg.Done()
	t := time.NewTicker(ls.s.opts.BreakerCooldown)
	defer t.Stop()
	for {
		select {
		case <-ls.stop:
			return
		case <-t.C:
		}
		ls.mu.Lock()
		if ls.busy.Load() == 0 {
			ls.retrying = false
			ls.mu.Unlock()
			return
		}
		ls.mu.Unlock()
		if ls.flushing.CompareAndSwap(false, true) {
			ls.flush(ls.lastNow.Load(), true)
			ls.flushing.Store(false)
		}
	}
}

// tracks returns p's plan when p's failure modes send it to the local
// limiter (some rule fails to local, none fails closed), else nil.
func (ls *localSync) tracks(p *floodgate.Policy) *plan {
	pl := ls.fb.plan(p)
	if pl.local == nil || pl.closed != nil {
		return nil
	}
	return pl
}

func (ls *localSync) shard(k lsKey) *lsShard {
	var h maphash.Hash
	h.SetSeed(ls.seed)
	h.WriteString(k.policy)
	h.WriteByte(0)
	h.WriteString(k.key)
	return &ls.shards[h.Sum64()%lsShards]
}

// get returns k's entry, making one if there is none and room can be
// made; nil if not. sh.mu is held.
func (ls *localSync) get(sh *lsShard, k lsKey) *lsEntry {
	if e := sh.m[k]; e != nil {
		return e
	}
	if len(k.key) > lsMaxKey {
		return nil
	}
	// the key is copied: the caller's may share a large buffer
	k.key = strings.Clone(k.key)
	e := &lsEntry{k: k}
	if len(sh.ring) < ls.perShard {
		sh.ring = append(sh.ring, e)
		sh.m[k] = e
		return e
	}
	// CLOCK: the first unpinned entry without a second chance goes
	for range 2 * len(sh.ring) {
		v := sh.ring[sh.hand]
		i := sh.hand
		sh.hand = (sh.hand + 1) % len(sh.ring)
		if v.local || v.owed || v.charging != nil {
			continue
		}
		if v.ref {
			v.ref = false
			continue
		}
		delete(sh.m, v.k)
		sh.ring[i] = e
		sh.m[k] = e
		return e
	}
	return nil
}

// recount keeps busy in step with e's state. The shard's lock is held.
func (ls *localSync) recount(e *lsEntry) {
	want := e.owed || e.charging != nil
	if want != e.counted {
		e.counted = want
		if !want {
			ls.busy.Add(-1)
		} else if ls.busy.Add(1) == 1 {
			ls.mu.Lock()
			if !ls.retrying && !ls.closed {
				ls.retrying = true
				ls.wg.Add(1)
				go ls.retry()
			}
			ls.mu.Unlock()
		}
	}
}

// answered records what Redis said of op's key (its decision d, made at
// now), and starts a flush of the charges owed, if any.
func (ls *localSync) answered(op *floodgate.Op, d *floodgate.Decision, now int64) {
	if ls.tracks(op.Policy) != nil {
		ls.lastNow.Store(now)
		k := lsKey{op.Policy.Name(), op.Key}
		sh := ls.shard(k)
		sh.mu.Lock()
		if e := ls.get(sh, k); e != nil {
			e.ref = true
			if op.Kind == floodgate.OpReset {
				e.seen = false
			} else {
				e.saw(d, now)
			}
			e.local = false
		}
		sh.mu.Unlock()
	}
	ls.maybeFlush(now)
}

// saw records Redis's decision d on the key at now, unless Redis said
// something later: of the replies of one moment (concurrent callers', or
// every reply at a clock that stands still), the fewest remaining is the
// latest.
func (e *lsEntry) saw(d *floodgate.Decision, now int64) {
	if !e.seen || now > e.at || now == e.at && d.Remaining < e.rem {
		e.seen, e.rule, e.rem, e.at = true, d.Rule, d.Remaining, now
	}
}

// local decides lop (op under pl's local policy) in process memory: from
// the key's state last seen on Redis, when the key comes to local from
// Redis, and booking what it admits for charging back.
func (f *fallback) local(ctx context.Context, now int64, op *floodgate.Op, pl *plan, lop floodgate.Op) (floodgate.Decision, error) {
	ls := f.ls
	if ls == nil || pl.closed != nil {
		return f.mem.Do(ctx, now, lop)
	}
	k := lsKey{op.Policy.Name(), op.Key}
	sh := ls.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	ls.lastNow.Store(now)
	e := ls.get(sh, k)
	if e == nil {
		ls.untracked.Add(1)
		return f.mem.Do(ctx, now, lop)
	}
	e.ref = true
	if !e.local {
		if err := ls.seedLocal(ctx, e, op, pl, now); err != nil {
			return floodgate.Decision{}, err
		}
		e.local = true
	}
	d, err := f.mem.Do(ctx, now, lop)
	if err != nil {
		return d, err
	}
	switch op.Kind {
	case floodgate.OpAllow, floodgate.OpReserve:
		if d.Allowed && op.Cost > 0 {
			e.book(op.Policy, pl, now, op.Cost)
		}
	case floodgate.OpCharge:
		if op.Cost > 0 {
			e.book(op.Policy, pl, now, op.Cost)
		}
	case floodgate.OpRefund:
		e.unbook(now, op.Cost)
	case floodgate.OpReset:
		e.clearLedger()
		e.seen = false
	}
	ls.recount(e)
	return d, nil
}

// seedLocal starts the key's local state from what Redis last said of it
// (see localSync), plus what local admitted and Redis has not yet been
// charged with. The shard's lock is held.
func (ls *localSync) seedLocal(ctx context.Context, e *lsEntry, op *floodgate.Op, pl *plan, now int64) error {
	at := now
	if e.seen {
		at = min(e.at, now)
	}
	key := op.Key
	if _, err := ls.mem.Do(ctx, at, floodgate.Op{Policy: pl.local, Key: key, Kind: floodgate.OpReset}); err != nil {
		return err
	}
	if e.seen {
		if c := seedCharge(op.Policy, pl, e.rule, e.rem); c > 0 {
			if _, err := ls.mem.Do(ctx, at, floodgate.Op{Policy: pl.local, Key: key, Kind: floodgate.OpCharge, Cost: c}); err != nil {
				return err
			}
		}
	}
	// what local admitted that Redis has not answered for (a charge in
	// flight included: it leaves the ledger when Redis answers for it)
	if e.owed {
		if u := e.used(now); u > 0 {
			if _, err := ls.mem.Do(ctx, now, floodgate.Op{Policy: pl.local, Key: key, Kind: floodgate.OpCharge, Cost: u}); err != nil {
				return err
			}
		}
	}
	return nil
}

// seedCharge is what the local rules are charged to start from rule's
// remaining on Redis: ceil(used × local capacity / capacity); 0 if rule
// is not one of p's local rules.
func seedCharge(p *floodgate.Policy, pl *plan, rule string, remaining int64) int64 {
	names := policyNames(p)
	i := slices.Index(names, rule)
	if i < 0 {
		return 0
	}
	j := slices.Index(pl.index, i)
	if j < 0 {
		return 0
	}
	full, loc := compiledOf(p).Params[i].Burst, compiledOf(pl.local).Params[j].Burst
	used := max(0, full-max(0, remaining))
	if used == 0 || full <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(used), uint64(loc))
	lo, carry := bits.Add64(lo, uint64(full-1), 0)
	q, _ := bits.Div64(hi+carry, lo, uint64(full)) // used ≤ full: no overflow
	return int64(q)
}

// policyNames returns p's rule names, in order (kept with p).
func policyNames(p *floodgate.Policy) []string {
	return storekit.Attached(p, namesKey{}, func() any {
		rs := p.Rules()
		names := make([]string, len(rs))
		for i := range rs {
			names[i] = rs[i].Name
		}
		return names
	}).([]string)
}

type namesKey struct{}

// take makes e's ledger's weight a charge, marking it in flight (it stays
// in the ledger until Redis answers for it); ok is false when the ledger
// weighs nothing any more. The shard's lock is held.
func (ls *localSync) take(e *lsEntry, now int64) (op floodgate.Op, ok bool) {
	u := e.used(now)
	if u == 0 {
		e.clearLedger()
	} else {
		e.charging = make(chan struct{})
	}
	ls.recount(e)
	return floodgate.Op{Policy: e.pol, Key: e.k.key, Kind: floodgate.OpCharge, Cost: u}, u > 0
}

// settle charges Redis, before ops are sent, with what local admitted on
// their keys, and waits for charges already in flight on them (until
// sctx ends), so that Redis decides them knowing it.
func (ls *localSync) settle(sctx context.Context, now int64, ops []floodgate.Op) {
	if ls.busy.Load() == 0 {
		return
	}
	var charges []floodgate.Op
	var ents []*lsEntry
	var waits []chan struct{}
	for i := range ops {
		if ls.tracks(ops[i].Policy) == nil {
			continue
		}
		k := lsKey{ops[i].Policy.Name(), ops[i].Key}
		sh := ls.shard(k)
		sh.mu.Lock()
		if e := sh.m[k]; e != nil {
			switch {
			case e.charging != nil:
				waits = append(waits, e.charging)
			case e.owed:
				if op, ok := ls.take(e, now); ok {
					charges, ents = append(charges, op), append(ents, e)
				}
			}
		}
		sh.mu.Unlock()
	}
	if len(charges) > 0 {
		troubled := false
		for i := range charges {
			troubled = troubled || ls.s.breakerFor(ls.s.Key(charges[i].Policy.Name(), charges[i].Key)).troubled.Load()
		}
		ls.send(sctx, now, charges, ents, troubled)
	}
	for _, ch := range waits {
		select {
		case <-ch:
		case <-sctx.Done():
			return
		}
	}
}

// send makes the charges of ents on Redis, and takes those Redis
// answered for out of their ledgers (newest first); a charge that failed
// stays booked. A charge whose answer was lost may have been applied
// (Redis paused or slow runs it later), and is charged again: Redis then
// counts more than was admitted, never less. So that a Redis known to be
// failing (unsure) is not sent charges it may run only when it resumes,
// it is asked to PING first, and charged only if it answers.
func (ls *localSync) send(sctx context.Context, now int64, charges []floodgate.Op, ents []*lsEntry, unsure bool) {
	var decs []floodgate.Decision
	var errs []error
	if unsure {
		if err := ls.s.Ping(sctx); err != nil {
			errs = make([]error, len(charges))
			for i := range errs {
				errs[i] = err
			}
		}
	}
	if errs == nil {
		decs, errs = ls.s.sendRaw(sctx, now, charges)
	}
	for i, e := range ents {
		sh := ls.shard(e.k)
		sh.mu.Lock()
		close(e.charging)
		e.charging = nil
		if errs[i] == nil {
			e.unbook(now, charges[i].Cost)
			if e.used(now) == 0 {
				e.clearLedger()
			}
			ls.s.breakerFor(ls.s.Key(e.k.policy, e.k.key)).success()
			ls.charged.Add(charges[i].Cost)
			e.saw(&decs[i], now)
			e.local = false
		}
		ls.recount(e)
		sh.mu.Unlock()
	}
}

// maybeFlush starts a flush when charges are owed and none ran in the
// last flushEvery.
func (ls *localSync) maybeFlush(now int64) {
	if ls.busy.Load() == 0 || ls.flushing.Load() {
		return
	}
	t := time.Now().UnixNano()
	if t-ls.lastFlush.Load() < int64(flushEvery) || !ls.flushing.CompareAndSwap(false, true) {
		return
	}
	ls.lastFlush.Store(t)
	ls.mu.Lock()
	if ls.closed {
		ls.mu.Unlock()
		ls.flushing.Store(false)
		return
	}
	ls.wg.Add(1)
	ls.mu.Unlock()
	go func() {
		defer ls.wg.Done()
		defer ls.flushing.Store(false)
		ls.flush(now, false)
	}()
}

// flush charges Redis with what every key owes (those whose breaker is
// closed, unless all; then after a PING), MaxBatch keys a call.
func (ls *localSync) flush(now int64, all bool) {
	var charges []floodgate.Op
	var ents []*lsEntry
	for i := range ls.shards {
		sh := &ls.shards[i]
		sh.mu.Lock()
		for _, e := range sh.ring {
			if !e.owed || e.charging != nil || !all && ls.s.breakerFor(ls.s.Key(e.k.policy, e.k.key)).troubled.Load() {
				continue
			}
			if op, ok := ls.take(e, now); ok {
				charges, ents = append(charges, op), append(ents, e)
			}
		}
		sh.mu.Unlock()
	}
	for len(charges) > 0 {
		n := min(len(charges), ls.s.opts.MaxBatch)
		ls.send(ls.s.timeoutContext(time.Now()), now, charges[:n], ents[:n], all)
		charges, ents = charges[n:], ents[n:]
	}
}

// sendRaw makes ops on Redis under sctx and returns each one's decision or
// error, without the failure modes or the breakers: one call of
// BatchFunction on one Redis, one pipelined round trip in a Cluster.
func (s *Store) sendRaw(sctx context.Context, now int64, ops []floodgate.Op) ([]floodgate.Decision, []error) {
	decs := make([]floodgate.Decision, len(ops))
	errs := make([]error, len(ops))
	if s.co != nil {
		w := getWaiter(len(ops))
		for i := range ops {
			pa, o := s.nums(now, &ops[i])
			w.add(s.Key(ops[i].Policy.Name(), ops[i].Key), pa, o)
		}
		if err := s.co.submit(sctx, sctx, w); err != nil {
			for i := range errs {
				errs[i] = err
			}
			return decs, errs // w belongs to the batch
		}
		copy(decs, w.dec)
		copy(errs, w.errs)
		putWaiter(w)
		return decs, errs
	}
	pas := make([]*policyArgs, len(ops))
	execs := make([]rueidis.LuaExec, len(ops))
	for i := range ops {
		var args []string
		pas[i], args = s.scriptArgs(now, &ops[i])
		execs[i] = rueidis.LuaExec{Keys: []string{s.Key(ops[i].Policy.Name(), ops[i].Key)}, Args: args}
	}
	res := within(sctx, func() []rueidis.RedisResult { return s.execMulti(sctx, execs) }, func(err error) []rueidis.RedisResult {
		r := make([]rueidis.RedisResult, len(execs))
		for i := range r {
			r[i] = rueidis.NewErrorResult(err)
		}
		return r
	})
	for i, r := range res {
		decs[i], errs[i] = s.decideReply(pas[i], r)
	}
	return decs, errs
}

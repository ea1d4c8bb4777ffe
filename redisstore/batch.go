package redisstore

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/redis/rueidis"

	"github.com/floodgate/floodgate"
)

// DoBatch performs every op in one pipelined round trip (keys in different
// Cluster slots go to their nodes in parallel). Each key is atomic on its
// own; a failed key is decided by its rules' failure modes.
func (s *Store) DoBatch(ctx context.Context, now int64, ops []floodgate.Op, out []floodgate.Decision) error {
	if len(out) < len(ops) {
		return errors.New("redisstore: out is shorter than ops")
	}
	if s.shares.anyShared(ops) { // local share: those from their slices, the rest here
		return s.shares.batch(ctx, now, ops, out, func(ops []floodgate.Op, out []floodgate.Decision) error {
			return s.doBatch(ctx, now, ops, nil, out)
		})
	}
	return s.doBatch(ctx, now, ops, nil, out)
}

// DoGroup performs ops as DoBatch does, those whose index is set in group
// all or nothing (floodgate.GroupStore), atomically: the batch is one call
// of BatchFunction, which Redis runs alone. A store on a Redis Cluster,
// which sends each key to its own node, returns errors.ErrUnsupported, and
// floodgate.DoGroup compensates instead. When Redis cannot be asked, each
// operation is decided by its rules' failure modes, as in DoBatch.
func (s *Store) DoGroup(ctx context.Context, now int64, ops []floodgate.Op, group []bool, out []floodgate.Decision) error {
	if s.co == nil {
		return errors.ErrUnsupported
	}
	if len(out) < len(ops) || len(group) < len(ops) {
		return errors.New("redisstore: out or group is shorter than ops")
	}
	return s.doBatch(ctx, now, ops, group[:len(ops)], out)
}

// doBatch is DoBatch, with an all-or-nothing group when group is not nil
// (coalescing stores only).
func (s *Store) doBatch(ctx context.Context, now int64, ops []floodgate.Op, group []bool, out []floodgate.Decision) error {
	if len(ops) == 0 {
		return nil
	}
	for i := range ops {
		if ops[i].Policy == nil {
			return errNoPolicy
		}
	}
	if group == nil && len(ops) > 1 {
		if done, err := s.split(ctx, now, ops, out); done {
			return err
		}
	}
	if len(ops) == 1 { // one key: a plain call (which asks the breaker itself)
		d, err := s.Do(ctx, now, ops[0])
		if err != nil {
			return err
		}
		out[0] = d
		return nil
	}
	if s.near != nil && group == nil {
		return s.nearBatch(ctx, now, ops, out)
	}
	return s.askBatch(ctx, now, ops, group, out)
}

// askBatch is doBatch past the near cache: every op goes to Redis.
func (s *Store) askBatch(ctx context.Context, now int64, ops []floodgate.Op, group []bool, out []floodgate.Decision) error {
	s.checkMaster()
	if s.co == nil {
		return s.doEach(ctx, now, ops, out)
	}
	return s.doCoalesced(ctx, now, ops, group, out)
}

// nearBatch is doBatch without a group: the ops the near cache answers are
// answered, the others asked of Redis.
func (s *Store) nearBatch(ctx context.Context, now int64, ops []floodgate.Op, out []floodgate.Decision) error {
	at := s.nearNow(now)
	var buf [64]int
	miss := buf[:0] // the ops to ask Redis
	for i := range ops {
		if ops[i].Kind != floodgate.OpAllow || !s.near.lookup(at, &ops[i], &out[i]) {
			miss = append(miss, i)
		}
	}
	switch len(miss) {
	case len(ops):
		return s.askBatch(ctx, now, ops, nil, out)
	case 0:
		return nil
	case 1:
		d, err := s.Do(ctx, now, ops[miss[0]])
		out[miss[0]] = d
		return err
	}
	rest := make([]floodgate.Op, len(miss))
	for j, i := range miss {
		rest[j] = ops[i]
	}
	dec := make([]floodgate.Decision, len(rest))
	if err := s.askBatch(ctx, now, rest, nil, dec); err != nil {
		return err
	}
	for j, i := range miss {
		out[i] = dec[j]
	}
	return nil
}

// doCoalesced is doBatch on one Redis: one breaker, and the batch is one
// call (all or nothing for a group), so it goes to Redis or to the failure
// modes whole.
func (s *Store) doCoalesced(ctx context.Context, now int64, ops []floodgate.Op, group []bool, out []floodgate.Decision) error {
	brk := &s.brks[0]
	if !brk.allow() {
		s.degradeAll(ctx, now, ops, out, nil)
		return nil
	}
	at := s.nearNow(now)
	start := time.Now()
	sctx, ok := s.storeContextAt(ctx, start)
	if !ok {
		return s.noTime(ctx, now, ops, out)
	}
	if s.local.busy.Load() > 0 { // local admitted on some key: Redis learns it first
		s.local.settle(sctx, now, ops)
	}
	s.calls.Add(int64(len(ops)))
	errs := make([]error, len(ops)) // here, not in submitBatch: a small one stays on the stack
	s.submitBatch(ctx, sctx, now, ops, group, out, errs)
	var firstErr error
	for i, err := range errs {
		if err == nil {
			s.local.answered(&ops[i], &out[i], now)
			s.nearLearnIn(at, ops, out, group, i)
			continue
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if firstErr == nil {
			firstErr = err
		}
		out[i] = s.degrade(ctx, now, &ops[i], err)
	}
	if firstErr != nil {
		s.failed(brk, firstErr, sctx, start.UnixMicro())
	} else {
		s.answered(start.UnixMicro())
		brk.success()
	}
	return nil
}

// submitBatch sends ops to the coalescer as one waiter, their decisions
// into out and their errors into errs.
func (s *Store) submitBatch(ctx, sctx context.Context, now int64, ops []floodgate.Op, group []bool, out []floodgate.Decision, errs []error) {
	w := getWaiter(len(ops))
	for i := range ops {
		pa, o := s.nums(now, &ops[i])
		w.add(s.Key(ops[i].Policy.Name(), ops[i].Key), pa, o)
	}
	if group != nil {
		w.grp = slices.Clone(group) // the batch may outlive this call
	}
	if err := s.co.submit(ctx, sctx, w); err != nil {
		// it left the queue at sctx's end (w belongs to the batch)
		for i := range errs {
			errs[i] = err
		}
		return
	}
	copy(out, w.dec)
	copy(errs, w.errs)
	putWaiter(w)
}

// degradeAll decides every op by its rules' failure modes.
func (s *Store) degradeAll(ctx context.Context, now int64, ops []floodgate.Op, out []floodgate.Decision, cause error) {
	for i := range ops {
		out[i] = s.degrade(ctx, now, &ops[i], cause)
	}
}

// noTime answers ops when their caller left no time to ask Redis: by the
// failure modes, or with ctx's error when the caller has gone.
func (s *Store) noTime(ctx context.Context, now int64, ops []floodgate.Op, out []floodgate.Decision) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	s.degradeAll(ctx, now, ops, out, errNoTime)
	return nil
}

// doEach is doBatch without coalescing (a Cluster, or Options.NoCoalescing):
// each key is a call of its own (in a Cluster, to the master of its slot),
// all of them in one pipelined round trip, and each asks and feeds the
// breaker of its slots, so that keys on a master that is down or silent go
// to the failure modes and the others to Redis.
func (s *Store) doEach(ctx context.Context, now int64, ops []floodgate.Op, out []floodgate.Decision) error {
	// the slices are made here, not in the helpers, so that a small batch's
	// stay on the stack
	keys := make([]string, len(ops))
	brks := make([]*breaker, len(ops))
	ask, troubled := s.planEach(ops, keys, brks, make([]int, 0, len(ops)))
	var sctx context.Context
	at := s.nearNow(now)
	start := time.Now()
	if len(ask) > 0 {
		var ok bool
		if sctx, ok = s.storeContextAt(ctx, start); !ok {
			return s.noTime(ctx, now, ops, out)
		}
	}
	errs := make([]error, len(ops))
	for i := range ops {
		errs[i] = errBreakerOpen
	}
	if len(ask) > 0 {
		s.askEach(sctx, start, now, ops, keys, ask, troubled, out, errs)
	}
	for i, err := range errs {
		switch {
		case err == nil:
			brks[i].success()
			s.local.answered(&ops[i], &out[i], now)
			s.nearLearn(at, &ops[i], &out[i])
			continue
		case err == errBreakerOpen:
			out[i] = s.degrade(ctx, now, &ops[i], nil)
			continue
		case ctx.Err() != nil:
			return ctx.Err()
		}
		s.failed(brks[i], err, sctx, start.UnixMicro())
		out[i] = s.degrade(ctx, now, &ops[i], err)
	}
	return nil
}

// errBreakerOpen marks, in doEach, an op its breaker kept from Redis.
var errBreakerOpen = errors.New("redisstore: breaker open")

// planEach fills each op's key and breaker, and returns ask with the ops
// whose breaker lets them ask Redis appended, and whether one of those
// breakers is troubled (the calls then go through within).
func (s *Store) planEach(ops []floodgate.Op, keys []string, brks []*breaker, ask []int) ([]int, bool) {
	troubled := false
	for i := range ops {
		keys[i] = s.Key(ops[i].Policy.Name(), ops[i].Key)
		brks[i] = s.breakerFor(keys[i])
		if brks[i].allow() {
			ask = append(ask, i)
			troubled = troubled || brks[i].troubled.Load()
		}
	}
	return ask, troubled
}

// askEach asks Redis for the ops of ask (their keys in keys), in one
// pipeline under sctx, their decisions into out and their errors into errs.
func (s *Store) askEach(sctx context.Context, start time.Time, now int64, ops []floodgate.Op, keys []string, ask []int, troubled bool, out []floodgate.Decision, errs []error) {
	if s.local.busy.Load() > 0 { // local admitted on some key: Redis learns it first
		asked := make([]floodgate.Op, len(ask))
		for j, i := range ask {
			asked[j] = ops[i]
		}
		s.local.settle(sctx, now, asked)
	}
	s.calls.Add(int64(len(ask)))
	pas := make([]*policyArgs, len(ask))
	execs := make([]rueidis.LuaExec, len(ask))
	for j, i := range ask {
		var args []string
		pas[j], args = s.scriptArgs(now, &ops[i])
		execs[j] = rueidis.LuaExec{Keys: []string{keys[i]}, Args: args}
	}
	answered := false
	for j, r := range s.execEach(sctx, troubled, execs) {
		i := ask[j]
		out[i], errs[i] = s.decideReply(pas[j], r)
		answered = answered || errs[i] == nil
	}
	if answered {
		s.answered(start.UnixMicro())
	}
}

// execEach is execMulti, through within when a breaker is troubled.
func (s *Store) execEach(sctx context.Context, troubled bool, execs []rueidis.LuaExec) []rueidis.RedisResult {
	if !troubled {
		return s.execMulti(sctx, execs)
	}
	return within(sctx, func() []rueidis.RedisResult { return s.execMulti(sctx, execs) }, func(err error) []rueidis.RedisResult {
		res := make([]rueidis.RedisResult, len(execs))
		for i := range res {
			res[i] = rueidis.NewErrorResult(err)
		}
		return res
	})
}

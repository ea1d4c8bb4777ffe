package redisstore

import (
	"context"
	"errors"
	"time"

	"github.com/redis/rueidis"

	"github.com/floodgate/floodgate"
)

var errNoPolicy = errors.New("redisstore: op without a policy")

// Do performs op in one script call, or answers a refusal from the near
// cache (near.go).
func (s *Store) Do(ctx context.Context, now int64, op floodgate.Op) (floodgate.Decision, error) {
	if op.Policy == nil {
		return floodgate.Decision{}, errNoPolicy
	}
	var d floodgate.Decision
	at, known := s.nearFirst(now, &op, &d) // at: the near clock as the call starts
	if known {
		return d, nil
	}
	var key string
	if compiledOf(op.Policy).Tiered { // an exact policy pays nothing here
		var ok bool
		var err error
		if d, key, ok, err = s.tiered(ctx, now, &op); ok {
			return d, err
		}
	} else {
		key = s.Key(op.Policy.Name(), op.Key)
	}
	s.checkMaster()
	brk := s.breakerFor(key)
	if !brk.allow() {
		return s.degrade(ctx, now, &op, nil), nil
	}
	start := time.Now()
	sctx, ok := s.storeContextAt(ctx, start)
	if !ok { // no time left to ask Redis: answer by the failure mode now
		if ctx.Err() != nil {
			return floodgate.Decision{}, ctx.Err()
		}
		return s.degrade(ctx, now, &op, errNoTime), nil
	}
	if s.local.busy.Load() > 0 { // local admitted on some key: Redis learns it first
		s.local.settle(sctx, now, []floodgate.Op{op})
	}
	s.calls.Add(1)
	var err error
	if s.co != nil {
		w := getWaiter(1)
		pa, o := s.nums(now, &op)
		w.add(key, pa, o)
		if err = s.co.submit(ctx, sctx, w); err == nil {
			d, err = w.dec[0], w.errs[0]
			putWaiter(w)
		} // else it left the queue at sctx's end: w belongs to the batch
	} else {
		pa, args := s.scriptArgs(now, &op)
		var r rueidis.RedisResult
		if brk.troubled.Load() {
			r = within(sctx, func() rueidis.RedisResult { return s.call(sctx, key, args) }, rueidis.NewErrorResult)
		} else {
			r = s.call(sctx, key, args)
		}
		d, err = s.decideReply(pa, r)
	}
	if err == nil {
		s.answered(start.UnixMicro())
		brk.success()
		s.local.answered(&op, &d, now)
		s.nearLearn(at, &op, &d)
		return d, nil
	}
	if ctx.Err() != nil { // the caller gave up: not Redis's failure
		return floodgate.Decision{}, ctx.Err()
	}
	s.failed(brk, err, sctx, start.UnixMicro())
	return s.degrade(ctx, now, &op, err), nil
}

// tiered decides op of a policy with a tier (write-back, local share) if
// its tier does (ok), and returns its key for Do otherwise.
func (s *Store) tiered(ctx context.Context, now int64, op *floodgate.Op) (d floodgate.Decision, key string, ok bool, err error) {
	switch op.Kind {
	case floodgate.OpAllow:
		if d, ok, err = s.wb.decide(ctx, now, op); ok {
			return d, "", true, err
		}
	case floodgate.OpPeek: // it sees this node's unsynced hits
		if d, ok, err = s.wb.peek(ctx, now, op); ok {
			return d, "", true, err
		}
	}
	key = s.Key(op.Policy.Name(), op.Key)
	if pl := sharePlanOf(op.Policy); pl.ok {
		if op.Kind == floodgate.OpAllow {
			if d, ok, err = s.shares.decide(ctx, now, op, key, pl); ok {
				return d, key, true, err
			}
		} else if op.Kind == floodgate.OpReset {
			s.shares.drop(key)
		}
	}
	return d, key, false, nil
}

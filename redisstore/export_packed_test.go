package redisstore

import (
	"context"
	"errors"

	"github.com/floodgate/floodgate"
)

// FunctionDo decides ops at now in one call of fn (PackedFunction or
// BatchFunction) on s's client, as the coalescer sends a batch of one
// caller, group marking the all-or-nothing members (nil: none); it returns
// each decision and its own error, or the call's error.
func FunctionDo(s *Store, fn string, now int64, ops []floodgate.Op, group []bool) ([]floodgate.Decision, []error, error) {
	ctx := context.Background()
	w, err := s.commandWaiter(ctx, now, ops)
	if err != nil {
		return nil, nil, err
	}
	w.grp = group
	dec, errs := make([]floodgate.Decision, len(ops)), make([]error, len(ops))
	if fn == BatchFunction {
		keys, args := batchArgs([]*waiter{w}, len(ops))
		replies, err := s.callBatch(ctx, s.client, keys, args).ToArray()
		if err != nil {
			return nil, nil, err
		}
		if len(replies) != len(ops) {
			return nil, nil, errShortBatch
		}
		for i := range ops {
			dec[i], errs[i] = s.decideMessage(w.pas[i], &replies[i])
		}
		return dec, errs, nil
	}
	keys, args, ok := packedArgs([]*waiter{w}, len(ops))
	if !ok {
		return nil, nil, errors.New("redisstore: ops not packable")
	}
	b, err := s.callFunction(ctx, s.client, PackedFunction, s.packedScript, keys, args).AsBytes()
	if err != nil {
		return nil, nil, err
	}
	for i := range ops {
		var perr error
		if dec[i], errs[i], b, perr = packedDecision(w.pas[i], b); perr != nil {
			return nil, nil, perr
		}
	}
	if len(b) != 0 {
		return nil, nil, errPackedReply
	}
	return dec, errs, nil
}

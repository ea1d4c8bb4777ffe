package redisstore

import (
	"context"
	"errors"

	"github.com/redis/rueidis"

	"github.com/floodgate/floodgate"
)

// Move carries key's state from policy from to policy to
// (floodgate.Mover), in one call of MoveFunction: the two keys share the
// key's hash tag, so on a Cluster they are in one slot. Move is an
// administrative step (a per-key override set, changed or removed), not a
// decision: it is bounded by ctx and Options.Timeout, and a failure is
// returned, with no failure mode to fall back on.
func (s *Store) Move(ctx context.Context, now int64, from, to *floodgate.Policy, key string) error {
	if from == nil || to == nil {
		return errNoPolicy
	}
	if from.Name() == to.Name() {
		return nil // one key: the newer version converts it
	}
	if s.near != nil { // the key's state changes under both
		defer s.near.forget(to, key)
		defer s.near.forget(from, key)
	}
	sctx, ok := s.storeContext(ctx)
	if !ok {
		if err := ctx.Err(); err != nil {
			return err
		}
		return errNoTime
	}
	_, args := s.scriptArgs(now, &floodgate.Op{Policy: to, Key: key})
	keys := []string{s.Key(from.Name(), key), s.Key(to.Name(), key)}
	call := func() rueidis.RedisResult {
		return s.callFunction(sctx, s.client, MoveFunction, s.moveScript, keys, args)
	}
	var r rueidis.RedisResult
	if s.breakerFor(keys[0]).troubled.Load() {
		r = within(sctx, call, rueidis.NewErrorResult)
	} else {
		r = call()
	}
	if err := r.Error(); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return errors.Join(errors.New("redisstore: moving a key's state"), err)
	}
	return nil
}

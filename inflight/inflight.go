// Package inflight caps the requests in flight per key: at most Limit
// holders of a key at once, the concurrent-requests limiter Stripe
// describes. Acquire takes a slot or refuses at once (it never queues);
// the Token it returns gives the slot back, once, however often Release
// is called.
//
// Memory keeps the slots in this process. Package inflightredis keeps them
// in a Redis sorted set per key, so the cap holds across a fleet: each
// slot has an expiry that its holder's heartbeat pushes back, so the slots
// of a process that died (kill -9, a lost host) come back after the
// expiry. Package inflighttest is the conformance suite both pass.
package inflight

import (
	"context"
	"errors"
	"sync/atomic"
)

// A Limiter hands out at most its limit of slots per key at once.
type Limiter interface {
	// Acquire takes a slot of key. It returns the token and true, or nil
	// and false when key already has its limit of holders. err is set
	// (with ok false) when the decision could not be made (Redis is
	// unreachable, ctx ended); the caller chooses to fail open or closed.
	Acquire(ctx context.Context, key string) (tok *Token, ok bool, err error)
	// Limit is the most holders a key may have at once.
	Limit() int
}

// ErrTableFull is returned by Memory.Acquire when MaxKeys keys already
// hold slots and key is not one of them: the table is bounded, and a
// flood of distinct keys is refused rather than let grow without end.
var ErrTableFull = errors.New("inflight: too many keys hold slots (MaxKeys)")

// A Token is one held slot. Release gives it back; calls after the first
// do nothing, so a deferred Release beside an early one is safe.
type Token struct {
	done    atomic.Bool
	release func() // an implementation's (NewToken), or nil
	shard   *memShard
	key     string // Memory's: the shard and key, so a token is one allocation
}

// NewToken returns a token whose first Release calls release: for an
// implementation of Limiter.
func NewToken(release func()) *Token { return &Token{release: release} }

// Release gives the slot back. It is idempotent and safe for concurrent
// use.
func (t *Token) Release() {
	if t == nil || !t.done.CompareAndSwap(false, true) {
		return
	}
	if t.shard != nil {
		t.shard.release(t.key)
		return
	}
	t.release()
}

// Released reports whether Release has been called.
func (t *Token) Released() bool { return t != nil && t.done.Load() }

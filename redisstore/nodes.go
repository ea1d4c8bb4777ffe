package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
)

// The nodes' heartbeats, one set for the store's two tiers: each process
// with local-share or write-back keys announces itself in one sorted set,
// <prefix>:1:nodes, scored by its clock in ms, every nodesBeatEvery;
// members older than nodesStale are dropped, and the set's size is the
// live node count that sizes local share's slices (share.go) and
// write-back's hit threshold (writeback.go). A node counts itself from its
// first answered beat. A node that dies is counted for nodesStale more
// (smaller slices, a smaller threshold: safe); one that joins is counted
// by the others within nodesBeatEvery.
const (
	nodesBeatEvery = 200 * time.Millisecond
	nodesStale     = time.Second
)

// nodeSet is this store's membership in the heartbeat set.
type nodeSet struct {
	s   *Store
	id  string
	key string
	n   atomic.Int64
}

func newNodeSet(s *Store) *nodeSet {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return &nodeSet{s: s, id: hex.EncodeToString(b[:]), key: s.opts.Prefix + ":1:nodes"}
}

// live returns the node count at the last answered beat (0 before one).
func (h *nodeSet) live() int64 { return h.n.Load() }

// beat announces this node and reads the count, leaving at the store's
// timeout whatever the connection does (within: rueidis does not bound
// the wait for a connection it is making again).
func (h *nodeSet) beat() {
	c := h.s.client
	ctx, cancel := context.WithTimeout(context.Background(), h.s.timeout())
	defer cancel()
	now := time.Now().UnixMilli()
	res := within(ctx, func() []rueidis.RedisResult {
		return c.DoMulti(ctx,
			c.B().Zadd().Key(h.key).ScoreMember().ScoreMember(float64(now), h.id).Build(),
			c.B().Zremrangebyscore().Key(h.key).Min("-inf").Max("("+strconv.FormatInt(now-nodesStale.Milliseconds(), 10)).Build(),
			c.B().Zcard().Key(h.key).Build(),
			c.B().Pexpire().Key(h.key).Milliseconds(10*nodesStale.Milliseconds()).Build())
	}, func(error) []rueidis.RedisResult { return nil })
	if len(res) < 3 {
		return
	}
	if n, err := res[2].AsInt64(); err == nil && n > 0 {
		h.n.Store(n)
	}
}

// leave takes this node out of the count (Close), within the store's
// timeout.
func (h *nodeSet) leave() {
	c := h.s.client
	ctx, cancel := context.WithTimeout(context.Background(), h.s.timeout())
	defer cancel()
	within(ctx, func() rueidis.RedisResult {
		return c.Do(ctx, c.B().Zrem().Key(h.key).Member(h.id).Build())
	}, rueidis.NewErrorResult)
}

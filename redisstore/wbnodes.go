package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"sync/atomic"
	"time"
)

// Write-back's heartbeats: each process with write-back keys announces
// itself in one sorted set, <prefix>:wbnodes, scored by its clock in ms,
// every wbBeatEvery; members older than wbBeatStale are dropped, and the
// set's size is the live node count that sizes the hit threshold
// (writeback.go). A node counts itself from its first answered beat; until
// then it decides its write-back keys exactly. A node that dies is counted
// for wbBeatStale more (a smaller threshold: safe); one that joins is
// counted by the others within wbBeatEvery.
//
// nodeCounter is what write-back needs of heartbeats, so that another
// heartbeat (local share's) can take their place: announce this node
// (called every wbBeatEvery by the flusher), leave (on Close), and the
// live count (0 until known).
type nodeCounter interface {
	beat()
	leave()
	live() int64
}

const (
	wbBeatEvery = 200 * time.Millisecond
	wbBeatStale = time.Second
)

type wbNodes struct {
	s   *Store
	id  string
	key string
	n   atomic.Int64
}

var _ nodeCounter = (*wbNodes)(nil)

func newWBNodes(s *Store) *wbNodes {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return &wbNodes{s: s, id: hex.EncodeToString(b[:]), key: s.opts.Prefix + ":wbnodes"}
}

// live returns the node count at the last answered beat (0 before one).
func (h *wbNodes) live() int64 { return h.n.Load() }

// beat announces this node and reads the count.
func (h *wbNodes) beat() {
	c := h.s.client
	ctx, cancel := context.WithTimeout(context.Background(), h.s.timeout())
	defer cancel()
	now := time.Now().UnixMilli()
	res := c.DoMulti(ctx,
		c.B().Zadd().Key(h.key).ScoreMember().ScoreMember(float64(now), h.id).Build(),
		c.B().Zremrangebyscore().Key(h.key).Min("-inf").Max("("+strconv.FormatInt(now-wbBeatStale.Milliseconds(), 10)).Build(),
		c.B().Zcard().Key(h.key).Build(),
		c.B().Pexpire().Key(h.key).Milliseconds(10*wbBeatStale.Milliseconds()).Build())
	if n, err := res[2].AsInt64(); err == nil && n > 0 {
		h.n.Store(n)
	}
}

// leave takes this node out of the count (Close).
func (h *wbNodes) leave() {
	c := h.s.client
	ctx, cancel := context.WithTimeout(context.Background(), h.s.timeout())
	defer cancel()
	c.Do(ctx, c.B().Zrem().Key(h.key).Member(h.id).Build())
}

package redisstore

import (
	"context"

	"github.com/redis/rueidis"

	"github.com/floodgate/floodgate"
)

// WriteBackCall calls WriteBackFunction on key of pol: hits of window tag,
// and cost to decide.
func (s *Store) WriteBackCall(pol *floodgate.Policy, key string, now, tag, hits, cost int64) ([]int64, error) {
	return s.WriteBackSync(pol, key, now, tag, hits, 0, cost)
}

// WriteBackSync is WriteBackCall with this node's running total of hits
// on the key (idempotent syncs; 0: none).
func (s *Store) WriteBackSync(pol *floodgate.Policy, key string, now, tag, hits, total, cost int64) ([]int64, error) {
	e := &wbEntry{wp: s.wb.policy(pol), rkey: s.Key(pol.Name(), key)}
	sn := wbSync{e: e, tag: tag, hits: hits, total: total}
	args := s.wb.args(now, sn, cost)
	return s.wb.do(context.Background(), []rueidis.Completed{s.wb.fcall(sn, args)})[0].AsIntSlice()
}

package redisstore

import (
	"context"

	"github.com/redis/rueidis"

	"github.com/floodgate/floodgate"
)

// WriteBackCall calls WriteBackFunction on key of pol: hits of window tag,
// and cost to decide.
func (s *Store) WriteBackCall(pol *floodgate.Policy, key string, now, tag, hits, cost int64) ([]int64, error) {
	e := &wbEntry{wp: s.wb.policy(pol)}
	args := s.wb.args(now, wbSync{e: e, tag: tag, hits: hits}, cost)
	return s.wb.do(context.Background(), []rueidis.Completed{s.wb.fcall(s.Key(pol.Name(), key), args)})[0].AsIntSlice()
}

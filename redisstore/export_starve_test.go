package redisstore

import "time"

// SetLag makes s take its process's lag from starved (how long the process
// was stalled between two times, in µs since the epoch) instead of its lag
// monitor, and no host pressure, so that a test can starve it on cue.
func SetLag(s *Store, starved func(from, to int64) time.Duration) {
	s.ex.lag, s.ex.hostLag = starved, nil
}

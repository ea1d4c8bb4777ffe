package redisstore

// ShareSweep gives back the slices of s's keys idle at now (local share),
// as its sweeper does every 50ms.
func ShareSweep(s *Store, now int64) { s.shares.sweep(now, false) }

// ShareSeen is how many cold keys' counts s keeps now.
func ShareSeen(s *Store) int {
	s.shares.mu.RLock()
	defer s.shares.mu.RUnlock()
	return len(s.shares.seen)
}

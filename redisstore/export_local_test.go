package redisstore

// LocalEntries returns how many keys s's failure_mode local table holds
// (localsync.go).
func LocalEntries(s *Store) int {
	n := 0
	for i := range s.local.shards {
		sh := &s.local.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}

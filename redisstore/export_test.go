package redisstore

// SetBatchAlways makes s send every decision, a lone one too, through
// BatchFunction (the calling convention before PackedFunction, kept for
// the releases before it), so that the conformance and differential
// suites cover it as they cover PackedFunction (the default).
func SetBatchAlways(s *Store) { s.batchAlways = true }

// Coalescing reports whether s combines concurrent decisions.
func Coalescing(s *Store) bool { return s.co != nil }

// CoalescerState returns the batches in flight and the callers queued.
func CoalescerState(s *Store) (inflight, queued int) {
	s.co.mu.Lock()
	defer s.co.mu.Unlock()
	return s.co.inflight, len(s.co.queue)
}

// KeySlot is Redis Cluster's hash slot of a Redis key, as the store's
// breakers compute it.
func KeySlot(key string) int { return int(keySlot(key)) }

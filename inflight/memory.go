package inflight

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/dchest/siphash"
)

const memShards = 64

// Memory is a Limiter for one process. A key's entry exists only while it
// holds slots, and at most MaxKeys keys hold slots at once, so memory is
// bounded whatever the keys.
type Memory struct {
	limit   int
	maxKeys int
	keys    atomic.Int64
	shards  [memShards]memShard
}

type memShard struct {
	mu sync.Mutex
	n  map[string]int
	m  *Memory
	_  [40]byte // keep shards on separate cache lines (64 bytes in all)
}

// MemoryOptions configure a Memory limiter.
type MemoryOptions struct {
	// Limit is the most slots a key may hold at once (at least 1).
	Limit int
	// MaxKeys bounds the keys holding slots at once; a new key past it is
	// refused with ErrTableFull. 0 means 1<<20.
	MaxKeys int
}

// NewMemory returns a Memory limiter.
func NewMemory(o MemoryOptions) (*Memory, error) {
	if o.Limit < 1 {
		return nil, fmt.Errorf("inflight: Limit %d: must be at least 1", o.Limit)
	}
	if o.MaxKeys < 0 {
		return nil, fmt.Errorf("inflight: MaxKeys %d: must not be negative", o.MaxKeys)
	}
	if o.MaxKeys == 0 {
		o.MaxKeys = 1 << 20
	}
	m := &Memory{limit: o.Limit, maxKeys: o.MaxKeys}
	for i := range m.shards {
		m.shards[i].n, m.shards[i].m = make(map[string]int), m
	}
	return m, nil
}

// Limit returns the most slots a key may hold at once.
func (m *Memory) Limit() int { return m.limit }

// Keys returns how many keys hold slots now.
func (m *Memory) Keys() int {
	return int(m.keys.Load())
}

// InFlight returns how many slots key holds now.
func (m *Memory) InFlight(key string) int {
	s := m.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n[key]
}

func (m *Memory) shard(key string) *memShard {
	return &m.shards[siphash.Hash(0x666c6f6f64, 0x67617465, []byte(key))%memShards]
}

// Acquire takes a slot of key, or refuses when key holds Limit slots. It
// returns ErrTableFull when MaxKeys other keys hold slots, and ctx's
// error when ctx has ended.
func (m *Memory) Acquire(ctx context.Context, key string) (*Token, bool, error) {
	if err := ctx.Err(); err != nil {
		return nil, false, err
	}
	s := m.shard(key)
	s.mu.Lock()
	n, held := s.n[key]
	if n >= m.limit {
		s.mu.Unlock()
		return nil, false, nil
	}
	if !held && !m.addKey() {
		s.mu.Unlock()
		return nil, false, ErrTableFull
	}
	s.n[key] = n + 1
	s.mu.Unlock()
	return &Token{shard: s, key: key}, true, nil
}

func (m *Memory) addKey() bool {
	if m.keys.Add(1) > int64(m.maxKeys) {
		m.keys.Add(-1)
		return false
	}
	return true
}

func (s *memShard) release(key string) {
	s.mu.Lock()
	n := s.n[key] - 1
	if n > 0 {
		s.n[key] = n
		s.mu.Unlock()
		return
	}
	delete(s.n, key)
	s.mu.Unlock()
	s.m.keys.Add(-1)
}

// IsTableFull reports whether err says the key table was full.
func IsTableFull(err error) bool { return errors.Is(err, ErrTableFull) }

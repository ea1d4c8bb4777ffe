package inflight_test

import (
	"context"
	"strconv"
	"sync"
	"testing"

	"github.com/floodgate/floodgate/inflight"
)

// BenchmarkMemoryAcquireRelease is one Acquire and its Release on one key
// (limit never reached), serial and from every core on distinct keys.
func BenchmarkMemoryAcquireRelease(b *testing.B) {
	m, _ := inflight.NewMemory(inflight.MemoryOptions{Limit: 1 << 20})
	ctx := context.Background()
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			tok, _, _ := m.Acquire(ctx, "k")
			tok.Release()
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		var id sync.Mutex
		n := 0
		b.RunParallel(func(pb *testing.PB) {
			id.Lock()
			key := "k" + strconv.Itoa(n)
			n++
			id.Unlock()
			for pb.Next() {
				tok, _, _ := m.Acquire(ctx, key)
				tok.Release()
			}
		})
	})
}

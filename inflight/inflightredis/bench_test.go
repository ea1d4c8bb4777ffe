package inflightredis_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/floodgate/floodgate/inflight/inflightredis"
	"github.com/floodgate/floodgate/internal/redistest"
)

// BenchmarkRedisAcquireRelease is one Acquire (a script call) and its
// Release (a ZREM) on a real redis-server over loopback, serial, and from
// 64 goroutines on distinct keys; PING is the peer: one round trip on the
// same client in the same run.
func BenchmarkRedisAcquireRelease(b *testing.B) {
	srv := redistest.Standalone(b)
	c := redisClient(b, srv.Addr)
	r, err := inflightredis.New(c, inflightredis.Options{Limit: 1 << 20, Prefix: "bench:"})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	ctx := context.Background()
	ping := c.B().Ping().Build().Pin()
	b.Run("ping-serial", func(b *testing.B) {
		for b.Loop() {
			if err := c.Do(ctx, ping).Error(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			tok, ok, err := r.Acquire(ctx, "k")
			if !ok || err != nil {
				b.Fatal(ok, err)
			}
			tok.Release()
		}
	})
	var n atomic.Int64
	b.Run("ping-parallel64", func(b *testing.B) {
		b.SetParallelism(32)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				c.Do(ctx, ping) //nolint:errcheck
			}
		})
	})
	b.Run("parallel64", func(b *testing.B) {
		b.ReportAllocs()
		b.SetParallelism(32)
		b.RunParallel(func(pb *testing.PB) {
			key := "k" + strconv.FormatInt(n.Add(1), 10)
			for pb.Next() {
				tok, _, _ := r.Acquire(ctx, key)
				tok.Release()
			}
		})
	})
}

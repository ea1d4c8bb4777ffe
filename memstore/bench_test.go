package memstore_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/memstore"
)

func benchLimiter(b *testing.B, alg floodgate.Algorithm) *floodgate.Limiter {
	p := floodgate.MustPolicy("bench", floodgate.Rule{Algorithm: alg, Limit: 1 << 30, Period: time.Second})
	s := memstore.MustNew(memstore.Options{})
	b.Cleanup(func() { s.Close() })
	return floodgate.NewLimiter(p, s)
}

func BenchmarkAllowExistingKey(b *testing.B) {
	for _, alg := range []floodgate.Algorithm{floodgate.TokenBucket, floodgate.GCRA, floodgate.FixedWindow, floodgate.SlidingWindow} {
		b.Run(string(alg), func(b *testing.B) {
			l := benchLimiter(b, alg)
			ctx := context.Background()
			l.Allow(ctx, "user:1")
			b.ReportAllocs()
			for b.Loop() {
				l.Allow(ctx, "user:1")
			}
		})
	}
}

func BenchmarkAllowParallelKeys(b *testing.B) {
	l := benchLimiter(b, floodgate.TokenBucket)
	keys := make([]string, 1<<16)
	for i := range keys {
		keys[i] = "user:" + strconv.Itoa(1000000+i)
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			l.Allow(ctx, keys[i&(len(keys)-1)])
			i += 7
		}
	})
}

package memstore_test

import (
	"context"
	"strconv"
	"testing"
	"time"
	"unsafe"

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
			cpu := -cpuNanos()
			for b.Loop() {
				l.Allow(ctx, "user:1")
			}
			if cpu += cpuNanos(); cpu > 0 {
				b.ReportMetric(float64(cpu)/float64(b.N), "cpu-ns/op")
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

// BenchmarkNewKey is the insert path: every decision is on a key the store
// has not seen. below-cap: the tables grow (a store of at most 2^18 keys,
// made anew out of the timer); at-cap-decayed: at a cap of 2^16 keys whose
// states have decayed to fresh, so each new key takes the room of one;
// at-cap-spent: at the cap with every key spent (a daily quota used up by
// one request), the flood.
func BenchmarkNewKey(b *testing.B) {
	bucket := floodgate.MustPolicy("bucket", floodgate.Rule{Algorithm: floodgate.TokenBucket, Limit: 1000, Period: time.Second})
	quota := floodgate.MustPolicy("quota", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 1000, Period: 24 * time.Hour})
	for _, c := range []struct {
		name    string
		maxKeys int
		policy  *floodgate.Policy
		cost    int64
	}{
		{"below-cap", 0, bucket, 1},
		{"at-cap-decayed", 1 << 16, bucket, 1},
		{"at-cap-spent", 1 << 16, quota, 1000},
	} {
		b.Run(c.name, func(b *testing.B) {
			ctx := context.Background()
			open := func() *memstore.Store {
				return memstore.MustNew(memstore.Options{MaxKeys: c.maxKeys, SweepInterval: -1})
			}
			s := open()
			b.Cleanup(func() { s.Close() })
			buf := append(make([]byte, 0, 32), "new:"...)
			now := int64(1_800_000_000_000_000)
			op := floodgate.Op{Policy: c.policy, Kind: floodgate.OpAllow, Cost: c.cost}
			i := 0
			do := func() {
				k := strconv.AppendInt(buf[:4], int64(i), 10)
				op.Key = unsafe.String(&k[0], len(k)) // the store keeps a hash, not the key
				s.Do(ctx, now, op)
				i++
				now++ // a bucket of 1000/s has freed a request after 1000 decisions
			}
			if c.maxKeys > 0 {
				for range c.maxKeys { // fill to the cap
					do()
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			cpu := -cpuNanos()
			for b.Loop() {
				if c.maxKeys == 0 && i&(1<<18-1) == 0 {
					b.StopTimer()
					cpu += cpuNanos()
					s.Close()
					s = open()
					cpu -= cpuNanos()
					b.StartTimer()
				}
				do()
			}
			if cpu += cpuNanos(); cpu > 0 {
				b.ReportMetric(float64(cpu)/float64(b.N), "cpu-ns/op")
			}
		})
	}
}

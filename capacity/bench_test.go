package capacity

import (
	"context"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/memstore"
)

// BenchmarkAllow compares a Resource's Allow under a lease with the
// engine's Allow on the same memstore, the same token bucket and the same
// clock: the client's overhead is the difference. The capacity is large,
// so every request is admitted (docs/BENCHMARKS.md, "Capacity leases:
// client").
func BenchmarkAllow(b *testing.B) {
	const capa = 1e9
	store := memstore.MustNew(memstore.Options{})
	defer store.Close()
	c, err := New(ClientOptions{Addrs: []string{"127.0.0.1:1"}, Store: store, Logger: quietLogger(), Clock: clock.Coarse})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close(context.Background())
	r, err := c.Resource("bench", Options{Wants: capa})
	if err != nil {
		b.Fatal(err)
	}
	r.setLease(Lease{Capacity: capa, Expiry: time.Now().Add(time.Hour), Refresh: time.Hour}, capa, clock.Coarse.NowMicro())
	engine := floodgate.NewLimiter(floodgate.MustPolicy("engine", floodgate.Rule{
		Name: "capacity", Algorithm: floodgate.TokenBucket, Limit: capa * rateScale, Period: ratePeriod, Burst: capa,
	}), store)
	ctx := context.Background()
	b.Run("engine", func(b *testing.B) {
		for b.Loop() {
			if d, _ := engine.Allow(ctx, "bench"); !d.Allowed {
				b.Fatal("refused")
			}
		}
	})
	b.Run("client", func(b *testing.B) {
		for b.Loop() {
			if d, _ := r.Allow(ctx); !d.Allowed {
				b.Fatal("refused")
			}
		}
	})
	b.Run("engine-parallel", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				engine.Allow(ctx, "bench")
			}
		})
	})
	b.Run("client-parallel", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				r.Allow(ctx)
			}
		})
	})
}

// BenchmarkAllowPaired runs the engine's Allow and the client's in
// alternating batches of 1000 within one benchmark, so that a noisy host
// slows both alike, and reports each one's ns/op and their ratio.
func BenchmarkAllowPaired(b *testing.B) {
	const capa, batch = 1e9, 1000
	store := memstore.MustNew(memstore.Options{})
	defer store.Close()
	c, err := New(ClientOptions{Addrs: []string{"127.0.0.1:1"}, Store: store, Logger: quietLogger(), Clock: clock.Coarse})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close(context.Background())
	r, err := c.Resource("bench", Options{Wants: capa})
	if err != nil {
		b.Fatal(err)
	}
	r.setLease(Lease{Capacity: capa, Expiry: time.Now().Add(time.Hour), Refresh: time.Hour}, capa, clock.Coarse.NowMicro())
	engine := floodgate.NewLimiter(floodgate.MustPolicy("engine", floodgate.Rule{
		Name: "capacity", Algorithm: floodgate.TokenBucket, Limit: capa * rateScale, Period: ratePeriod, Burst: capa,
	}), store)
	ctx := context.Background()
	var te, tc time.Duration
	n := 0
	for b.Loop() {
		start := time.Now()
		for range batch {
			engine.Allow(ctx, "bench")
		}
		mid := time.Now()
		for range batch {
			r.Allow(ctx)
		}
		te, tc = te+mid.Sub(start), tc+time.Since(mid)
		n += batch
	}
	b.ReportMetric(float64(te.Nanoseconds())/float64(n), "engine-ns/op")
	b.ReportMetric(float64(tc.Nanoseconds())/float64(n), "client-ns/op")
	b.ReportMetric(float64(tc)/float64(te), "client/engine")
}

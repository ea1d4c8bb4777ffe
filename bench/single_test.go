package bench

import (
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/floodgate/floodgate"
)

// BenchmarkSingleKey compares Floodgate's Allow on one existing key
// ("user:1", through NewLimiter, a memstore and the default coarse clock)
// with golang.org/x/time/rate's Limiter.Allow, which limits one thing and
// reads time.Now on every call. Serial and b.RunParallel (every goroutine on
// the same key), under a limit that admits everything and one that denies
// everything after the first request.
func BenchmarkSingleKey(b *testing.B) {
	for _, lim := range []limits{admit, deny} {
		b.Run("limits="+lim.name, func(b *testing.B) {
			for _, mode := range []string{"serial", "parallel"} {
				b.Run("mode="+mode, func(b *testing.B) {
					for _, fg := range []struct {
						name string
						alg  floodgate.Algorithm
					}{{"fg_token_bucket", floodgate.TokenBucket}, {"fg_gcra", floodgate.GCRA}} {
						b.Run("impl="+fg.name, func(b *testing.B) {
							a := newFloodgate(fgRule(fg.alg, lim))
							defer a.close()
							singleFloodgate(b, a.l, mode == "parallel")
						})
					}
					b.Run("impl=x-time-rate", func(b *testing.B) {
						every := lim.period / time.Duration(lim.limit)
						singleRate(b, rate.NewLimiter(rate.Every(every), int(lim.limit)), mode == "parallel")
					})
				})
			}
		})
	}
}

func singleFloodgate(b *testing.B, l *floodgate.Limiter, parallel bool) {
	const key = "user:1"
	l.Allow(ctx, key) // the key exists before timing starts
	var admitted atomic.Uint64
	b.ReportAllocs()
	b.ResetTimer()
	if parallel {
		b.RunParallel(func(pb *testing.PB) {
			n := uint64(0)
			for pb.Next() {
				if d, _ := l.Allow(ctx, key); d.Allowed {
					n++
				}
			}
			admitted.Add(n)
		})
	} else {
		n := uint64(0)
		for range b.N {
			if d, _ := l.Allow(ctx, key); d.Allowed {
				n++
			}
		}
		admitted.Add(n)
	}
	b.StopTimer()
	report(b, int(admitted.Load()), b.N)
}

func singleRate(b *testing.B, l *rate.Limiter, parallel bool) {
	l.Allow()
	var admitted atomic.Uint64
	b.ReportAllocs()
	b.ResetTimer()
	if parallel {
		b.RunParallel(func(pb *testing.PB) {
			n := uint64(0)
			for pb.Next() {
				if l.Allow() {
					n++
				}
			}
			admitted.Add(n)
		})
	} else {
		n := uint64(0)
		for range b.N {
			if l.Allow() {
				n++
			}
		}
		admitted.Add(n)
	}
	b.StopTimer()
	report(b, int(admitted.Load()), b.N)
}

package bench

import (
	"runtime"
	"sync/atomic"
	"testing"
)

// BenchmarkKeyed compares the keyed limiters on three workloads, each under
// a limit that admits everything (limits=admit) and one that denies every
// request after a key's first (limits=deny):
//
//	workload=hot       one key, serial
//	workload=uniform   1M keys, uniformly at random, serial
//	workload=parallel  1M keys, uniformly at random, b.RunParallel
//
// Every key is requested once before timing starts, so all three measure
// decisions on existing keys. The keys are pre-generated strings.
func BenchmarkKeyed(b *testing.B) {
	allKeys()
	for _, lim := range []limits{admit, deny} {
		b.Run("limits="+lim.name, func(b *testing.B) {
			for _, fg := range fgKeyed {
				b.Run("impl="+fg.name, func(b *testing.B) {
					runKeyed(b, func() fgAllower { return newFloodgate(fgRule(fg.alg, lim)) })
				})
			}
			b.Run("impl=go-limiter", func(b *testing.B) {
				runKeyed(b, func() goLimiterAllower { return newGoLimiter(lim) })
			})
			b.Run("impl=ulule", func(b *testing.B) {
				runKeyed(b, func() ululeAllower { return newUlule(lim) })
			})
		})
	}
}

// runKeyed builds one limiter, requests every key once, and runs the three
// workloads on it.
func runKeyed[A allower](b *testing.B, mk func() A) {
	a := mk()
	defer a.close()
	ks := allKeys()
	for _, k := range ks {
		a.allow(k)
	}
	checkHeld(b, a)
	runtime.GC() // start every workload without the population's GC debt

	b.Run("workload=hot", func(b *testing.B) {
		hot := ks[1]
		admitted := 0
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			if a.allow(hot) {
				admitted++
			}
		}
		b.StopTimer()
		report(b, admitted, b.N)
	})

	b.Run("workload=uniform", func(b *testing.B) {
		r := rng(0x9e3779b97f4a7c15)
		admitted := 0
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			if a.allow(ks[r.pick(len(ks))]) {
				admitted++
			}
		}
		b.StopTimer()
		report(b, admitted, b.N)
	})

	b.Run("workload=parallel", func(b *testing.B) {
		var seed, admitted atomic.Uint64
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			r := rng(0x9e3779b97f4a7c15 * (seed.Add(1) + 1))
			n := uint64(0)
			for pb.Next() {
				if a.allow(ks[r.pick(len(ks))]) {
					n++
				}
			}
			admitted.Add(n)
		})
		b.StopTimer()
		report(b, int(admitted.Load()), b.N)
	})
	checkHeld(b, a)
}

// checkHeld fails the benchmark if a Floodgate store no longer holds every
// key: the workloads would then measure inserts, not existing keys.
func checkHeld(b *testing.B, a any) {
	if h, ok := a.(interface{ heldKeys() int64 }); ok {
		if n := h.heldKeys(); n != numKeys {
			b.Fatalf("the store holds %d keys, not %d", n, numKeys)
		}
	}
}

package redisstore

import (
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
)

// BenchmarkLocalTableMemory fills failure_mode local's table (localsync.go)
// with Options.LocalKeys keys of 16 bytes, as Redis's replies do, and
// reports the heap it takes per key: what LocalKeys costs. Run with
// -benchtime=1x.
func BenchmarkLocalTableMemory(b *testing.B) {
	const keys = 1 << 16
	p := floodgate.MustPolicy("mem", floodgate.Rule{Name: "r", Algorithm: floodgate.FixedWindow, Limit: 100, Period: time.Minute,
		OnStoreFailure: floodgate.FailLocal, LocalPercent: 50})
	names := make([]string, keys)
	for i := range names {
		names[i] = "user-" + strconv.Itoa(1e10+i) // 16 bytes
	}
	for range b.N {
		fb, err := newFallback()
		if err != nil {
			b.Fatal(err)
		}
		s := &Store{opts: Options{BreakerCooldown: time.Second, MaxBatch: 64}, fallback: fb}
		ls := newLocalSync(s, fb, keys)
		d := floodgate.Decision{Allowed: true, Limit: 100, Remaining: 50, Rule: "r"}
		ls.answered(&floodgate.Op{Policy: p, Key: names[0], Cost: 1}, &d, 1)
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for i := range names {
			ls.answered(&floodgate.Op{Policy: p, Key: names[i], Cost: 1}, &d, 1)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/keys, "bytes/key")
		runtime.KeepAlive(ls)
		ls.close()
		fb.close()
	}
}

// BenchmarkLocalAnswered is what each decision Redis makes on a policy
// with local rules costs for recording it (localsync.go's answered), on
// 1,024 keys already in the table: compare with a decision's round trip.
func BenchmarkLocalAnswered(b *testing.B) {
	p := floodgate.MustPolicy("ans", floodgate.Rule{Name: "r", Algorithm: floodgate.FixedWindow, Limit: 100, Period: time.Minute,
		OnStoreFailure: floodgate.FailLocal, LocalPercent: 50})
	fb, err := newFallback()
	if err != nil {
		b.Fatal(err)
	}
	defer fb.close()
	s := &Store{opts: Options{BreakerCooldown: time.Second, MaxBatch: 64}, fallback: fb}
	ls := newLocalSync(s, fb, 1<<16)
	defer ls.close()
	ops := make([]floodgate.Op, 1024)
	for i := range ops {
		ops[i] = floodgate.Op{Policy: p, Key: "user-" + strconv.Itoa(i), Cost: 1}
	}
	d := floodgate.Decision{Allowed: true, Limit: 100, Remaining: 50, Rule: "r"}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			ls.answered(&ops[i%len(ops)], &d, int64(i))
			i++
		}
	})
}

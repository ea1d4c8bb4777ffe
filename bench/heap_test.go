package bench

import (
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/floodgate/floodgate"
)

// heapRules are Floodgate's algorithms as measured for heap per key. The
// periods are long (an hour) so that no key's state is back at fresh, and
// so droppable, before the measurement ends.
var heapRules = []struct {
	name string
	rule floodgate.Rule
}{
	{"token_bucket", floodgate.Rule{Algorithm: floodgate.TokenBucket, Limit: 100, Period: time.Hour}},
	{"token_bucket_interval", floodgate.Rule{Algorithm: floodgate.TokenBucket, Refill: floodgate.RefillInterval, Limit: 100, Period: time.Hour}},
	{"leaky_bucket", floodgate.Rule{Algorithm: floodgate.LeakyBucket, Limit: 100, Period: time.Hour}},
	{"leaky_bucket_shaper", floodgate.Rule{Algorithm: floodgate.LeakyBucketShaper, Limit: 100, Period: time.Hour}},
	{"gcra", floodgate.Rule{Algorithm: floodgate.GCRA, Limit: 100, Period: time.Hour}},
	{"fixed_window", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 100, Period: time.Hour}},
	{"sliding_log", floodgate.Rule{Algorithm: floodgate.SlidingLog, Limit: 10, Period: time.Hour}},
	{"sliding_window", floodgate.Rule{Algorithm: floodgate.SlidingWindow, Limit: 100, Period: time.Hour}},
	{"sliding_subwindow", floodgate.Rule{Algorithm: floodgate.SlidingSubwindow, Limit: 500, Period: time.Hour, Granularity: time.Minute}},
}

// BenchmarkHeapPerKey measures the live heap one key costs at 1M keys: a
// full GC and runtime.ReadMemStats before creating the store, one request
// for each of 1M keys, a full GC and ReadMemStats again; B/key is the
// HeapAlloc difference over 1M.
//
// The keys are user:0000000 … user:0999999, formatted on the fly with
// strconv into a reused buffer and converted to a fresh string per request,
// as a server would receive them. A store that keeps its keys (go-limiter,
// ulule, a map of x/time/rate limiters) therefore pays for the strings it
// keeps, which is its real cost; Floodgate keeps only a 64-bit hash, and
// the strings it was passed are garbage by the second GC.
//
// ns/op is one whole iteration (store creation, 1M first requests and two
// GCs); ns/insert is the first request of one new key.
func BenchmarkHeapPerKey(b *testing.B) {
	for _, h := range heapRules {
		b.Run("impl=fg_"+h.name, func(b *testing.B) {
			heapPerKey(b, func() (func(string), func() int64, func()) {
				a := newFloodgate(h.rule)
				count := func() int64 { return a.s.Stats().Keys }
				return func(k string) { a.allow(k) }, count, a.close
			})
		})
	}
	peer := limits{"heap", 100, time.Hour}
	b.Run("impl=go-limiter", func(b *testing.B) {
		heapPerKey(b, func() (func(string), func() int64, func()) {
			a := newGoLimiter(peer)
			return func(k string) { a.allow(k) }, nil, a.close
		})
	})
	b.Run("impl=ulule", func(b *testing.B) {
		heapPerKey(b, func() (func(string), func() int64, func()) {
			a := newUlule(peer)
			return func(k string) { a.allow(k) }, nil, a.close
		})
	})
	// The usual way to key golang.org/x/time/rate: a map of limiters under a
	// mutex. x/time/rate has no keyed store of its own; this row is for
	// reference.
	b.Run("impl=x-time-rate_map", func(b *testing.B) {
		heapPerKey(b, func() (func(string), func() int64, func()) {
			var mu sync.Mutex
			m := map[string]*rate.Limiter{}
			every := peer.period / time.Duration(peer.limit)
			insert := func(k string) {
				mu.Lock()
				l, ok := m[k]
				if !ok {
					l = rate.NewLimiter(rate.Every(every), int(peer.limit))
					m[k] = l
				}
				mu.Unlock()
				l.Allow()
			}
			count := func() int64 { return int64(len(m)) }
			return insert, count, func() { runtime.KeepAlive(m) }
		})
	})
}

// heapPerKey runs b.N measurements with stores made by setup, which returns
// the request function, a key count (or nil) and the store's close.
func heapPerKey(b *testing.B, setup func() (insert func(string), count func() int64, close func())) {
	var sumBytes, sumInsert float64
	var before, after runtime.MemStats
	retries := 0
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		runtime.GC()
		runtime.ReadMemStats(&before)
		insert, count, closeFn := setup()
		var buf [12]byte
		copy(buf[:], "user:")
		var digits [16]byte
		start := time.Now()
		for k := range numKeys {
			d := strconv.AppendInt(digits[:0], int64(10_000_000+k), 10) // "1" + 7 digits
			copy(buf[5:], d[1:])
			insert(string(buf[:]))
		}
		elapsed := time.Since(start)
		runtime.GC()
		runtime.ReadMemStats(&after)
		if count != nil {
			if n := count(); n != numKeys {
				// A key became fresh and was dropped (a window boundary
				// passed): this measurement does not count 1M keys.
				b.Logf("store holds %d keys, not %d; measuring again", n, numKeys)
				closeFn()
				if retries++; retries > 3 {
					b.Fatalf("store keeps dropping keys")
				}
				i--
				continue
			}
		}
		sumBytes += float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / numKeys
		sumInsert += float64(elapsed.Nanoseconds()) / numKeys
		closeFn()
		runtime.KeepAlive(insert)
	}
	b.StopTimer()
	b.ReportMetric(sumBytes/float64(b.N), "B/key")
	b.ReportMetric(sumInsert/float64(b.N), "ns/insert")
}

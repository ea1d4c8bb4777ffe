package overrides

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate/internal/redistest"
)

// benchCache is a cache over Bolt holding n overrides (keys "user=I" for
// even I) and n absences (odd I), all looked up once.
func benchCache(b *testing.B, n int) (*Cache, []string, []string) {
	ctx := context.Background()
	s := openBolt(b)
	var batch []Override
	var present, absent []string
	for i := range 2 * n {
		k := fmt.Sprintf("user=%d", i)
		if i%2 == 0 {
			batch = append(batch, Override{Domain: "api", Key: k, Limit: 5, Period: time.Second})
			present = append(present, k)
		} else {
			absent = append(absent, k)
		}
	}
	if err := s.PutMany(ctx, batch); err != nil {
		b.Fatal(err)
	}
	c := NewCache(s, 4*n, time.Minute)
	for _, k := range append(present, absent...) {
		c.Get(ctx, "api", k)
	}
	return c, present, absent
}

func benchGet(b *testing.B, c *Cache, keys []string, want bool) {
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if _, ok, err := c.Get(ctx, "api", keys[i%len(keys)]); ok != want || err != nil {
			b.Fatal(ok, err)
		}
	}
}

// go test -run '^$' -bench 'CacheGet' -benchmem ./overrides/
func BenchmarkCacheGetHit(b *testing.B) {
	c, present, _ := benchCache(b, 10_000)
	benchGet(b, c, present, true)
}

func BenchmarkCacheGetMiss(b *testing.B) {
	c, _, absent := benchCache(b, 10_000)
	benchGet(b, c, absent, false)
}

func BenchmarkCacheGetHitParallel(b *testing.B) {
	c, present, _ := benchCache(b, 10_000)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			c.Get(ctx, "api", present[i%len(present)])
			i += 7
		}
	})
}

// BenchmarkCacheGetLoad: every Get a key not cached, loaded from Bolt.
func BenchmarkCacheGetLoad(b *testing.B) {
	c, present, _ := benchCache(b, 10_000)
	c2 := NewCache(c.Store(), 100, time.Minute)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		c2.Get(ctx, "api", present[(i*7919)%len(present)])
	}
}

func BenchmarkBoltGet(b *testing.B) {
	c, present, _ := benchCache(b, 10_000)
	benchStoreGet(b, c.Store(), present)
}

func BenchmarkRedisGet(b *testing.B) {
	srv := redistest.Standalone(b)
	r := NewRedis(redisClient(b, srv.Addr), "fg")
	var keys []string
	var batch []Override
	for i := range 10_000 {
		keys = append(keys, fmt.Sprintf("user=%d", i))
		batch = append(batch, Override{Domain: "api", Key: keys[i], Limit: 5, Period: time.Second})
	}
	if err := r.PutMany(context.Background(), batch); err != nil {
		b.Fatal(err)
	}
	benchStoreGet(b, r, keys)
}

func benchStoreGet(b *testing.B, s Store, keys []string) {
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if _, ok, err := s.Get(ctx, "api", keys[i%len(keys)]); !ok || err != nil {
			b.Fatal(ok, err)
		}
	}
}

// millionBatches calls put with a million overrides of one domain in
// batches of size, keys in random order or in key order.
func millionBatches(b *testing.B, size int, sorted bool, put func([]Override) error) {
	batch := make([]Override, 0, size)
	const n = 1_000_000
	for i := range n {
		id := (uint64(i) * 0x9e3779b97f4a7c15) >> 40 // distinct for i < 2^24
		if sorted {
			id = uint64(i)
		}
		batch = append(batch, Override{Domain: "api", Key: fmt.Sprintf("user=%08d", id), Limit: int64(i%1000 + 1), Period: time.Second})
		if len(batch) == size || i == n-1 {
			if err := put(batch); err != nil {
				b.Fatal(err)
			}
			batch = batch[:0]
		}
	}
}

// go test -run '^$' -bench 'PutMany1M' -benchtime 1x ./overrides/
func BenchmarkBoltPutMany1M(b *testing.B) {
	for _, order := range []string{"random", "sorted"} {
		for _, size := range []int{10_000, 50_000} {
			b.Run(fmt.Sprintf("%s/batch=%d", order, size), func(b *testing.B) {
				for range b.N {
					b.StopTimer()
					path := filepath.Join(b.TempDir(), "o.db")
					s, err := OpenBolt(path)
					if err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
					millionBatches(b, size, order == "sorted", func(batch []Override) error {
						return s.PutMany(context.Background(), batch)
					})
					b.StopTimer()
					s.Close()
					fi, _ := os.Stat(path)
					b.ReportMetric(float64(fi.Size())/1e6, "MB")
					b.StartTimer()
				}
				b.ReportMetric(float64(b.Elapsed().Seconds())/float64(b.N), "s/1M")
			})
		}
	}
}

func BenchmarkRedisPutMany1M(b *testing.B) {
	srv := redistest.Standalone(b)
	r := NewRedis(redisClient(b, srv.Addr), "fg")
	for range b.N {
		b.StopTimer()
		redistest.Cmd(srv.Addr, "FLUSHALL")
		base := redisMemory(b, srv.Addr)
		b.StartTimer()
		millionBatches(b, 10_000, false, func(batch []Override) error {
			return r.PutMany(context.Background(), batch)
		})
		b.StopTimer()
		b.ReportMetric(float64(redisMemory(b, srv.Addr)-base)/1e6, "MB")
		b.StartTimer()
	}
	b.ReportMetric(float64(b.Elapsed().Seconds())/float64(b.N), "s/1M")
}

func redisMemory(b *testing.B, addr string) int64 {
	out, err := redistest.Cmd(addr, "INFO", "memory")
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	b.Fatal("no used_memory")
	return 0
}

// BenchmarkCacheGetNoOverrides: a lookup in a domain with no overrides at
// all (the usual case), over Bolt, which knows its domains.
func BenchmarkCacheGetNoOverrides(b *testing.B) {
	s := openBolt(b)
	c := NewCache(s, 1<<16, time.Minute)
	defer c.Close()
	ctx := context.Background()
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = "user=" + strconv.Itoa(i)
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if _, ok, err := c.Get(ctx, "api", keys[i%len(keys)]); ok || err != nil {
			b.Fatal(ok, err)
		}
	}
}

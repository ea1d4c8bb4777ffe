package memstore_test

import (
	"context"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/memstore"
)

// journalModes are the journal settings the benchmarks compare, in one run.
var journalModes = []struct {
	name string
	opts func(dir string) memstore.Options
}{
	{"off", func(dir string) memstore.Options { return memstore.Options{} }},
	{"snapshot-only", func(dir string) memstore.Options {
		return memstore.Options{SnapshotPath: filepath.Join(dir, "s"), SnapshotInterval: time.Hour}
	}},
	{"sync=100ms", journalOpts(100*time.Millisecond, false)},
	{"sync=10ms", journalOpts(10*time.Millisecond, false)},
	{"sync=1ms", journalOpts(time.Millisecond, false)},
	{"sync=10ms,write-through", journalOpts(10*time.Millisecond, true)},
}

func journalOpts(sync time.Duration, through bool) func(string) memstore.Options {
	return func(dir string) memstore.Options {
		return memstore.Options{SnapshotPath: filepath.Join(dir, "s"), SnapshotInterval: time.Hour,
			JournalPath: filepath.Join(dir, "j"), JournalSync: sync, JournalWriteThrough: through}
	}
}

// BenchmarkJournal is a decision's cost with and without the journal:
// one key from one goroutine, and 64 Ki keys from GOMAXPROCS goroutines.
func BenchmarkJournal(b *testing.B) {
	p := floodgate.MustPolicy("bench", floodgate.Rule{Algorithm: floodgate.TokenBucket, Limit: 1 << 30, Period: time.Second})
	keys := make([]string, 1<<16)
	for i := range keys {
		keys[i] = "user:" + strconv.Itoa(1000000+i)
	}
	ctx := context.Background()
	for _, m := range journalModes {
		open := func(b *testing.B) *floodgate.Limiter {
			s, err := memstore.New(m.opts(b.TempDir()))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close() })
			return floodgate.NewLimiter(p, s)
		}
		b.Run("key/"+m.name, func(b *testing.B) {
			l := open(b)
			l.Allow(ctx, "user:1")
			b.ReportAllocs()
			for b.Loop() {
				l.Allow(ctx, "user:1")
			}
		})
		b.Run("parallel/"+m.name, func(b *testing.B) {
			l := open(b)
			b.ReportAllocs()
			b.ResetTimer() // not the store's opening (its fsyncs)
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					l.Allow(ctx, keys[i&(len(keys)-1)])
					i += 7
				}
			})
		})
	}
}

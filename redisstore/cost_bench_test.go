package redisstore_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/redistest"
	"github.com/floodgate/floodgate/redisstore"
)

// BenchmarkScriptCost measures what a decision costs Redis itself, the
// resource a fleet shares: each iteration sends one BatchFunction call of
// 16 decisions (the size the coalescer reaches under load) over 1,000 keys,
// exactly as the store builds it, and the benchmark reports Redis's own
// time inside those calls per decision (redis-µs/decision, from INFO
// commandstats), beside the client's wall time.
//
//	go test -run '^$' -bench ScriptCost ./redisstore
func BenchmarkScriptCost(b *testing.B) {
	srv := redistest.Standalone(b)
	s, err := redisstore.New("redis://"+srv.Addr, redisstore.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	const batch, keys = 16, 1000
	for _, r := range []floodgate.Rule{
		{Algorithm: floodgate.FixedWindow, Limit: 1e9, Period: time.Second},
		{Algorithm: floodgate.TokenBucket, Limit: 1e9, Period: time.Second, Burst: 1e9},
		{Algorithm: floodgate.SlidingWindow, Limit: 1e9, Period: time.Minute},
		{Algorithm: floodgate.SlidingLog, Limit: 20, Period: time.Millisecond},
	} {
		name := string(r.Algorithm)
		b.Run(name, func(b *testing.B) {
			p := floodgate.MustPolicy("cost-"+name, r)
			cmds := make([]rueidis.Completed, 0, keys/batch)
			for k := 0; k+batch <= keys; k += batch {
				ops := make([]floodgate.Op, batch)
				for i := range ops {
					ops[i] = p.Op(floodgate.OpAllow, "k"+strconv.Itoa(k+i), 1, 0)
				}
				c, err := s.BatchCommand(ctx, 0, ops)
				if err != nil {
					b.Fatal(err)
				}
				cmds = append(cmds, s.Client().B().Arbitrary(c...).Build().Pin())
			}
			before := fcallMicros(b, s)
			b.ResetTimer()
			for i := range b.N {
				if err := s.Client().Do(ctx, cmds[i%len(cmds)]).Error(); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric((fcallMicros(b, s)-before)/float64(b.N*batch), "redis-µs/decision")
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*batch), "wall-µs/decision")
		})
	}
}

// fcallMicros returns Redis's total time inside FCALL so far, in µs.
func fcallMicros(b *testing.B, s *redisstore.Store) float64 {
	info, err := s.Client().Do(context.Background(), s.Client().B().Info().Section("commandstats").Build()).ToString()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_fcall:"); ok {
			for _, f := range strings.Split(rest, ",") {
				if v, ok := strings.CutPrefix(f, "usec="); ok {
					var n float64
					if _, err := fmt.Sscan(v, &n); err != nil {
						b.Fatal(err)
					}
					return n
				}
			}
		}
	}
	return 0
}

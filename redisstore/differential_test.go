package redisstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/redistest"
	"github.com/floodgate/floodgate/redisstore"
	"github.com/floodgate/floodgate/storekit"
)

// randomRule draws a rule of any algorithm and mode, small enough that
// traces hit every edge.
func randomRule(r *rand.Rand, name string, spare *bool) floodgate.Rule {
	periods := []time.Duration{time.Second, 7 * time.Second, time.Minute, 90 * time.Second, time.Hour}
	rule := floodgate.Rule{Name: name, Limit: 1 + r.Int64N(8), Period: periods[r.IntN(len(periods))]}
	switch r.IntN(10) {
	case 0:
		rule.Algorithm = floodgate.TokenBucket
		rule.Burst = r.Int64N(3) * rule.Limit / 2
	case 1:
		rule.Algorithm, rule.Refill = floodgate.TokenBucket, floodgate.RefillInterval
		rule.Burst = r.Int64N(2) * (rule.Limit + 2)
	case 2:
		rule.Algorithm = floodgate.LeakyBucket
	case 3:
		rule.Algorithm = floodgate.LeakyBucketShaper
		rule.Burst = 1 + r.Int64N(5)
	case 4:
		rule.Algorithm = floodgate.GCRA
		rule.Limit = 1 + r.Int64N(1000) // rates that do not divide the period
	case 5:
		rule.Algorithm = floodgate.FixedWindow
		if r.IntN(2) == 0 {
			rule.Calendar = []floodgate.Calendar{floodgate.CalendarDay, floodgate.CalendarWeek, floodgate.CalendarMonth}[r.IntN(3)]
			rule.Location, _ = time.LoadLocation([]string{"UTC", "Europe/Paris", "America/Santiago", "Asia/Kathmandu"}[r.IntN(4)])
			rule.WeekStart = time.Weekday(r.IntN(7))
		}
	case 6:
		rule.Algorithm, rule.CountRejected = floodgate.SlidingLog, r.IntN(2) == 0
	case 7, 8:
		rule.Algorithm = floodgate.SlidingWindow
	case 9:
		rule.Algorithm = floodgate.SlidingSubwindow
		rule.Granularity = rule.Period / time.Duration([]int{1, 2, 5, 60}[r.IntN(4)])
		if rule.Period%rule.Granularity != 0 {
			rule.Granularity = rule.Period
		}
	}
	switch r.IntN(6) {
	case 0:
		rule.Mode, rule.SoftPercent = floodgate.Soft, 10+r.Int64N(100)
	case 1:
		rule.Mode, rule.ElasticCeiling = floodgate.Elastic, 2*max(rule.Limit, rule.Burst)+1
		rule.Spare = func() bool { return *spare }
	}
	return rule
}

func randomPolicy(r *rand.Rand, name string, spare *bool) *floodgate.Policy {
	n := 1 + r.IntN(3)
	rules := make([]floodgate.Rule, n)
	for i := range rules {
		rules[i] = randomRule(r, fmt.Sprintf("r%d", i), spare)
	}
	p, err := floodgate.NewPolicy(name, rules...)
	if err != nil {
		panic(err)
	}
	return p
}

// Random traces through the Go engine (storekit.Apply on local state, which
// is what the memory store runs) and through Redis with the same injected
// times must give identical decisions: the Lua is the same math.
func TestDifferentialAgainstGo(t *testing.T) {
	srv := redistest.Standalone(t)
	t.Run("functions", func(t *testing.T) { differential(t, srv, false, false, 150) })
	// The same code as a plain script (EVALSHA), as on servers before Redis 7.
	t.Run("scripts", func(t *testing.T) { differential(t, srv, true, false, 30) })
	// Every decision through the batch function (and script), as
	// concurrent callers' decisions are sent.
	t.Run("batch functions", func(t *testing.T) { differential(t, srv, false, true, 60) })
	t.Run("batch scripts", func(t *testing.T) { differential(t, srv, true, true, 15) })
	// Without coalescing (as in a Cluster) every decision is a call of
	// Function; the runs above go through PackedFunction (functions,
	// scripts) and BatchFunction (batch).
	t.Run("single function", func(t *testing.T) { differentialWith(t, srv, false, false, true, 60) })
}

func differential(t *testing.T, srv *redistest.Server, scripts, batch bool, traces int) {
	differentialWith(t, srv, scripts, batch, false, traces)
}

func differentialWith(t *testing.T, srv *redistest.Server, scripts, batch, each bool, traces int) {
	s, err := redisstore.New("redis://"+srv.Addr, redisstore.Options{ClientTime: true, Timeout: 5 * time.Second,
		Prefix: fmt.Sprintf("diff%v%v%v", scripts, batch, each), NoFunctions: scripts, NoCoalescing: each})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if batch {
		redisstore.SetBatchAlways(s)
	}
	ctx := context.Background()
	steps := 80
	if n, err := strconv.Atoi(os.Getenv("FLOODGATE_DIFF_TRACES")); err == nil {
		traces = n // longer runs: FLOODGATE_DIFF_TRACES=5000 go test -run Differential ./redisstore
	}
	for trace := range traces {
		seed := uint64(trace)*7919 + 1
		r := rand.New(rand.NewPCG(seed, 42))
		spare := false
		name := fmt.Sprintf("t%d", trace)
		p := randomPolicy(r, name, &spare)
		type local struct {
			st []int64
			p  *floodgate.Policy // the version its state was written under
		}
		keys := map[string]*local{}
		now := time.Date(2026, time.Month(1+r.IntN(12)), 1+r.IntN(28), r.IntN(24), 0, 0, 0, time.UTC).UnixMicro()
		var log []string
		for step := range steps {
			switch x := r.IntN(10); {
			case x < 5:
				now += r.Int64N(3_000_000)
			case x < 8:
				now += r.Int64N(120_000_000)
			case x < 9:
				now += r.Int64N(7200_000_000)
			}
			spare = r.IntN(2) == 0
			if r.IntN(40) == 0 { // a limit change: state converts on each key's next use
				rules := p.Rules()
				if np, err := p.WithLimit(rules[r.IntN(len(rules))].Name, 1+r.Int64N(10)); err == nil {
					p = np
				}
			}
			key := fmt.Sprintf("k%d", r.IntN(3))
			kinds := []floodgate.OpKind{floodgate.OpAllow, floodgate.OpAllow, floodgate.OpAllow, floodgate.OpPeek,
				floodgate.OpReserve, floodgate.OpCharge, floodgate.OpRefund, floodgate.OpReset}
			op := floodgate.Op{Policy: p, Key: key, Kind: kinds[r.IntN(len(kinds))], Cost: r.Int64N(4),
				MaxDelay: time.Duration(r.Int64N(30)) * time.Second}
			if r.IntN(20) == 0 {
				op.Cost = 20 + r.Int64N(100)
			}
			for i, rule := range p.Rules() {
				if rule.Mode == floodgate.Elastic && spare {
					op.Spare |= 1 << i
				}
			}
			l := keys[key]
			if l == nil {
				l = &local{st: make([]int64, storekit.Width(p)), p: p}
				keys[key] = l
			}
			if l.p != p {
				st := make([]int64, storekit.Width(p))
				storekit.Migrate(p, l.p, l.st, st, now)
				l.st, l.p = st, p
			}
			want := storekit.Apply(p, l.st, now, op)
			got, err := s.Do(ctx, now, op)
			log = append(log, fmt.Sprintf("  step %d t=%d %s %s cost=%d maxDelay=%s spare=%v -> %+v", step, now, key, op.Kind, op.Cost, op.MaxDelay, spare, want))
			if err != nil || got != want {
				var rs []string
				for _, rule := range p.Rules() {
					rs = append(rs, fmt.Sprintf("%+v", rule))
				}
				t.Fatalf("trace %d (seed %d) step %d: Redis and Go disagree\nrules:\n  %s\ntrace:\n%s\n got %+v (err %v)\nwant %+v",
					trace, seed, step, strings.Join(rs, "\n  "), strings.Join(log, "\n"), got, err, want)
			}
		}
	}
	if st := s.Stats(); st.Errors != 0 {
		t.Fatalf("store errors: %+v", st)
	}
}

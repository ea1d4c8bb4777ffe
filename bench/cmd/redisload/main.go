// Command redisload measures Floodgate's Redis store against
// go-redis/redis_rate (GCRA) on one local Redis, in one run: decisions per
// second and p50/p99 latency at several concurrencies, for one rule and for
// a three-rule policy (which costs redis_rate three calls); Redis round trips
// and script calls per decision (INFO stats and commandstats); and the raw
// ceiling, redis-benchmark running Floodgate's own script call with 50
// clients and pipeline 16.
//
//	go run ./cmd/redisload                 # starts its own redis-server on a free port
//	go run ./cmd/redisload -addr 127.0.0.1:6390 -duration 5s -conc 1,16,256
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/bench/internal/redisproc"
	"github.com/floodgate/floodgate/redisstore"
)

func main() {
	addr := flag.String("addr", "", "Redis address (default: start a redis-server on a free loopback port)")
	duration := flag.Duration("duration", 4*time.Second, "length of each measurement")
	concs := flag.String("conc", "1,16,256", "concurrent callers")
	nkeys := flag.Int("keys", 10000, "distinct keys")
	flag.Parse()
	if err := run(*addr, *duration, *concs, *nkeys); err != nil {
		fmt.Fprintln(os.Stderr, "redisload:", err)
		os.Exit(1)
	}
}

type impl struct {
	name  string
	rules int
	call  func(ctx context.Context, key string) (bool, error)
}

type result struct {
	impl               string
	rules, conc        int
	n                  int
	perSec             float64
	p50, p99           time.Duration
	evalsPerDecision   float64
	roundTripsPerDecis float64
	errs               int
}

func run(addr string, duration time.Duration, concList string, nkeys int) error {
	addr, stop, err := redisproc.Use(addr)
	if err != nil {
		return err
	}
	defer stop()
	var concs []int
	for _, c := range strings.Split(concList, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(c))
		if err != nil {
			return fmt.Errorf("-conc: %w", err)
		}
		concs = append(concs, n)
	}
	keys := make([]string, nkeys)
	for i := range keys {
		keys[i] = "user:" + strconv.Itoa(1000000+i)
	}

	store, err := redisstore.New("redis://"+addr, redisstore.Options{Timeout: 5 * time.Second, Prefix: "load"})
	if err != nil {
		return err
	}
	defer store.Close()
	// Limits high enough that every request is admitted: the cost measured is
	// the decision, not a short cut for denials.
	gcra := func(name string, per time.Duration, n int64) floodgate.Rule {
		return floodgate.Rule{Name: name, Algorithm: floodgate.GCRA, Limit: n, Period: per}
	}
	one := floodgate.NewLimiter(floodgate.MustPolicy("one", gcra("second", time.Second, 1_000_000)), store)
	three := floodgate.NewLimiter(floodgate.MustPolicy("three",
		gcra("second", time.Second, 1_000_000), gcra("minute", time.Minute, 60_000_000), gcra("hour", time.Hour, 3_600_000_000)), store)

	rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 300, MinIdleConns: 64})
	defer rdb.Close()
	rr := redis_rate.NewLimiter(rdb)
	rrLimits := []redis_rate.Limit{
		{Rate: 1_000_000, Burst: 1_000_000, Period: time.Second},
		{Rate: 60_000_000, Burst: 60_000_000, Period: time.Minute},
		{Rate: 3_600_000_000, Burst: 3_600_000_000, Period: time.Hour},
	}
	fg := func(l *floodgate.Limiter) func(context.Context, string) (bool, error) {
		return func(ctx context.Context, key string) (bool, error) {
			d, err := l.Allow(ctx, key)
			if err == nil && d.Degraded {
				err = errors.New("degraded")
			}
			return d.Allowed, err
		}
	}
	rrCall := func(n int) func(context.Context, string) (bool, error) {
		return func(ctx context.Context, key string) (bool, error) {
			// Three limits cost redis_rate three calls (and are not all or nothing).
			for _, lim := range rrLimits[:n] {
				res, err := rr.Allow(ctx, key, lim)
				if err != nil || res.Allowed == 0 {
					return false, err
				}
			}
			return true, nil
		}
	}
	impls := []impl{
		{"floodgate", 1, fg(one)}, {"redis_rate", 1, rrCall(1)},
		{"floodgate", 3, fg(three)}, {"redis_rate", 3, rrCall(3)},
	}

	ctx := context.Background()
	var results []result
	for _, conc := range concs {
		for _, im := range impls {
			// warm up: connections, scripts loaded
			for i := range 200 {
				im.call(ctx, keys[i%len(keys)])
			}
			r, err := measure(ctx, rdb, im, conc, duration, keys)
			if err != nil {
				return err
			}
			results = append(results, r)
			fmt.Fprintf(os.Stderr, "%-10s rules=%d conc=%-3d %9.0f/s p50=%-9s p99=%-9s evals/decision=%.2f round trips/decision=%.3f errors=%d\n",
				r.impl, r.rules, r.conc, r.perSec, r.p50, r.p99, r.evalsPerDecision, r.roundTripsPerDecis, r.errs)
		}
	}

	ceiling, err := rawCeiling(ctx, addr, store)
	if err != nil {
		return err
	}
	report(os.Stdout, addr, duration, nkeys, results, ceiling)
	return nil
}

func measure(ctx context.Context, rdb *redis.Client, im impl, conc int, d time.Duration, keys []string) (result, error) {
	if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
		return result{}, err
	}
	before, err := info(ctx, rdb)
	if err != nil {
		return result{}, err
	}
	lat := make([][]time.Duration, conc)
	errs := make([]int, conc)
	var wg sync.WaitGroup
	deadline := time.Now().Add(d)
	start := time.Now()
	for g := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 7))
			samples := make([]time.Duration, 0, 1<<14)
			for time.Now().Before(deadline) {
				key := keys[r.IntN(len(keys))]
				t0 := time.Now()
				_, err := im.call(ctx, key)
				samples = append(samples, time.Since(t0))
				if err != nil {
					errs[g]++
				}
			}
			lat[g] = samples
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	after, err := info(ctx, rdb)
	if err != nil {
		return result{}, err
	}
	var all []time.Duration
	res := result{impl: im.name, rules: im.rules, conc: conc}
	for g := range conc {
		all = append(all, lat[g]...)
		res.errs += errs[g]
	}
	slices.Sort(all)
	res.n = len(all)
	if res.n == 0 {
		return res, fmt.Errorf("%s: no decisions", im.name)
	}
	res.perSec = float64(res.n) / elapsed.Seconds()
	res.p50 = all[res.n/2]
	res.p99 = all[res.n*99/100]
	calls := func(m map[string]float64) float64 { return m["evalsha"] + m["eval"] + m["fcall"] }
	res.evalsPerDecision = (calls(after) - calls(before)) / float64(res.n)
	res.roundTripsPerDecis = (after["reads"] - before["reads"]) / float64(res.n)
	return res, nil
}

var statRe = regexp.MustCompile(`(?m)^cmdstat_(\w+):calls=(\d+)`)

// info reads the script calls (commandstats) and the server's read events
// (total_reads_processed: one per round trip from a client) so far.
func info(ctx context.Context, rdb *redis.Client) (map[string]float64, error) {
	out := map[string]float64{}
	s, err := rdb.Info(ctx, "commandstats", "stats").Result()
	if err != nil {
		return nil, err
	}
	for _, m := range statRe.FindAllStringSubmatch(s, -1) {
		v, _ := strconv.ParseFloat(m[2], 64)
		out[m[1]] = v
	}
	for _, line := range strings.Split(s, "\r\n") {
		if v, ok := strings.CutPrefix(line, "total_reads_processed:"); ok {
			out["reads"], _ = strconv.ParseFloat(v, 64)
		}
	}
	return out, nil
}

// rawCeiling runs redis-benchmark with Floodgate's own script call (random
// keys, one rule) at 50 clients and pipeline 16: the most decisions this
// Redis can make, with no client library in the way.
func rawCeiling(ctx context.Context, addr string, store *redisstore.Store) (float64, error) {
	p := floodgate.MustPolicy("one", floodgate.Rule{Name: "second", Algorithm: floodgate.GCRA, Limit: 1_000_000, Period: time.Second})
	call, err := store.Command(ctx, 0, floodgate.Op{Policy: p, Key: "user:__rand_int__", Kind: floodgate.OpAllow, Cost: 1})
	if err != nil {
		return 0, err
	}
	host, port, _ := net.SplitHostPort(addr)
	cmd := append([]string{"-h", host, "-p", port, "-c", "50", "-P", "16", "-n", "400000", "-r", "10000", "-q"}, call...)
	out, err := exec.CommandContext(ctx, "redis-benchmark", cmd...).CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("redis-benchmark: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`([\d.]+) requests per second`).FindStringSubmatch(string(out))
	if m == nil {
		return 0, fmt.Errorf("redis-benchmark printed no rate:\n%s", out)
	}
	fmt.Fprintf(os.Stderr, "raw ceiling (redis-benchmark -c 50 -P 16, Floodgate's own call): %s/s\n", m[1])
	return strconv.ParseFloat(m[1], 64)
}

func report(w *os.File, addr string, d time.Duration, nkeys int, rs []result, ceiling float64) {
	fmt.Fprintf(w, "Redis at %s, %s per measurement, %d keys, all requests admitted.\n\n", addr, d, nkeys)
	fmt.Fprintln(w, "| rules | callers | floodgate/s | p50 | p99 | redis_rate/s | p50 | p99 | ratio | fg script calls/decision | fg round trips/decision | rr script calls/decision |")
	fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
	for i := 0; i+1 < len(rs); i += 2 {
		f, r := rs[i], rs[i+1]
		fmt.Fprintf(w, "| %d | %d | %.0f | %s | %s | %.0f | %s | %s | %.2f× | %.2f | %.3f | %.2f |\n",
			f.rules, f.conc, f.perSec, round(f.p50), round(f.p99), r.perSec, round(r.p50), round(r.p99),
			f.perSec/r.perSec, f.evalsPerDecision, f.roundTripsPerDecis, r.evalsPerDecision)
	}
	fmt.Fprintf(w, "\nRaw ceiling: redis-benchmark, 50 clients, pipeline 16, Floodgate's own FCALL (one rule): %.0f decisions/s.\n", ceiling)
	for _, r := range rs {
		if r.impl == "floodgate" && r.rules == 1 && r.conc == 256 {
			fmt.Fprintf(w, "Floodgate at 256 callers, one rule: %.0f/s = %.0f%% of the raw ceiling.\n", r.perSec, 100*r.perSec/ceiling)
		}
	}
	for _, r := range rs {
		if r.errs > 0 {
			fmt.Fprintf(w, "\n%s rules=%d conc=%d: %d errors\n", r.impl, r.rules, r.conc, r.errs)
		}
	}
}

func round(d time.Duration) time.Duration {
	switch {
	case d > time.Millisecond:
		return d.Round(10 * time.Microsecond)
	default:
		return d.Round(time.Microsecond)
	}
}

// startRedis starts a redis-server on a free loopback port.

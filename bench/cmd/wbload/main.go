// Command wbload measures the write-back tier (floodgate.TierWriteBack) on
// one hot key: several nodes (stores, each with its own connections) on
// one local Redis, the key offered a multiple of its limit, for each sync
// interval and budget: Redis calls per decision and the overshoot per 1 s
// window (admitted beyond the limit), beside exact mode.
//
//	go run ./cmd/wbload                      # starts its own redis-server
//	go run ./cmd/wbload -nodes 4 -limit 1000 -rate 10000 -duration 10s
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/bench/internal/redisproc"
	"github.com/floodgate/floodgate/redisstore"
)

func main() {
	addr := flag.String("addr", "", "Redis address (default: start a redis-server on a free loopback port)")
	nodes := flag.Int("nodes", 4, "nodes (stores) deciding the key")
	limit := flag.Int64("limit", 1000, "the key's limit, requests a second (fixed window)")
	rate := flag.Int("rate", 10000, "requests a second offered, over all nodes")
	duration := flag.Duration("duration", 10*time.Second, "length of each run")
	intervals := flag.String("intervals", "10ms,50ms", "sync intervals")
	budgets := flag.String("budgets", "0.01,0.05", "budgets (fractions of the limit)")
	flag.Parse()
	if *addr == "" {
		a, stop, err := redisproc.Start()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		defer stop()
		*addr = a
	}
	fmt.Printf("%d nodes, one key limited to %d/s (fixed window of 1 s), %d requests/s offered, %s a run\n\n", *nodes, *limit, *rate, *duration)
	fmt.Println("| tier | sync interval | budget | decisions | Redis calls | calls/decision | windows | overshoot mean | overshoot max | metric | failure mode |")
	fmt.Println("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
	r := run{addr: *addr, nodes: *nodes, limit: *limit, rate: *rate, d: *duration}
	r.one("exact", 10*time.Millisecond, 0)
	for _, iv := range strings.Split(*intervals, ",") {
		interval, err := time.ParseDuration(iv)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		for _, b := range strings.Split(*budgets, ",") {
			budget, err := strconv.ParseFloat(b, 64)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(2)
			}
			r.one("write_back", interval, budget)
		}
	}
}

type run struct {
	addr        string
	nodes, rate int
	limit       int64
	d           time.Duration
	seq         int
}

func (r *run) one(tier string, interval time.Duration, budget float64) {
	r.seq++
	// closed: a call that times out on a starved host refuses rather than
	// admits, so the overshoot is write-back's own (Degraded counts them)
	rule := floodgate.Rule{Name: "hot", Algorithm: floodgate.FixedWindow, Limit: r.limit, Period: time.Second, OnStoreFailure: floodgate.FailClosed}
	if budget > 0 {
		rule.Tier, rule.Budget = floodgate.TierWriteBack, budget
	}
	pol, err := floodgate.NewPolicy("wbload", rule)
	check(err)
	ss := r.start(pol, interval, budget > 0)
	ctx := context.Background()
	var mu sync.Mutex
	admitted := map[int64]int64{}
	var decisions int64
	before := make([]redisstore.Stats, len(ss))
	for i, s := range ss {
		before[i] = s.Stats()
	}
	start := time.Now().Truncate(time.Second).Add(time.Second)
	time.Sleep(time.Until(start))
	end := start.Add(r.d)
	const workers = 16
	gap := time.Duration(workers*r.nodes) * time.Second / time.Duration(r.rate)
	var wg sync.WaitGroup
	op := pol.Op(floodgate.OpAllow, "hot", 1, 0)
	for _, s := range ss {
		for range workers {
			wg.Go(func() {
				for next := time.Now(); time.Now().Before(end); next = next.Add(gap) {
					time.Sleep(time.Until(next))
					now := time.Now().UnixMicro()
					if now >= end.UnixMicro() {
						break
					}
					d, err := s.Do(ctx, now, op)
					check(err)
					mu.Lock()
					decisions++
					if d.Allowed {
						admitted[now/1_000_000]++
					}
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	var calls, syncs, degraded int64
	for i, s := range ss {
		st := s.Stats()
		degraded += st.Degraded - before[i].Degraded
		calls += st.Calls - before[i].Calls + st.WriteBackSyncs - before[i].WriteBackSyncs
		syncs += st.WriteBackSyncs - before[i].WriteBackSyncs
	}
	for _, s := range ss {
		s.Close() // flushes
	}
	var over int64
	for _, s := range ss {
		for _, e := range s.TierErrors() {
			over += e.Overshoot
		}
	}
	var ws []int64
	for w := range admitted {
		ws = append(ws, w)
	}
	slices.Sort(ws)
	var sum, most int64
	for _, w := range ws {
		o := max(0, admitted[w]-r.limit)
		sum += o
		most = max(most, o)
	}
	n := int64(len(ws))
	pct := func(x float64) string { return fmt.Sprintf("%+.2f%%", 100*x/float64(r.limit)) }
	b := "-"
	if budget > 0 {
		b = fmt.Sprintf("%g%%", budget*100)
	}
	fmt.Printf("| %s | %s | %s | %d | %d (%d syncs) | %.4f | %d | %s | %s | %d | %d |\n", tier, interval, b, decisions, calls, syncs,
		float64(calls)/float64(decisions), n, pct(float64(sum)/float64(max(n, 1))), pct(float64(most)), over, degraded)
}

// start returns the run's nodes, each with a first decision made, once
// every one counts them all (with write-back).
func (r *run) start(pol *floodgate.Policy, interval time.Duration, wb bool) []*redisstore.Store {
	prefix := fmt.Sprintf("wbload%d", r.seq)
	ss := make([]*redisstore.Store, r.nodes)
	var err error
	for i := range ss {
		ss[i], err = redisstore.New("redis://"+r.addr, redisstore.Options{Prefix: prefix, ClientTime: true, WriteBackInterval: interval,
			MaxTimeout: time.Second})
		check(err)
		_, err = ss[i].Do(context.Background(), time.Now().UnixMicro(), pol.Op(floodgate.OpAllow, "warm", 1, 0))
		check(err)
	}
	for deadline := time.Now().Add(10 * time.Second); wb && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		all := true
		for _, s := range ss {
			all = all && s.Stats().WriteBackNodes == int64(r.nodes)
		}
		if all {
			break
		}
	}
	return ss
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

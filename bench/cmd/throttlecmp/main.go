// Command throttlecmp runs the server throttler's overload workload
// (issue 21; package throttle's TestOverload) against Floodgate's
// throttle and its peers in the same run: go-zero's adaptive shedder,
// kratos BBR, go-concurrency-limits and sentinel-golang's system
// adaptive rule.
//
// Each run starts a server process (this binary, -serve PEER): a real
// HTTP server on loopback whose GET /cheap burns 10 units of CPU (about
// 1 ms each) and GET /dear 50, behind the peer. This process is the
// client: it measures the server's capacity as work per server
// CPU-second (closed loop, 8 clients, the peer bypassed), then offers
// open-loop load at 3× that, re-derived every 100 ms from the CPU the
// server got over the last second (the host is shared), 20 % CRITICAL
// and 80 % SHEDDABLE, 20 % dear, for -load (the first second not
// counted). Rounds run the peers interleaved, in turn.
//
// Goodput is the work done in the measured window (the server counts
// each request's units after the window's start, GET /mark) and
// answered 200, per server CPU-second, as % of capacity; the former
// measure, the work of the 200s answered in the window whenever done,
// is printed beside it ("by answer"). One request in eight is metered
// (meter.go): its CPU from the handler's entry to its return, on a
// locked thread, by outcome; that gives the CPU per refused request and
// the CPU spent on refused requests.
//
//	go run ./cmd/throttlecmp -rounds 3
package main

import (
	"flag"
	"fmt"
	"log"
	"math"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/zeromicro/go-zero/core/logx"
)

func main() {
	servePeer := flag.String("serve", "", "run the server behind this peer (internal)")
	rounds := flag.Int("rounds", 3, "rounds; each runs every peer once")
	only := flag.String("peers", strings.Join(peers, ","), "peers to run, comma-separated")
	loadFor := flag.Duration("load", 6*time.Second, "overload phase, the first second not counted")
	perUnit := flag.Int("per-unit", 0, "xorshift rounds per unit of work (calibrated if 0)")
	cpuProfile := flag.String("cpuprofile", "", "write the server's CPU profile here (internal)")
	flag.StringVar(&recordTo, "perf-record", "", "record each counted phase's instructions with perf record into this directory (perf.go), instead of counting them")
	flag.StringVar(&profileDir, "profile", "", "write each server's CPU profile into this directory (PEER-ROUND.pprof)")
	flag.Parse()
	logx.Disable() // go-zero's logger, started by its packages' init in every process
	if *servePeer != "" {
		if err := serve(*servePeer, *perUnit, *cpuProfile); err != nil {
			log.Fatal(err)
		}
		return
	}
	list := strings.Split(*only, ",")
	unitRounds = *perUnit
	if unitRounds == 0 {
		unitRounds = calibrate()
	}
	fmt.Printf("a unit is %d xorshift rounds (about 1 ms of one core, calibrated once for every server)\n", unitRounds)
	all := map[string][]result{}
	for r := range *rounds {
		for _, p := range list {
			res, err := runOne(p, r+1, *loadFor)
			if err != nil {
				log.Fatalf("round %d, %s: %v", r+1, p, err)
			}
			fmt.Printf("round %d %-22s %s\n", r+1, p, res)
			all[p] = append(all[p], res)
		}
	}
	summarize(list, all)
}

// summarize prints each peer's medians over the rounds, and Floodgate's
// ratio to each.
func summarize(list []string, all map[string][]result) {
	med := func(p string, f func(result) float64) float64 {
		if len(all[p]) == 0 {
			return math.NaN()
		}
		var v []float64
		for _, r := range all[p] {
			v = append(v, f(r))
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	goodput := func(r result) float64 { return r.goodput }
	byAnswer := func(r result) float64 { return r.goodputByAnswer }
	crit := func(r result) float64 { return r.critSuccess }
	byInstr := func(r result) float64 { return r.goodputInstr }
	p99 := func(r result) float64 { return float64(r.p99) / 1e6 }
	shedCPU := func(r result) float64 { return r.shedCPU }
	shedShare := func(r result) float64 { return r.shedShare }
	unanswered := func(r result) float64 { return r.unanswered }
	answered := func(r result) float64 { return r.answeredCPU }
	fmt.Printf("\nmedians over %d rounds\n", len(all[list[0]]))
	fmt.Printf("| peer | goodput (%% of capacity) | goodput by answer time (%%) | CPU in answered work (%%) | CRITICAL success | p99 admitted (ms) | CPU per refused request (µs) | CPU on refused requests (%% of server CPU) | work unanswered (%%) | floodgate goodput ÷ peer | floodgate CRITICAL ÷ peer |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, p := range list {
		fmt.Printf("| %s | %.1f | %.1f | %.1f | %.2f %% | %.0f | %.0f | %.2f | %.1f | %.3f | %.3f |\n", p, med(p, goodput), med(p, byAnswer), med(p, answered), med(p, crit), med(p, p99),
			med(p, shedCPU), med(p, shedShare), med(p, unanswered), med("floodgate", goodput)/med(p, goodput), med("floodgate", crit)/med(p, crit))
	}
	perRound := func(what string, f func(result) float64) {
		fmt.Printf("\nper round, floodgate %s ÷ peer (the same round)\n", what)
		for _, p := range list {
			fmt.Printf("%-22s", p)
			for i := range all[p] {
				if i < len(all["floodgate"]) {
					fmt.Printf(" %.3f", f(all["floodgate"][i])/f(all[p][i]))
				}
			}
			fmt.Println()
		}
	}
	perRound("goodput", goodput)
	if med("floodgate", byInstr) > 0 {
		fmt.Printf("\ngoodput by instructions (%% of capacity; perf.go), medians over the rounds\n| peer | goodput by instructions (%%) | min | max | floodgate ÷ peer |\n|---|---|---|---|---|\n")
		for _, p := range list {
			lo, hi := math.Inf(1), math.Inf(-1)
			for _, r := range all[p] {
				lo, hi = min(lo, r.goodputInstr), max(hi, r.goodputInstr)
			}
			fmt.Printf("| %s | %.2f | %.2f | %.2f | %.4f |\n", p, med(p, byInstr), lo, hi, med("floodgate", byInstr)/med(p, byInstr))
		}
		perRound("goodput by instructions", byInstr)
	}
	os.Stdout.Sync() //nolint:errcheck
}

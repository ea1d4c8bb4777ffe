// Command servicereport turns bench/service.sh's raw output (a "=== name
// flags" line, then floodgate bench's JSON, per run) into the markdown table
// of docs/BENCHMARKS.md, with the service's figures relative to the empty
// handler's (and its CPU relative to the stock empty handler's, grpc-go on
// its defaults, when the run has one), and, for the runs on Redis,
// redis-server's CPU per decision.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strings"
)

type result struct {
	Mode      string  `json:"mode"`
	RPS       float64 `json:"requests_per_s"`
	Rate      float64 `json:"rate"`
	OK        uint64  `json:"ok"`
	OverLimit uint64  `json:"over_limit"`
	Errors    uint64  `json:"errors"`
	Latency   struct {
		P50, P99, P999 float64
	} `json:"latency_us"`
	Open *struct {
		Late, Unsent uint64
	} `json:"open_loop"`
	ServerCPU *cpuResult `json:"server_cpu"`
	StoreCPU  *cpuResult `json:"store_cpu"` // redis-server's, for the runs on Redis
}

type cpuResult struct {
	US float64 `json:"us_per_decision"`
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: servicereport results/service.txt")
		os.Exit(2)
	}
	f, err := os.Open(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	type run struct {
		name, flags string
		r           result
	}
	var runs []run
	var cur *run
	var buf bytes.Buffer
	flush := func() {
		if cur != nil && buf.Len() > 0 {
			if err := json.Unmarshal(buf.Bytes(), &cur.r); err == nil {
				runs = append(runs, *cur)
			}
		}
		buf.Reset()
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, "=== "); ok {
			flush()
			name, flags, _ := strings.Cut(rest, " ")
			cur = &run{name: name, flags: flags}
			continue
		}
		buf.WriteString(line)
		buf.WriteByte('\n')
	}
	flush()
	base, stock := map[string]result{}, map[string]result{}
	for _, r := range runs {
		switch r.name {
		case "empty":
			base[r.r.Mode] = r.r
		case "empty-stock":
			stock[r.r.Mode] = r.r
		}
	}
	fmt.Println("| load | server | requests/s | vs empty | p50 | p99 | p999 | server CPU µs/decision | vs empty | vs stock empty | Redis CPU µs/decision | errors |")
	fmt.Println("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
	for _, r := range runs {
		b, k := base[r.r.Mode], stock[r.r.Mode]
		load := "closed, 64 callers"
		if r.r.Mode == "open" {
			load = fmt.Sprintf("open, %.0f/s", r.r.Rate)
		}
		cpu, cpuRatio, stockRatio := "–", "–", "–"
		if r.r.ServerCPU != nil {
			cpu = fmt.Sprintf("%.1f", r.r.ServerCPU.US)
			if b.ServerCPU != nil && b.ServerCPU.US > 0 {
				cpuRatio = fmt.Sprintf("%.2f×", r.r.ServerCPU.US/b.ServerCPU.US)
			}
			if k.ServerCPU != nil && k.ServerCPU.US > 0 {
				stockRatio = fmt.Sprintf("%.2f×", r.r.ServerCPU.US/k.ServerCPU.US)
			}
		}
		store := "–"
		if r.r.StoreCPU != nil {
			store = fmt.Sprintf("%.1f", r.r.StoreCPU.US)
		}
		ratio := "–"
		if b.RPS > 0 {
			ratio = fmt.Sprintf("%.0f%%", 100*r.r.RPS/b.RPS)
		}
		fmt.Printf("| %s | %s | %.0f | %s | %s | %s | %s | %s | %s | %s | %s | %d |\n", load, r.name, r.r.RPS, ratio,
			ms(r.r.Latency.P50), ms(r.r.Latency.P99), ms(r.r.Latency.P999), cpu, cpuRatio, stockRatio, store, r.r.Errors)
	}
}

func ms(us float64) string {
	if us >= 1000 {
		return fmt.Sprintf("%.2f ms", us/1000)
	}
	return fmt.Sprintf("%.0f µs", us)
}

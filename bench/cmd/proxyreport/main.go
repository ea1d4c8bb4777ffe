// Command proxyreport turns bench/proxy.sh's raw output into markdown
// tables: one per phase (pass: a limit nothing reaches, the proxies'
// overhead; deny: a low limit, the refusal path), one row per target with
// wrk's requests/s and latency percentiles, the ratio to nginx's requests/s
// in the same phase, the non-2xx count, and the limiter's CPU.
//
// The raw file is a sequence of blocks, each a header line
//
//	=== TARGET PHASE key=value ...
//
// followed by wrk --latency's output and an optional "limiter_cpu_s: S"
// line, or a header line alone with "skipped=REASON" for a target that did
// not run.
//
//	go run ./cmd/proxyreport results/proxy-2026-05-09.txt
package main

import (
	"bufio"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"
)

type run struct {
	target, phase string
	params        map[string]string
	rps           float64
	p50, p99      time.Duration
	requests      int64
	non2xx        int64
	sockErrs      int64
	cpuS          float64 // -1: not measured
	seconds       float64
	parsed        bool
}

var (
	reRPS     = regexp.MustCompile(`^Requests/sec:\s+([0-9.]+)`)
	rePct     = regexp.MustCompile(`^(50|99)%\s+([0-9.]+)(us|ms|s|m)$`)
	reReqs    = regexp.MustCompile(`^(\d+) requests in ([0-9.]+)(us|ms|s|m),`)
	reNon2xx  = regexp.MustCompile(`^Non-2xx or 3xx responses:\s+(\d+)`)
	reSockErr = regexp.MustCompile(`^Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)`)
	reCPU     = regexp.MustCompile(`^limiter_cpu_s:\s+([0-9.]+)`)
)

func dur(v, unit string) time.Duration {
	f, _ := strconv.ParseFloat(v, 64)
	switch unit {
	case "us":
		return time.Duration(f * float64(time.Microsecond))
	case "ms":
		return time.Duration(f * float64(time.Millisecond))
	case "s":
		return time.Duration(f * float64(time.Second))
	case "m":
		return time.Duration(f * float64(time.Minute))
	}
	return 0
}

func parse(path string) ([]*run, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var runs []*run
	var cur *run
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if rest, ok := strings.CutPrefix(line, "=== "); ok {
			fs := strings.Fields(rest)
			if len(fs) < 2 {
				cur = nil
				continue
			}
			cur = &run{target: fs[0], phase: fs[1], params: map[string]string{}, cpuS: -1}
			for _, kv := range fs[2:] {
				k, v, _ := strings.Cut(kv, "=")
				cur.params[k] = v
			}
			// skipped= takes the rest of the line: the reason has spaces.
			if i := strings.Index(rest, "skipped="); i >= 0 {
				cur.params["skipped"] = rest[i+len("skipped="):]
			}
			runs = append(runs, cur)
			continue
		}
		if cur == nil {
			continue
		}
		if m := reRPS.FindStringSubmatch(line); m != nil {
			cur.rps, _ = strconv.ParseFloat(m[1], 64)
			cur.parsed = true
		} else if m := rePct.FindStringSubmatch(line); m != nil {
			if m[1] == "50" {
				cur.p50 = dur(m[2], m[3])
			} else {
				cur.p99 = dur(m[2], m[3])
			}
		} else if m := reReqs.FindStringSubmatch(line); m != nil {
			cur.requests, _ = strconv.ParseInt(m[1], 10, 64)
			cur.seconds = dur(m[2], m[3]).Seconds()
		} else if m := reNon2xx.FindStringSubmatch(line); m != nil {
			cur.non2xx, _ = strconv.ParseInt(m[1], 10, 64)
		} else if m := reSockErr.FindStringSubmatch(line); m != nil {
			for _, s := range m[1:] {
				n, _ := strconv.ParseInt(s, 10, 64)
				cur.sockErrs += n
			}
		} else if m := reCPU.FindStringSubmatch(line); m != nil {
			cur.cpuS, _ = strconv.ParseFloat(m[1], 64)
		}
	}
	return runs, sc.Err()
}

func fmtDur(d time.Duration) string {
	switch {
	case d <= 0:
		return "–"
	case d < time.Millisecond:
		return fmt.Sprintf("%.0f µs", float64(d)/float64(time.Microsecond))
	case d < time.Second:
		return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%.2f s", d.Seconds())
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: proxyreport results/proxy-DATE.txt")
		os.Exit(2)
	}
	runs, err := parse(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "proxyreport:", err)
		os.Exit(1)
	}
	titles := map[string]string{
		"pass": "Overhead: a limit nothing reaches (every request goes to the upstream)",
		"deny": "Refusal path: a limit that refuses almost every request",
	}
	for _, phase := range []string{"pass", "deny"} {
		var rows []*run
		var nginx *run
		for _, r := range runs {
			if r.phase != phase {
				continue
			}
			rows = append(rows, r)
			if r.target == "nginx" && r.parsed {
				nginx = r
			}
		}
		if len(rows) == 0 {
			continue
		}
		title := titles[phase]
		for _, r := range rows {
			if rate := r.params["rate"]; rate != "" && rate != "-" {
				title += fmt.Sprintf(" (%s r/s per client address, burst %s)", rate, r.params["burst"])
				break
			}
		}
		fmt.Printf("### %s\n\n", title)
		fmt.Println("| target | req/s | p50 | p99 | ratio vs nginx | non-2xx | socket errors | limiter CPU (cores) | limiter CPU µs/request |")
		fmt.Println("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
		for _, r := range rows {
			if !r.parsed {
				why := r.params["skipped"]
				if why == "" {
					why = "no wrk output"
				}
				fmt.Printf("| %s | n/a (%s) | | | | | | | |\n", r.target, why)
				continue
			}
			ratio := "–"
			if nginx != nil && nginx.rps > 0 {
				ratio = fmt.Sprintf("%.2f×", r.rps/nginx.rps)
			}
			non2xx := fmt.Sprint(r.non2xx)
			if r.requests > 0 {
				non2xx = fmt.Sprintf("%d (%.1f%%)", r.non2xx, 100*float64(r.non2xx)/float64(r.requests))
			}
			cores, perReq := "–", "–"
			if r.cpuS >= 0 && r.seconds > 0 && r.requests > 0 {
				cores = fmt.Sprintf("%.2f", r.cpuS/r.seconds)
				perReq = fmt.Sprintf("%.1f", r.cpuS*1e6/float64(r.requests))
			}
			fmt.Printf("| %s | %.0f | %s | %s | %s | %s | %d | %s | %s |\n",
				r.target, r.rps, fmtDur(r.p50), fmtDur(r.p99), ratio, non2xx, r.sockErrs, cores, perReq)
		}
		fmt.Println()
	}
}

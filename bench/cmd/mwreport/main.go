// Command mwreport turns the go test -bench output of BenchmarkMiddleware
// (bench/middleware.sh's raw file, any number of rounds) into a markdown
// table: per case, GOMAXPROCS and implementation, the median ns/op, B/op
// and allocs/op over the rounds, each also as a ratio to Floodgate's median
// (above 1× costs more than Floodgate), and the best (lowest) ns/op of the
// rounds with its ratio to Floodgate's best: on a shared machine the best
// round is the one least disturbed by other work.
//
//	go run ./cmd/mwreport results/middleware-2026-11-22.txt
package main

import (
	"bufio"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
)

const base = "floodgate"

type key struct {
	impl, cas string
	procs     int
}

type samples struct{ ns, bytes, allocs []float64 }

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: mwreport raw.txt...")
		os.Exit(2)
	}
	data := map[key]*samples{}
	var impls, cases []string
	var procs []int
	for _, path := range os.Args[1:] {
		f, err := os.Open(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			k, s, ok := parse(sc.Text())
			if !ok {
				continue
			}
			d := data[k]
			if d == nil {
				d = &samples{}
				data[k] = d
			}
			d.ns = append(d.ns, s[0])
			d.bytes = append(d.bytes, s[1])
			d.allocs = append(d.allocs, s[2])
			if !slices.Contains(impls, k.impl) {
				impls = append(impls, k.impl)
			}
			if !slices.Contains(cases, k.cas) {
				cases = append(cases, k.cas)
			}
			if !slices.Contains(procs, k.procs) {
				procs = append(procs, k.procs)
			}
		}
		f.Close()
	}
	if len(data) == 0 {
		fmt.Fprintln(os.Stderr, "mwreport: no BenchmarkMiddleware lines with ns/op, B/op and allocs/op (run with -benchmem)")
		os.Exit(1)
	}
	// Floodgate first, the others in the order they ran.
	if i := slices.Index(impls, base); i > 0 {
		impls = slices.Insert(slices.Delete(impls, i, i+1), 0, base)
	}
	slices.Sort(procs)

	fmt.Println("| case | GOMAXPROCS | middleware | ns/op | vs floodgate | B/op | vs floodgate | allocs/op | vs floodgate | best ns/op | vs floodgate | worst ns/op | runs |")
	fmt.Println("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	for _, c := range cases {
		for _, p := range procs {
			b := data[key{base, c, p}]
			for _, impl := range impls {
				s := data[key{impl, c, p}]
				if s == nil {
					continue
				}
				ns, by, al := median(s.ns), median(s.bytes), median(s.allocs)
				var bns, bby, bal, bbest float64
				if b != nil {
					bns, bby, bal, bbest = median(b.ns), median(b.bytes), median(b.allocs), slices.Min(b.ns)
				}
				best := slices.Min(s.ns)
				name := impl
				if impl == base {
					name = "**" + impl + "**"
				}
				fmt.Printf("| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %d |\n",
					c, p, name, num(ns), ratio(ns, bns), num(by), ratio(by, bby), num(al), ratio(al, bal),
					num(best), ratio(best, bbest), num(slices.Max(s.ns)), len(s.ns))
			}
		}
	}
}

// parse reads one result line:
//
//	BenchmarkMiddleware/<impl>/<case>[-procs]  N  x ns/op  y B/op  z allocs/op
func parse(line string) (key, [3]float64, bool) {
	var k key
	var s [3]float64
	f := strings.Fields(line)
	if len(f) < 4 || !strings.HasPrefix(f[0], "BenchmarkMiddleware/") {
		return k, s, false
	}
	name := strings.TrimPrefix(f[0], "BenchmarkMiddleware/")
	k.procs = 1 // go test leaves out "-1"
	if i := strings.LastIndexByte(name, '-'); i >= 0 {
		if n, err := strconv.Atoi(name[i+1:]); err == nil {
			k.procs, name = n, name[:i]
		}
	}
	impl, cas, ok := strings.Cut(name, "/")
	if !ok {
		return k, s, false
	}
	k.impl, k.cas = impl, cas
	got := 0
	for i := 2; i+1 < len(f); i += 2 {
		v, err := strconv.ParseFloat(f[i], 64)
		if err != nil {
			continue
		}
		switch f[i+1] {
		case "ns/op":
			s[0] = v
		case "B/op":
			s[1] = v
		case "allocs/op":
			s[2] = v
		default:
			continue
		}
		got++
	}
	return k, s, got == 3
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

func num(x float64) string {
	switch {
	case x == math.Trunc(x) && x < 1e6:
		return strconv.FormatFloat(x, 'f', 0, 64)
	case x >= 100:
		return strconv.FormatFloat(x, 'f', 0, 64)
	default:
		return strconv.FormatFloat(x, 'f', 1, 64)
	}
}

func ratio(x, b float64) string {
	if b == 0 {
		if x == 0 {
			return "–"
		}
		return "∞"
	}
	return fmt.Sprintf("%.2f×", x/b)
}

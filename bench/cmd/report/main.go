// Command report turns the raw output of run.sh (go test -bench lines,
// several rounds appended to one file) into the Markdown tables of
// docs/BENCHMARKS.md: medians over rounds, ratios of each peer to Floodgate
// within the same run, per-round win counts, heap per key, and a check of
// the targets.
//
// Usage: go run ./cmd/report results/raw.txt > results/report.md
package main

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// samples[name][unit] lists the values in the order the rounds ran.
type samples map[string]map[string][]float64

// order lists the benchmark names in the order they first appear.
var order []string

var procSuffix = regexp.MustCompile(`-\d+$`)

func parse(r io.Reader) (samples, error) {
	s := samples{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		name := procSuffix.ReplaceAllString(f[0], "")
		if _, err := strconv.Atoi(f[1]); err != nil {
			continue
		}
		if s[name] == nil {
			order = append(order, name)
			s[name] = map[string][]float64{}
		}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				continue
			}
			s[name][f[i+1]] = append(s[name][f[i+1]], v)
		}
	}
	return s, sc.Err()
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	w := slices.Clone(v)
	slices.Sort(w)
	n := len(w)
	if n%2 == 1 {
		return w[n/2]
	}
	return (w[n/2-1] + w[n/2]) / 2
}

// spread is the largest deviation from the median, in percent.
func spread(v []float64) float64 {
	m := median(v)
	d := 0.0
	for _, x := range v {
		d = max(d, math.Abs(x-m))
	}
	return 100 * d / m
}

func (s samples) get(name, unit string) []float64 { return s[name][unit] }

func (s samples) has(name string) bool { return len(s.get(name, "ns/op")) > 0 }

func (s samples) best(name, unit string) float64 {
	v := s.get(name, unit)
	if len(v) == 0 {
		return math.NaN()
	}
	return slices.Min(v)
}

// hasPrefix reports whether any benchmark name starts with prefix.
func (s samples) hasPrefix(prefix string) bool {
	for name := range s {
		if strings.HasPrefix(name, prefix) {
			return true
		}
	}
	return false
}

func (s samples) med(name, unit string) float64 { return median(s.get(name, unit)) }

// wins counts the rounds in which a took less ns/op than b (paired by
// round: the i-th sample of each).
func (s samples) wins(a, b string) (int, int) {
	x, y := s.get(a, "ns/op"), s.get(b, "ns/op")
	n := min(len(x), len(y))
	w := 0
	for i := range n {
		if x[i] < y[i] {
			w++
		}
	}
	return w, n
}

func ns(s samples, name string) string {
	v := s.get(name, "ns/op")
	if len(v) == 0 {
		return "—"
	}
	return fmt.Sprintf("%.1f ±%.0f%%", median(v), spread(v))
}

func allocs(s samples, name string) string {
	v := s.get(name, "allocs/op")
	if len(v) == 0 {
		return "—"
	}
	return fmt.Sprintf("%.0f", median(v))
}

var (
	fgKeyed  = []string{"fg_token_bucket", "fg_gcra", "fg_fixed_window", "fg_sliding_window"}
	peers    = []string{"go-limiter", "ulule"}
	limitsV  = []string{"admit", "deny"}
	modes    = []string{"serial", "parallel"}
	works    = []string{"hot", "uniform", "parallel"}
	fgSingle = []string{"fg_token_bucket", "fg_gcra"}
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: report RAW.txt")
		os.Exit(2)
	}
	f, err := os.Open(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	s, err := parse(f)
	f.Close()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	w := bufio.NewWriter(os.Stdout)
	defer w.Flush()
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }

	rounds := 0
	for _, name := range order {
		rounds = max(rounds, len(s.get(name, "ns/op")))
	}
	p("Medians over %d rounds; ±N%% is the largest deviation of a round from the median. Ratios are peer ns/op ÷ Floodgate ns/op (medians, same run): above 1 Floodgate is faster; \"best\" is the same ratio of the fastest round of each. \"wins\" counts the rounds in which Floodgate was faster, paired round by round.\n\n", rounds)

	// 1. Single key.
	if s.hasPrefix("BenchmarkSingleKey/") {
		singleKey(p, s)
	}
	keyed(p, s)
	if s.hasPrefix("BenchmarkHeapPerKey/") {
		heap(p, s)
	}
	targets(p, s)
}

type printer func(format string, a ...any)

func singleKey(p printer, s samples) {
	p("### Single key: Allow on one existing key\n\n")
	p("| limits | mode | fg_token_bucket ns/op | fg_gcra ns/op | x/time/rate ns/op | rate ÷ token_bucket | rate ÷ gcra | allocs/op (tb, gcra, rate) |\n")
	p("|---|---|---:|---:|---:|---:|---:|---|\n")
	for _, lim := range limitsV {
		for _, m := range modes {
			base := "BenchmarkSingleKey/limits=" + lim + "/mode=" + m + "/impl="
			tb, gc, rt := base+"fg_token_bucket", base+"fg_gcra", base+"x-time-rate"
			if !s.has(tb) {
				continue
			}
			w1, n1 := s.wins(tb, rt)
			w2, n2 := s.wins(gc, rt)
			p("| %s | %s | %s | %s | %s | %.2f× (wins %d/%d) | %.2f× (wins %d/%d) | %s, %s, %s |\n", lim, m,
				ns(s, tb), ns(s, gc), ns(s, rt),
				s.med(rt, "ns/op")/s.med(tb, "ns/op"), w1, n1,
				s.med(rt, "ns/op")/s.med(gc, "ns/op"), w2, n2,
				allocs(s, tb), allocs(s, gc), allocs(s, rt))
		}
	}
	p("\n")
}

func keyed(p printer, s samples) {
	all := append(slices.Clone(fgKeyed), peers...)
	for _, lim := range limitsV {
		if !s.hasPrefix("BenchmarkKeyed/limits=" + lim + "/") {
			continue
		}
		p("### Keyed workloads, limits=%s: ns/op (allocs/op)\n\n", lim)
		p("| workload |")
		for _, impl := range all {
			p(" %s |", impl)
		}
		p("\n|---|")
		for range all {
			p("---:|")
		}
		p("\n")
		for _, wl := range works {
			if !s.has("BenchmarkKeyed/limits=" + lim + "/impl=go-limiter/workload=" + wl) {
				continue
			}
			p("| %s |", wl)
			for _, impl := range all {
				n := "BenchmarkKeyed/limits=" + lim + "/impl=" + impl + "/workload=" + wl
				p(" %s (%s) |", ns(s, n), allocs(s, n))
			}
			p("\n")
		}
		p("\n")
		p("Ratios, limits=%s (peer ÷ Floodgate, medians; best rounds; wins = rounds Floodgate was faster):\n\n", lim)
		p("| workload | floodgate |")
		for _, pe := range peers {
			p(" %s ÷ fg |", pe)
		}
		p("\n|---|---|")
		for range peers {
			p("---:|")
		}
		p("\n")
		for _, wl := range works {
			for _, fg := range fgKeyed {
				a := "BenchmarkKeyed/limits=" + lim + "/impl=" + fg + "/workload=" + wl
				if !s.has(a) {
					continue
				}
				p("| %s | %s |", wl, fg)
				for _, pe := range peers {
					b := "BenchmarkKeyed/limits=" + lim + "/impl=" + pe + "/workload=" + wl
					wn, n := s.wins(a, b)
					p(" %.2f× (best %.2f×; wins %d/%d) |", s.med(b, "ns/op")/s.med(a, "ns/op"), s.best(b, "ns/op")/s.best(a, "ns/op"), wn, n)
				}
				p("\n")
			}
		}
		p("\n")
	}
}

func heap(p printer, s samples) {
	p("### Heap per key at 1M keys\n\n")
	p("| implementation | B/key | ns/insert (first request of a new key) |\n|---|---:|---:|\n")
	var heapNames []string // Floodgate's algorithms first, then the peers
	for _, name := range order {
		if strings.HasPrefix(name, "BenchmarkHeapPerKey/impl=fg_") {
			heapNames = append(heapNames, name)
		}
	}
	for _, name := range order {
		if strings.HasPrefix(name, "BenchmarkHeapPerKey/") && !strings.HasPrefix(name, "BenchmarkHeapPerKey/impl=fg_") {
			heapNames = append(heapNames, name)
		}
	}
	for _, name := range heapNames {
		impl := strings.TrimPrefix(name, "BenchmarkHeapPerKey/impl=")
		p("| %s | %.1f | %.0f |\n", impl, s.med(name, "B/key"), s.med(name, "ns/insert"))
	}
	p("\n")
}

func targets(p printer, s samples) {
	p("### Targets\n\n| target | measured | met |\n|---|---|---|\n")
	yes := func(ok bool) string {
		if ok {
			return "yes"
		}
		return "**no**"
	}
	for _, fg := range fgSingle {
		n := "BenchmarkSingleKey/limits=admit/mode=serial/impl=" + fg
		if !s.has(n) {
			continue
		}
		v, a := s.med(n, "ns/op"), s.med(n, "allocs/op")
		p("| %s Allow, existing key, serial, clock read included: ≤ 60 ns/op | %.1f ns/op (rounds: %s) | %s |\n", fg, v, list(s.get(n, "ns/op")), yes(v <= 60))
		p("| %s Allow, existing key: 0 allocs/op | %.0f allocs/op | %s |\n", fg, a, yes(a == 0))
	}
	for _, fg := range fgSingle {
		var lost []string
		cells := 0
		for _, lim := range limitsV {
			for _, wl := range works {
				a := "BenchmarkKeyed/limits=" + lim + "/impl=" + fg + "/workload=" + wl
				if !s.has(a) {
					continue
				}
				for _, pe := range peers {
					cells++
					b := "BenchmarkKeyed/limits=" + lim + "/impl=" + pe + "/workload=" + wl
					if !(s.med(a, "ns/op") < s.med(b, "ns/op")) {
						lost = append(lost, fmt.Sprintf("%s/%s vs %s (%.1f vs %.1f)", lim, wl, pe, s.med(a, "ns/op"), s.med(b, "ns/op")))
					}
				}
			}
		}
		if cells == 0 {
			continue
		}
		m := fmt.Sprintf("faster (median) on all %d workload × limits × peer cells", cells)
		if len(lost) > 0 {
			m = "slower or equal on: " + strings.Join(lost, "; ")
		}
		p("| %s faster than every peer on every keyed workload | %s | %s |\n", fg, m, yes(len(lost) == 0))
	}
	for _, alg := range []string{"token_bucket", "gcra", "fixed_window", "sliding_window"} {
		if len(s.get("BenchmarkHeapPerKey/impl=fg_"+alg, "B/key")) == 0 {
			continue
		}
		v := s.med("BenchmarkHeapPerKey/impl=fg_"+alg, "B/key")
		p("| %s ≤ 64 B/key at 1M keys | %.1f B/key | %s |\n", alg, v, yes(v <= 64))
	}
}

func list(v []float64) string {
	out := make([]string, len(v))
	for i, x := range v {
		out[i] = strconv.FormatFloat(x, 'f', 1, 64)
	}
	return strings.Join(out, ", ")
}

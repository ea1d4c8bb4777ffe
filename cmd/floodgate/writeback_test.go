package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/floodgate/floodgate/internal/redistest"
)

// wbLimit is the write-back tests' limit: requests a second on one key.
const wbLimit = 400

func wbRules(budget string) string { return wbRulesOf("fixed_window", budget) }

// wbRulesOf is wbRules with another algorithm.
func wbRulesOf(algorithm, budget string) string {
	return fmt.Sprintf(`domain: wb
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: %d, algorithm: %s, tier: write_back, budget: %s, failure_mode: closed}
`, wbLimit, algorithm, budget)
}

// wbNode starts one floodgate serve on Redis at addr with the rules in dir.
func wbNode(t *testing.T, dir, addr string) *server {
	t.Helper()
	// dial_timeout: the first connection's, which a starved host may take
	// more than the store timeout's 200 ms floor to make (serve exits)
	s := startServer(t, "--rules", dir, "--data", t.TempDir(), "--store", "redis://"+addr+"?dial_timeout=5s",
		"--store-timeout", "50ms", "--store-timeout-max", "100ms", "--write-back-interval", "10ms")
	t.Cleanup(func() { s.stop(t) })
	s.ask(t, "wb", desc("user", "warm")) // starts its heartbeats
	return s
}

// metricSum sums every series of a metric (all its label values) on the
// server's /metrics.
func metricSum(t *testing.T, addr, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var sum float64
	for _, line := range strings.Split(string(b), "\n") {
		rest, ok := strings.CutPrefix(line, name)
		if !ok || (rest[0] != ' ' && rest[0] != '{') {
			continue
		}
		f, err := strconv.ParseFloat(rest[strings.LastIndexByte(rest, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		sum += f
	}
	return sum
}

func waitWBNodes(t *testing.T, nodes []*server, n int) {
	t.Helper()
	redistest.WaitFor(t, 15*time.Second, fmt.Sprintf("every node counts %d", n), func() bool {
		for _, s := range nodes {
			if metricSum(t, s.http, "floodgate_store_writeback_nodes") != float64(n) {
				return false
			}
		}
		return true
	})
}

// wbLoad is what a run of traffic saw, by window (second since the epoch).
type wbLoad struct {
	mu        sync.Mutex
	admitted  map[int64]int64 // by the window they were sent in
	sent      map[int64]int64
	ambiguous int64 // answered after the window they were sent in ended
	// spans are the windows each of those was sent and answered in: it
	// was decided in one of them (check)
	spans [][2]int64
	// admissions of requests sent from `from` to `to`
	from, to time.Time
	during   int64
	rec      *record // if set, every answer too
}

// wbDrive sends requests for key "hot" to each node at perNode a second,
// from its goroutines, only in the middle of each second (from 50 ms to
// 950 ms), until end, so that most decisions fall within the second the
// request was sent in; it counts admissions by that second, and keeps
// apart the ones answered after it ended (a starved host's), which were
// decided in the one or the other.
func wbDrive(nodes []*server, perNode int, end time.Time, l *wbLoad) {
	var wg sync.WaitGroup
	for _, s := range nodes {
		wg.Go(func() { wbDriveNode(s, perNode, end, l) })
	}
	wg.Wait()
}

func wbDriveNode(s *server, perNode int, end time.Time, l *wbLoad) {
	const workers = 8
	gap := time.Duration(workers) * time.Second / time.Duration(perNode)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			ctx := context.Background()
			req := &rlsv3.RateLimitRequest{Domain: "wb", Descriptors: []*rlcommon.RateLimitDescriptor{desc("user", "hot")}}
			for next := time.Now(); time.Now().Before(end); next = next.Add(gap) {
				time.Sleep(time.Until(next))
				sent := time.Now()
				if ms := sent.UnixMilli() % 1000; ms < 50 || ms >= 950 {
					continue
				}
				resp, err := s.client.ShouldRateLimit(ctx, req)
				got := time.Now()
				if err != nil {
					return // the node stopped
				}
				w, w2 := sent.Unix(), got.Unix()
				if l.rec != nil {
					l.rec.add(answered{sent, got, resp.OverallCode == rlsv3.RateLimitResponse_OK})
				}
				l.mu.Lock()
				l.sent[w]++
				if resp.OverallCode == rlsv3.RateLimitResponse_OK {
					l.admitted[w]++
					if !sent.Before(l.from) && sent.Before(l.to) {
						l.during++
					}
					if w2 != w {
						l.spans = append(l.spans, [2]int64{w, w2})
						l.ambiguous++
					}
				}
				l.mu.Unlock()
			}
		})
	}
	wg.Wait()
}

func newWBLoad() *wbLoad {
	return &wbLoad{admitted: map[int64]int64{}, sent: map[int64]int64{}}
}

// check fails a window of l that admitted more than the budget allows:
// one whose own admissions (sent and answered in it) pass the most it
// may admit, or one that does with the admissions answered after their
// window ended (each decided in its sending window or a later one up to
// its answer's) placed as best they can be: each window, in order, takes
// the ones that must be decided in it, then, while it has room, those
// whose span ends soonest (earliest deadline first: if any placement
// keeps every window within the budget, this one does). Counting those in
// every window they span failed a starved host's runs that admitted no
// more than the budget.
func (l *wbLoad) check(t *testing.T, budget float64) {
	t.Helper()
	most := int64(wbLimit + budget*wbLimit)
	for _, v := range l.overBudget(most) {
		t.Errorf("second %d admitted at least %d of %d sent (%d answered in it, %d that could be decided in no other), more than %d (limit %d, budget %g)",
			v.w, v.n, l.sent[v.w], v.own, v.must, most, wbLimit, budget)
	}
}

// wbOver is a window that admitted more than it may (overBudget): at
// least n, own of them answered in it, must of them sent earlier and
// answered in it with no room left before.
type wbOver struct{ w, n, own, must int64 }

// overBudget returns the windows of l that admitted more than most, with
// the admissions answered after their sending window placed as check
// says.
func (l *wbLoad) overBudget(most int64) []wbOver {
	own := map[int64]int64{}
	for w, n := range l.admitted {
		own[w] += n
	}
	for _, sp := range l.spans {
		own[sp[0]]-- // counted by its sending window above
	}
	first, last := int64(math.MaxInt64), int64(math.MinInt64)
	for w := range own {
		first, last = min(first, w), max(last, w)
	}
	for _, sp := range l.spans {
		first, last = min(first, sp[0]), max(last, sp[1])
	}
	spans := slices.Clone(l.spans)
	slices.SortFunc(spans, func(a, b [2]int64) int { return cmp.Compare(a[0], b[0]) })
	var out []wbOver
	var open []int64 // the spans' last windows, of those not placed yet
	for w, next := first, 0; w <= last; w++ {
		for ; next < len(spans) && spans[next][0] == w; next++ {
			open = append(open, spans[next][1])
		}
		slices.Sort(open)
		took := min(max(most-own[w], 0), int64(len(open)))
		open = open[took:]
		must := int64(0)
		for must < int64(len(open)) && open[must] == w {
			must++
		}
		if n := own[w] + took + must; n > most {
			out = append(out, wbOver{w, n, own[w], must})
		}
		open = open[must:]
	}
	return out
}

func (l *wbLoad) String() string {
	var b strings.Builder
	for w := range l.sent {
		fmt.Fprintf(&b, "[%d: %d of %d] ", w%100, l.admitted[w], l.sent[w])
	}
	fmt.Fprintf(&b, "ambiguous %d", l.ambiguous)
	return b.String()
}

// Four floodgate serve processes on one Redis, one key at up to 10× its
// limit for two seconds: no second admits more than limit × (1 +
// budget), and the overshoot the nodes' /metrics report is what the
// seconds admitted beyond the limit.
func TestWriteBackFourNodes(t *testing.T) {
	for _, budget := range []float64{0.01, 0.05} {
		t.Run(fmt.Sprint(budget), func(t *testing.T) {
			srv := redistest.Standalone(t)
			dir := t.TempDir()
			writeRules(t, dir, "wb.yaml", wbRules(fmt.Sprintf("%g%%", budget*100)))
			nodes := make([]*server, 4)
			for i := range nodes {
				nodes[i] = wbNode(t, dir, srv.Addr)
			}
			waitWBNodes(t, nodes, 4)
			l := newWBLoad()
			start := time.Now().Truncate(time.Second).Add(time.Second)
			time.Sleep(time.Until(start))
			wbDrive(nodes, 10*wbLimit/4, start.Add(2*time.Second), l)
			t.Logf("budget %g: %s", budget, l)
			l.check(t, budget)
			var want float64
			for _, n := range l.admitted {
				want += float64(max(0, n-wbLimit))
			}
			var over, unmeasured, local, exact, syncs, errs float64
			measured := func() bool {
				over, unmeasured, local, exact, syncs, errs = 0, 0, 0, 0, 0, 0
				for _, s := range nodes {
					errs += metricSum(t, s.http, "floodgate_store_errors_total")
					over += metricSum(t, s.http, "floodgate_tier_overshoot_total")
					unmeasured += metricSum(t, s.http, "floodgate_tier_unmeasured_total")
					local += metricSum(t, s.http, "floodgate_store_writeback_local_total")
					exact += metricSum(t, s.http, "floodgate_store_calls_total")
					syncs += metricSum(t, s.http, "floodgate_store_writeback_syncs_total")
				}
				return over+unmeasured >= want
			}
			// the last hits reach Redis within a sync interval
			for deadline := time.Now().Add(5 * time.Second); !measured() && time.Now().Before(deadline); {
				time.Sleep(20 * time.Millisecond)
			}
			t.Logf("overshoot metric %g (unmeasured %g), admitted beyond the limit %g; decisions in memory %g, Redis calls %g + %g syncs, %g errors",
				over, unmeasured, want, local, exact, syncs, errs)
			// a sync that timed out after Redis ran it is sent again: its
			// hits count twice, or, applied once, go unmeasured (a starved
			// host's timeouts); hits that reach Redis after their window
			// is gone, or after a later sync, go unmeasured with no error
			// at all (CI saw overshoot 11 of 11 with 13 unmeasured and no
			// error). floodgate_tier_unmeasured_total says by how much the
			// overshoot may be larger: the two together never fall short,
			// and with nothing unmeasured and no error the overshoot is
			// exact.
			if l.ambiguous == 0 && (over+unmeasured < want || errs == 0 && unmeasured == 0 && over != want) {
				t.Errorf("overshoot metric %g (unmeasured %g), want %g", over, unmeasured, want)
			}
			if over > want+float64(l.ambiguous) && errs == 0 {
				t.Errorf("overshoot metric %g, more than admitted beyond the limit (%g, %d ambiguous)", over, want, l.ambiguous)
			}
		})
	}
}

// The node count goes 2 → 4 → 2 while one key takes 5× then 10× then 5×
// its limit (each node offering 2.5× the limit): no second admits more
// than the budget allows, the seconds in which nodes join and leave
// included.
func TestWriteBackNodesComeAndGo(t *testing.T) {
	const budget = 0.05
	srv := redistest.Standalone(t)
	dir := t.TempDir()
	writeRules(t, dir, "wb.yaml", wbRules("5%"))
	nodes := []*server{wbNode(t, dir, srv.Addr), wbNode(t, dir, srv.Addr)}
	waitWBNodes(t, nodes, 2)
	l := newWBLoad()
	start := time.Now().Truncate(time.Second).Add(time.Second)
	time.Sleep(time.Until(start))
	var wg sync.WaitGroup
	wg.Go(func() { wbDrive(nodes, 10*wbLimit/4, start.Add(5*time.Second), l) })
	time.Sleep(time.Until(start.Add(time.Second)))
	more := []*server{wbNode(t, dir, srv.Addr), wbNode(t, dir, srv.Addr)}
	wg.Go(func() { wbDrive(more, 10*wbLimit/4, start.Add(3500*time.Millisecond), l) })
	time.Sleep(time.Until(start.Add(3500 * time.Millisecond)))
	for _, s := range more {
		s.stop(t) // flushes its hits and leaves the count
	}
	wg.Wait()
	t.Logf("2 → 4 (from second 1) → 2 (from 3.5 s): %s", l)
	l.check(t, budget)
}

// Redis paused for 1.3 s and resumed, two nodes on a key at 1.5× its
// limit, paused while the key is far from its limit: each node admits from
// memory what is left of its hit threshold (5% of the limit over 2 nodes:
// 10), then the rule's failure mode (closed) refuses; in all, the pause
// admits at most the budget, and no second admits more than it allows.
func TestWriteBackRedisPaused(t *testing.T) {
	const budget = 0.05
	srv := redistest.Standalone(t)
	dir := t.TempDir()
	writeRules(t, dir, "wb.yaml", wbRules("5%"))
	nodes := []*server{wbNode(t, dir, srv.Addr), wbNode(t, dir, srv.Addr)}
	waitWBNodes(t, nodes, 2)
	l := newWBLoad()
	start := time.Now().Truncate(time.Second).Add(time.Second)
	time.Sleep(time.Until(start))
	var wg sync.WaitGroup
	// requests sent in the pause's last 200 ms may be decided by Redis
	// after it
	l.from, l.to = start.Add(1300*time.Millisecond), start.Add(2400*time.Millisecond)
	wg.Go(func() { wbDrive(nodes, 3*wbLimit/4, start.Add(4*time.Second), l) })
	time.Sleep(time.Until(start.Add(1300 * time.Millisecond)))
	srv.Pause()
	time.Sleep(time.Until(start.Add(2600 * time.Millisecond)))
	srv.Resume()
	wg.Wait()
	var degraded, unmeasured float64
	for _, s := range nodes {
		degraded += metricSum(t, s.http, "floodgate_store_degraded_decisions_total")
		unmeasured += metricSum(t, s.http, "floodgate_tier_unmeasured_total")
	}
	t.Logf("paused from 1.3 s to 2.6 s: %s; admitted while paused %d; decided by the failure mode %g, unmeasured %g", l, l.during, degraded, unmeasured)
	l.check(t, budget)
	if l.during > int64(budget*wbLimit) {
		t.Errorf("admitted %d while Redis was paused, more than the budget (%g of %d)", l.during, budget, wbLimit)
	}
	if degraded == 0 {
		t.Error("no decision went to the failure mode while Redis was paused")
	}
}

// TestWBLoadOverBudget: the write-back tests' per-second check (no
// servers). Admissions answered after their second are placed in one of
// the seconds they span, so a run that fits the budget passes however
// they straddle; one that cannot fit fails, in the second that must take
// the excess, and one second's own admissions past the budget always
// fail.
func TestWBLoadOverBudget(t *testing.T) {
	load := func(own map[int64]int64, spans ...[2]int64) *wbLoad {
		l := newWBLoad()
		for w, n := range own {
			l.admitted[w] += n
		}
		for _, sp := range spans {
			l.admitted[sp[0]]++
			l.spans = append(l.spans, sp)
		}
		return l
	}
	rep := func(n int, sp [2]int64) [][2]int64 { return slices.Repeat([][2]int64{sp}, n) }
	for _, c := range []struct {
		name string
		l    *wbLoad
		want string
	}{
		{"fits", load(map[int64]int64{1: 415, 2: 415}, rep(10, [2]int64{1, 2})...), "[]"},
		{"fits after", load(map[int64]int64{1: 420, 2: 410}, rep(10, [2]int64{1, 2})...), "[]"},
		{"one over", load(map[int64]int64{1: 415, 2: 416}, rep(10, [2]int64{1, 2})...), "[{2 421 416 1}]"},
		{"own over", load(map[int64]int64{1: 421, 2: 0}), "[{1 421 421 0}]"},
		{"spans three", load(map[int64]int64{1: 420, 2: 420, 3: 415}, rep(5, [2]int64{1, 3})...), "[]"},
		{"spans three, over", load(map[int64]int64{1: 420, 2: 420, 3: 416}, rep(5, [2]int64{1, 3})...), "[{3 421 416 1}]"},
		{"earliest deadline first", load(map[int64]int64{1: 418, 2: 419, 3: 418}, append(rep(2, [2]int64{1, 3}), rep(2, [2]int64{1, 2})...)...), "[]"},
	} {
		if got := fmt.Sprint(c.l.overBudget(420)); got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
	}
}

package main

import (
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/floodgate/floodgate/internal/redistest"
)

// Write-back on a sliding window counter (the cross-process write-back
// tests before it were fixed windows): four floodgate serve processes, one
// key at 10× its limit of 400 a second for three seconds. An exact
// sliding window counter admits a request only when its estimate, the
// current second's count plus the previous second's weighted by what is
// left of it (floor(previous × (1 s − elapsed) / 1 s)), stays within the
// limit; write-back may go beyond by at most the budget (each node's at
// most budget × limit / nodes unsynced hits). So at every admission a
// lower bound of that estimate, from what the test saw come back before
// the request was sent, must stay within limit × (1 + budget); and every
// second's own count too (the admissions surely decided in it).
func TestWriteBackSlidingWindowFourNodes(t *testing.T) {
	for _, budget := range []float64{0.01, 0.05} {
		t.Run(fmt.Sprint(budget), func(t *testing.T) {
			srv := redistest.Standalone(t)
			dir := t.TempDir()
			writeRules(t, dir, "wb.yaml", wbRulesOf("sliding_window", fmt.Sprintf("%g%%", budget*100)))
			nodes := startNodes(4, func() *server { return wbNode(t, dir, srv.Addr) })
			waitWBNodes(t, nodes, 4)
			l := newWBLoad()
			l.rec = &record{}
			start := time.Now().Truncate(time.Second).Add(time.Second)
			time.Sleep(time.Until(start))
			wbDrive(nodes, 10*wbLimit/4, start.Add(3*time.Second), l)
			t.Logf("budget %g: %s", budget, l)
			most := wbLimit + int(budget*wbLimit)
			for sec := start; sec.Before(start.Add(3 * time.Second)); sec = sec.Add(time.Second) {
				if n := l.rec.admitted(sec, sec.Add(time.Second)); n > most {
					t.Errorf("second %v admitted %d (decided in it for sure), more than %d", sec.Sub(start), n, most)
				}
			}
			worst, over := slidingEstimates(l.rec.all, time.Second, most)
			t.Logf("the highest estimate at an admission, from what had come back: %d (at most %d)", worst, most)
			if len(over) > 0 {
				t.Errorf("%d admissions with an estimate above limit × (1 + budget) = %d, the first %v", len(over), most, over[0])
			}
			var local, exact float64
			for _, s := range nodes {
				local += metricSum(t, s.http, "floodgate_store_writeback_local_total")
				exact += metricSum(t, s.http, "floodgate_store_writeback_exact_total")
			}
			t.Logf("decisions in memory %g, exact %g", local, exact)
			if local == 0 {
				t.Error("no decision made in memory: write-back never took the key")
			}
		})
	}
}

// slidingEstimates returns, for the admissions in all (windows of w), the
// highest lower bound of the sliding window counter's estimate when each
// was decided, and the admissions whose bound passed most. The bound for
// an admission A: 1 + the admissions of A's window that came back before A
// was sent (current) + floor(the admissions sent and answered in the
// window before × (w − elapsed when A came back) / w) (previous, weighted:
// A was decided no later than it came back). An admission whose round
// trip crosses a window's end is not checked.
func slidingEstimates(all []answered, w time.Duration, most int) (worst int, over []answered) {
	byWin := map[int64][]time.Time{} // each window's admissions' returns, sorted
	sure := map[int64]int64{}
	for _, a := range all {
		win := a.sent.UnixNano() / int64(w)
		if a.ok && a.got.UnixNano()/int64(w) == win {
			byWin[win] = append(byWin[win], a.got)
			sure[win]++
		}
	}
	for _, g := range byWin {
		sort.Slice(g, func(i, j int) bool { return g[i].Before(g[j]) })
	}
	for _, a := range all {
		win := a.sent.UnixNano() / int64(w)
		if !a.ok || a.got.UnixNano()/int64(w) != win {
			continue
		}
		g := byWin[win]
		cur := int64(sort.Search(len(g), func(i int) bool { return !g[i].Before(a.sent) })) + 1
		left := int64(w) - a.got.UnixNano()%int64(w)
		est := int(cur + sure[win-1]*left/int64(w))
		worst = max(worst, est)
		if est > most {
			over = append(over, a)
		}
	}
	return worst, over
}

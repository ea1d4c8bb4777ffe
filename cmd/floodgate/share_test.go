package main

import (
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/floodgate/floodgate/internal/redistest"
)

// Local share through several `floodgate serve` processes on one Redis
// (docs/REDIS.md "Local share").

func shareRules(window string, limit int, extra string) string {
	return fmt.Sprintf(`domain: share
descriptors:
  - key: hot
    rate_limit: {window: %s, requests_per_unit: %d, tier: local_share%s}
`, window, limit, extra)
}

// shareNodes starts n serve processes on srv with the rules in dir.
func shareNodes(t *testing.T, srv *redistest.Server, dir string, n int, extra ...string) []*server {
	t.Helper()
	var mu sync.Mutex
	var nodes []*server
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			args := append([]string{"--rules", dir, "--data", t.TempDir(), "--store", "redis://" + srv.Addr + "?dial_timeout=5s", "--store-timeout", "10s"}, extra...)
			s := startServer(t, args...)
			mu.Lock()
			nodes = append(nodes, s)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return nodes
}

// tally counts admitted requests per window of w, by when they were
// decided: a request sent and answered in one window was decided in it
// (sure); one whose round trip spans a window's end is counted apart
// (edge), in the window it was sent in.
type tally struct {
	mu                sync.Mutex
	w                 time.Duration
	sure, edge, asked map[int64]int
}

func newTally(w time.Duration) *tally {
	return &tally{w: w, sure: map[int64]int{}, edge: map[int64]int{}, asked: map[int64]int{}}
}

func (ta *tally) add(sent, got time.Time, ok bool) {
	a, b := sent.UnixNano()/int64(ta.w), got.UnixNano()/int64(ta.w)
	ta.mu.Lock()
	defer ta.mu.Unlock()
	ta.asked[a]++
	switch {
	case !ok:
	case a == b:
		ta.sure[a]++
	default:
		ta.edge[a]++
	}
}

// hammer asks nodes() for the hot key from workers goroutines per node,
// each at most one request every gap, until stop closes.
func hammer(t *testing.T, ta *tally, nodes func() []*server, workers int, gap time.Duration, stop chan struct{}) *sync.WaitGroup {
	var wg sync.WaitGroup
	for i := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(gap)
			defer tick.Stop()
			for k := 0; ; k++ {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				ns := nodes()
				s := ns[(i+k)%len(ns)]
				sent := time.Now()
				resp, err := s.client.ShouldRateLimit(t.Context(), rlRequest())
				if err != nil {
					continue // a node stopping
				}
				ta.add(sent, time.Now(), resp.OverallCode == rlsv3.RateLimitResponse_OK)
			}
		}()
	}
	return &wg
}

func rlRequest() *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: "share", Descriptors: []*rlcommon.RateLimitDescriptor{desc("hot", "k")}}
}

// check fails any window whose surely-decided admissions pass limit, and
// reports each full window's undershoot.
func (ta *tally) check(t *testing.T, limit int) {
	t.Helper()
	ta.mu.Lock()
	defer ta.mu.Unlock()
	for w, n := range ta.sure {
		if n > limit {
			t.Errorf("window %d: %d admitted, limit %d", w, n, limit)
		}
	}
	for w, asked := range ta.asked {
		t.Logf("window %d: asked %d, admitted %d (+%d decided across its end), undershoot %d", w, asked, ta.sure[w], ta.edge[w], limit-ta.sure[w]-ta.edge[w])
	}
}

// 4 nodes, one hot key at about 10× its limit for 3 windows of 1 s: no
// window admits more than the limit.
func TestShareFourNodesHotKey(t *testing.T) {
	srv := redistest.Standalone(t)
	dir := t.TempDir()
	writeRules(t, dir, "share.yaml", shareRules("1s", 100, ""))
	nodes := shareNodes(t, srv, dir, 4)
	ta := newTally(time.Second)
	stop := make(chan struct{})
	wg := hammer(t, ta, func() []*server { return nodes }, 16, 16*time.Millisecond, stop) // 1,000/s offered
	time.Sleep(2500 * time.Millisecond)
	close(stop)
	wg.Wait()
	ta.check(t, 100)
	var local, calls float64
	for _, s := range nodes {
		local += metricValue(t, s.http, "floodgate_store_share_local_total")
		calls += metricValue(t, s.http, "floodgate_store_calls_total")
	}
	// (the ratio is bench/share.sh's to measure: on a starved host fewer
	// requests come through, for about as many takes a window)
	if local <= calls {
		t.Errorf("%v decisions from slices, %v Redis calls: want most decisions made from slices", local, calls)
	}
	t.Logf("%v decisions from slices, %v Redis calls", local, calls)
}

// Nodes come and go, 2 → 4 → 2 (the two leaving give their slices back
// on SIGTERM): no window admits more than the limit.
func TestShareNodesComeAndGo(t *testing.T) {
	srv := redistest.Standalone(t)
	dir := t.TempDir()
	writeRules(t, dir, "share.yaml", shareRules("1s", 100, ""))
	var mu sync.Mutex
	nodes := shareNodes(t, srv, dir, 2)
	live := func() []*server { mu.Lock(); defer mu.Unlock(); return nodes }
	ta := newTally(time.Second)
	stop := make(chan struct{})
	wg := hammer(t, ta, live, 16, 16*time.Millisecond, stop)
	time.Sleep(time.Second)
	more := shareNodes(t, srv, dir, 2)
	mu.Lock()
	nodes = append(append([]*server(nil), nodes...), more...)
	mu.Unlock()
	time.Sleep(time.Second)
	mu.Lock()
	nodes = nodes[:2]
	mu.Unlock()
	for _, s := range more {
		s.stop(t)
	}
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()
	ta.check(t, 100)
}

// A node killed (SIGKILL) while it holds a slice strands at most the
// documented bound, ⌊limit / (2 × live nodes)⌋, and the quota comes back
// when the window (the slice's expiry) ends.
func TestShareKilledNodeStrandsAtMostItsSlice(t *testing.T) {
	srv := redistest.Standalone(t)
	dir := t.TempDir()
	// A window long enough for every step below on a starved host (a
	// request a few ms): the test needs each step inside one window.
	const limit, w = 400, 6 * time.Second
	writeRules(t, dir, "share.yaml", shareRules("6s", limit, ""))
	nodes := shareNodes(t, srv, dir, 2)
	a, b := nodes[0], nodes[1]
	clearOfWindowEnd(t, w, 5*time.Second)
	win := time.Now().UnixNano() / int64(w)
	admitted := 0
	for range 12 { // b is hot and has announced itself: a counts 2 nodes
		if b.ask(t, "share", desc("hot", "k")).OverallCode == rlsv3.RateLimitResponse_OK {
			admitted++
		}
	}
	for range 30 { // a is hot, holding a slice
		if a.ask(t, "share", desc("hot", "k")).OverallCode == rlsv3.RateLimitResponse_OK {
			admitted++
		}
	}
	a.cmd.Process.Signal(syscall.SIGKILL)
	<-a.done
	for b.ask(t, "share", desc("hot", "k")).OverallCode == rlsv3.RateLimitResponse_OK {
		admitted++
	}
	if now := time.Now().UnixNano() / int64(w); now != win {
		t.Fatalf("the window ended before b ran out: %d admitted (more than 5 s for 442 requests)", admitted)
	}
	stranded := limit - admitted
	bound := limit / (2 * 2)
	t.Logf("stranded %d of %d (bound %d)", stranded, limit, bound)
	if stranded < 0 || stranded > bound {
		t.Fatalf("stranded %d, want 0 to %d", stranded, bound)
	}
	// the next window has it all back
	time.Sleep(time.Until(time.Unix(0, (win+1)*int64(w))) + 10*time.Millisecond)
	next := 0
	for b.ask(t, "share", desc("hot", "k")).OverallCode == rlsv3.RateLimitResponse_OK {
		next++
	}
	if now := time.Now().UnixNano() / int64(w); now != win+1 {
		t.Fatalf("the window ended before b ran out: %d admitted (6 s for %d requests)", next, limit)
	}
	if next != limit {
		t.Fatalf("next window: %d admitted, want the whole limit %d back", next, limit)
	}
}

// Redis paused: the node spends what its slice holds, without Redis,
// until the slice expires with its window; then the rule's failure mode
// (closed here) decides.
func TestShareRedisPausedSpendsSliceThenFailureMode(t *testing.T) {
	srv := redistest.Standalone(t)
	dir := t.TempDir()
	const w = 2 * time.Second
	writeRules(t, dir, "share.yaml", shareRules("2s", 2000, ", failure_mode: closed"))
	s := shareNodes(t, srv, dir, 1, "--store-timeout", "100ms")[0]
	clearOfWindowEnd(t, w, 5*time.Second)
	win := time.Now().UnixNano() / int64(w)
	for range 40 { // hot, and its rate sizes a slice
		if s.ask(t, "share", desc("hot", "k")).OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatal("refused below the limit")
		}
	}
	srv.Pause()
	defer srv.Resume()
	during := 0
	var after int
	for time.Now().UnixNano()/int64(w) == win {
		sent := time.Now()
		ok := s.ask(t, "share", desc("hot", "k")).OverallCode == rlsv3.RateLimitResponse_OK
		if ok && time.Now().UnixNano()/int64(w) != win && sent.UnixNano()/int64(w) != win {
			t.Fatal("admitted after the slice's window ended, with Redis paused")
		}
		if ok {
			during++
		} else {
			break // the slice is spent: the failure mode (closed) refuses
		}
	}
	if during == 0 {
		t.Fatal("nothing admitted from the slice while Redis was paused")
	}
	time.Sleep(time.Until(time.Unix(0, (win+1)*int64(w))) + 10*time.Millisecond)
	for range 5 {
		if s.ask(t, "share", desc("hot", "k")).OverallCode == rlsv3.RateLimitResponse_OK {
			after++
		}
	}
	if after != 0 {
		t.Fatalf("%d admitted after the slice expired with Redis paused; failure_mode closed refuses", after)
	}
	t.Logf("admitted %d from the slice while Redis was paused", during)
}

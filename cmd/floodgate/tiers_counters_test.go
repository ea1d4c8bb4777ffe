package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/floodgate/floodgate/internal/recorder"
	"github.com/floodgate/floodgate/internal/redistest"
)

// The tiers' counters (issue 22's "store tiers" track, issue 19's local
// share and write-back): real traffic through two `floodgate serve` nodes
// on one Redis, and every counter checked against what that traffic must
// have produced. A third process, the observer, reads Redis's count of a
// key through its admin API (a peek: it consumes nothing and, deciding
// nothing, never joins the live nodes).
//
// Each decision a node makes is exactly one of: a call to Redis
// (floodgate_store_calls_total: exact decisions, write-back's exact ones,
// local share's takes), a refusal from the near cache, a decision from
// write-back's memory, or one from a local share's slice. With no Redis
// error (the store timeout is 10 s), the decisions a node was asked for
// are the sum of those counters, and the dashboard's tiers track shows the
// same counts, per second and in total.

// tierLimit is the counters tests' limit: requests an hour on one key.
const tierLimit = 600

// tierCounts are a node's tier counters, from its /metrics.
type tierCounts struct {
	calls, errs, degraded, near              float64
	wbLocal, wbExact, wbSyncs                float64
	shLocal, shTakes, shKeys, shBack, shLost float64
	over, under, unmeasured                  float64
}

func tierCountsOf(t *testing.T, s *server) tierCounts {
	t.Helper()
	m := func(name string) float64 { return metricSum(t, s.http, name) }
	return tierCounts{calls: m("floodgate_store_calls_total"), errs: m("floodgate_store_errors_total"),
		degraded: m("floodgate_store_degraded_decisions_total"), near: m("floodgate_store_near_cache_hits_total"),
		wbLocal: m("floodgate_store_writeback_local_total"), wbExact: m("floodgate_store_writeback_exact_total"),
		wbSyncs: m("floodgate_store_writeback_syncs_total"),
		shLocal: m("floodgate_store_share_local_total"), shTakes: m("floodgate_store_share_calls_total"),
		shKeys: m("floodgate_store_share_keys"), shBack: m("floodgate_store_share_returned_total"),
		shLost: m("floodgate_store_share_lost_total"),
		over:   m("floodgate_tier_overshoot_total"), under: m("floodgate_tier_undershoot_total"),
		unmeasured: m("floodgate_tier_unmeasured_total")}
}

// tierNodes starts n serve processes (and an observer) on srv with rules.
func tierNodes(t *testing.T, srv *redistest.Server, rules string, n int, extra ...string) (nodes []*server, obs *server) {
	t.Helper()
	dir := t.TempDir()
	writeRules(t, dir, "tiers.yaml", rules)
	start := func() *server {
		args := append([]string{"--rules", dir, "--data", t.TempDir(), "--store", "redis://" + srv.Addr + "?dial_timeout=5s",
			"--store-timeout", "10s"}, extra...)
		s := startServer(t, args...)
		t.Cleanup(func() { s.stop(t) })
		return s
	}
	all := startNodes(n+1, start)
	return all[:n], all[n]
}

// tierDrive sends perNode requests for key hot=value to each node, from
// workers goroutines per node at once, and returns what each node
// admitted.
func tierDrive(t *testing.T, domain, value string, nodes []*server, perNode, workers int) []int {
	t.Helper()
	admitted := make([]int, len(nodes))
	var mu sync.Mutex
	var firstErr error
	var wg sync.WaitGroup
	for i, s := range nodes {
		for w := range workers {
			wg.Go(func() {
				for k := w; k < perNode; k += workers {
					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					resp, err := s.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*rlcommon.RateLimitDescriptor{desc("hot", value)}})
					cancel()
					mu.Lock()
					if err != nil && firstErr == nil {
						firstErr = err
					}
					if err == nil && resp.OverallCode == rlsv3.RateLimitResponse_OK {
						admitted[i]++
					}
					mu.Unlock()
					if err != nil {
						return
					}
				}
			})
		}
	}
	wg.Wait()
	if firstErr != nil {
		t.Fatalf("ShouldRateLimit: %v", firstErr)
	}
	return admitted
}

// redisCount is Redis's count of hot=value in its fixed window of
// tierLimit, as the observer's admin API inspects it: the limit less what
// remains (so at most tierLimit).
func redisCount(t *testing.T, obs *server, domain, value string) int {
	t.Helper()
	resp, err := http.Post("http://"+obs.admin+"/v1/keys/inspect", "application/json",
		strings.NewReader(fmt.Sprintf(`{"domain":%q,"entries":[{"key":"hot","value":%q}]}`, domain, value)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st keyState
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil || resp.StatusCode != 200 {
		t.Fatalf("inspect %s hot=%s: %d %v", domain, value, resp.StatusCode, err)
	}
	if st.Degraded {
		t.Fatalf("inspect %s hot=%s: degraded", domain, value)
	}
	return tierLimit - int(st.Remaining)
}

// checkDecisions fails unless every decision node i was asked for (asked)
// is in exactly one of its counters.
func checkDecisions(t *testing.T, i int, c tierCounts, asked int) {
	t.Helper()
	if c.errs != 0 || c.degraded != 0 {
		t.Fatalf("node %d: %v Redis errors, %v degraded decisions: the counts below assume none", i, c.errs, c.degraded)
	}
	if got := c.calls + c.near + c.wbLocal + c.shLocal; got != float64(asked) {
		t.Errorf("node %d: %v Redis calls + %v near cache + %v write-back + %v local share = %v decisions, asked %d",
			i, c.calls, c.near, c.wbLocal, c.shLocal, got, asked)
	}
}

// checkTiersTrack waits for s's dashboard snapshot to show the counters c
// on its tiers track, in total and in its seconds.
func checkTiersTrack(t *testing.T, i int, s *server, c tierCounts) {
	t.Helper()
	want := []uint64{uint64(c.calls), uint64(c.near), uint64(c.wbLocal), uint64(c.shLocal)}
	var ts recorder.TrackSeries
	redistest.WaitFor(t, time.Minute, fmt.Sprintf("node %d's tiers track at %v", i, want), func() bool {
		var ok bool
		ts, ok = trackOf(snapshotOf(t, s.admin), tiersTrack)
		return ok && fmt.Sprint(ts.Total) == fmt.Sprint(want)
	})
	sums := trackSums(ts)
	for j, l := range tiersLabels {
		if sums[l] != want[j] {
			t.Errorf("node %d: tiers track's seconds add to %v, want %v (labels %v)", i, sums, want, tiersLabels)
			break
		}
	}
}

// TestTierCountersLocalShare: two nodes on a local_share rule of 600 an
// hour. First each is asked 150 times at once for one key (300: under the
// limit): slices are taken and spent, and what is left of them is given
// back once the key goes idle: the requests the nodes say they gave back
// (floodgate_store_share_returned_total) are what left Redis's count, none
// is lost inside the hour, and Redis then holds what the fleet admitted.
// Then each is asked 400 times for another key (800: past the limit, so
// slices run out and Redis's "nothing left" is answered from memory): at
// most the limit is admitted. Throughout, each node's decisions are its
// Redis calls plus those from its slice, and its dashboard track says so.
func TestTierCountersLocalShare(t *testing.T) {
	srv := redistest.Standalone(t)
	nodes, obs := tierNodes(t, srv, fmt.Sprintf(`domain: tiers
descriptors:
  - key: hot
    rate_limit: {unit: hour, requests_per_unit: %d, tier: local_share}
`, tierLimit), 2)
	clearOfWindowEnd(t, time.Hour, 5*time.Minute)
	slicesBack := func() bool {
		for _, s := range nodes {
			if metricSum(t, s.http, "floodgate_store_share_keys") != 0 {
				return false
			}
		}
		return true
	}
	// A node gives an idle key's slice back 250 ms after its last
	// decision. Redis's count with the slices in it is read right after
	// the traffic, and counts only if no node gave back anything meanwhile
	// (its counter unmoved, the key still held once Redis's count was
	// read: a node forgets the key before it gives its slice back); a
	// host so slow that a node's key went idle during the traffic, or
	// before the count was read, takes another key.
	asked := 0
	var value string
	var held, after int
	var back float64
	returned := func() float64 {
		var n float64
		for _, s := range nodes {
			n += metricSum(t, s.http, "floodgate_store_share_returned_total")
		}
		return n
	}
	for round := 0; ; round++ {
		value = fmt.Sprint("under", round)
		back0 := returned()
		admitted := tierDrive(t, "tiers", value, nodes, 150, 4)
		asked += 150
		if admitted[0]+admitted[1] != 300 {
			t.Fatalf("admitted %v of 150 each, under the limit %d", admitted, tierLimit)
		}
		back1 := returned()
		held = redisCount(t, obs, "tiers", value)
		still := true
		for _, s := range nodes {
			still = still && metricSum(t, s.http, "floodgate_store_share_keys") == 1
		}
		redistest.WaitFor(t, time.Minute, "every node's slice given back", slicesBack)
		// a node forgets the key, then gives its slice back: Redis's
		// count falls to what was admitted, and then the counters move
		redistest.WaitFor(t, time.Minute, "Redis's count back at the 300 admitted", func() bool { return redisCount(t, obs, "tiers", value) <= 300 })
		after = redisCount(t, obs, "tiers", value)
		if after != 300 {
			t.Fatalf("Redis counts %d once every slice is given back, the fleet admitted 300", after)
		}
		if still && back1 == back0 {
			redistest.WaitFor(t, time.Minute, fmt.Sprintf("the %d given back counted", held-after), func() bool { return returned()-back1 >= float64(held-after) })
			back = returned() - back1
			break
		}
		if round == 9 {
			t.Fatalf("10 rounds, and in each some node had given its slice back before Redis's count was read")
		}
		t.Logf("round %d: a node gave its slice back before Redis's count was read; another key", round)
	}
	for i, s := range nodes {
		if c := tierCountsOf(t, s); c.shLost != 0 {
			t.Errorf("node %d: %v requests of slices lost, inside the hour with Redis up", i, c.shLost)
		}
	}
	t.Logf("300 admitted; Redis counted %d with the slices, %d after; %v given back", held, after, back)
	if back != float64(held-after) {
		t.Errorf("the nodes gave back %v requests of their slices, Redis's count fell by %d (%d → %d)", back, held-after, held, after)
	}
	for i, s := range nodes {
		c := tierCountsOf(t, s)
		checkDecisions(t, i, c, asked)
		if c.shLocal == 0 || c.shTakes == 0 {
			t.Errorf("node %d: %v decisions from slices, %v calls of the share function: want both", i, c.shLocal, c.shTakes)
		}
	}

	admitted := tierDrive(t, "tiers", "over", nodes, 400, 4)
	asked += 400
	if total := admitted[0] + admitted[1]; total > tierLimit {
		t.Errorf("admitted %v of 400 each, more than the limit %d", admitted, tierLimit)
	}
	redistest.WaitFor(t, time.Minute, "every node's slice given back", slicesBack)
	for i, s := range nodes {
		c := tierCountsOf(t, s)
		checkDecisions(t, i, c, asked)
		if c.wbLocal != 0 || c.wbExact != 0 || c.wbSyncs != 0 {
			t.Errorf("node %d: write-back counters %v %v %v without a write-back rule", i, c.wbLocal, c.wbExact, c.wbSyncs)
		}
		checkTiersTrack(t, i, s, c)
	}
}

// TestTierCountersWriteBack: two nodes, a write_back rule of 600 an hour
// with a budget of 5% (each node admits at most 15 hits between syncs),
// one key asked 250 times by each node at once (500: under the limit),
// then another 400 times by each (800: past it). Each node's decisions
// are its Redis calls, near cache refusals and write-back's in-memory
// decisions, and its dashboard track says so; Redis's count is what the
// fleet admitted once the hits are flushed, and stays so after the nodes
// flush on SIGTERM (no hit sent twice, none lost); past the limit, the
// overshoot the nodes measured is what the fleet admitted beyond it.
func TestTierCountersWriteBack(t *testing.T) {
	srv := redistest.Standalone(t)
	nodes, obs := tierNodes(t, srv, fmt.Sprintf(`domain: tiers
descriptors:
  - key: hot
    rate_limit: {unit: hour, requests_per_unit: %d, tier: write_back, budget: 5%%}
`, tierLimit), 2, "--write-back-interval", "50ms") // hot from 40 decisions a second
	clearOfWindowEnd(t, time.Hour, 3*time.Minute)
	// under the limit
	admitted := tierDrive(t, "tiers", "under", nodes, 250, 4)
	if total := admitted[0] + admitted[1]; total != 500 {
		t.Fatalf("admitted %v of 250 each, under the limit %d", admitted, tierLimit)
	}
	redistest.WaitFor(t, time.Minute, "Redis's count at the 500 admitted", func() bool { return redisCount(t, obs, "tiers", "under") >= 500 })
	if n := redisCount(t, obs, "tiers", "under"); n != 500 {
		t.Errorf("Redis counts %d, the fleet admitted 500", n)
	}
	mid := make([]tierCounts, len(nodes))
	for i, s := range nodes {
		mid[i] = tierCountsOf(t, s)
		checkDecisions(t, i, mid[i], 250)
		if mid[i].wbLocal == 0 || mid[i].wbSyncs == 0 {
			t.Errorf("node %d: %v decisions in memory, %v syncs: want both", i, mid[i].wbLocal, mid[i].wbSyncs)
		}
		if mid[i].wbExact > mid[i].calls {
			t.Errorf("node %d: %v exact write-back decisions, more than its %v Redis calls", i, mid[i].wbExact, mid[i].calls)
		}
		if mid[i].over != 0 || mid[i].under != 0 || mid[i].unmeasured != 0 {
			t.Errorf("node %d under the limit: overshoot %v, undershoot %v, unmeasured %v; want 0", i, mid[i].over, mid[i].under, mid[i].unmeasured)
		}
	}

	// past the limit
	admitted = tierDrive(t, "tiers", "over", nodes, 400, 4)
	total := admitted[0] + admitted[1]
	if most := tierLimit + tierLimit*5/100; total > most || total < tierLimit {
		t.Errorf("admitted %v of 400 each: want from the limit %d to %d (5%% over)", admitted, tierLimit, most)
	}
	var over float64
	redistest.WaitFor(t, time.Minute, "the overshoot measured", func() bool {
		over = 0
		for _, s := range nodes {
			over += metricSum(t, s.http, "floodgate_tier_overshoot_total")
		}
		return over >= float64(total-tierLimit)
	})
	var local float64
	for i, s := range nodes {
		c := tierCountsOf(t, s)
		checkDecisions(t, i, c, 250+400)
		local += c.wbLocal - mid[i].wbLocal
		if c.shLocal != 0 || c.shTakes != 0 {
			t.Errorf("node %d: local share counters %v %v without a local_share rule", i, c.shLocal, c.shTakes)
		}
		if c.unmeasured != 0 {
			t.Errorf("node %d: %v hits unmeasured, with Redis answering every sync", i, c.unmeasured)
		}
		checkTiersTrack(t, i, s, c)
	}
	if over != float64(total-tierLimit) {
		t.Errorf("overshoot measured %v, the fleet admitted %d beyond the limit", over, total-tierLimit)
	}
	if local == 0 {
		t.Error("no decision past the limit made in memory")
	}
	for _, s := range nodes {
		s.stop(t) // each flushes what it holds
	}
	if n := redisCount(t, obs, "tiers", "under"); n != 500 {
		t.Errorf("after the nodes stopped, Redis counts %d of the key under the limit, the fleet admitted 500", n)
	}
}

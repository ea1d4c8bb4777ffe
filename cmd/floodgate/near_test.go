package main

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/floodgate/floodgate/internal/redistest"
)

// Four floodgate serve processes on one Redis, one hot key asked at ten
// times its limit of 20 a second for three fixed windows: with the near
// cache (the default) every window admits exactly the limit, as without
// it (exact mode), and far fewer decisions are asked of Redis. No refused
// key is admitted early: once a refusal has come back from any process,
// no request sent after it is admitted in that window (a fixed window
// refuses until its end: Redis's RetryAfter).
//
// Requests are sent only from 50 ms after a window starts to 50 ms before
// it ends (Redis's clock is this host's), and each admission is counted in
// the window its whole round trip lies in; one whose round trip crosses a
// boundary (a starved host) may belong to either window.
func TestNearCacheFleetAdmitsExactly(t *testing.T) {
	redistest.Require(t)
	const limit, windows = 20, 3
	for _, near := range []bool{true, false} {
		t.Run(fmt.Sprintf("near_cache=%v", near), func(t *testing.T) {
			srv := redistest.Standalone(t)
			dir := t.TempDir()
			writeRules(t, dir, "near.yaml", fmt.Sprintf("domain: near\ndescriptors:\n  - key: hot\n    rate_limit: {unit: second, requests_per_unit: %d}\n", limit))
			servers := make([]*server, 4)
			for i := range servers {
				servers[i] = startServer(t, "--rules", dir, "--data", t.TempDir(), "--store", "redis://"+srv.Addr,
					"--store-timeout", "10s", fmt.Sprintf("--store-near-cache=%v", near))
				servers[i].ask(t, "near", desc("hot", "warm")) // loads the library
			}
			calls0, hits0 := fleetMetric(t, servers, "floodgate_store_calls_total"), fleetMetric(t, servers, "floodgate_store_near_cache_hits_total")
			spans, decisions, all := hotKeyLoad(t, servers, windows)
			definite, maybe := perWindow(spans, windows)
			if early := admittedAfterRefusal(all, time.Second); len(early) > 0 {
				t.Errorf("%d admissions sent after a refusal in their window had come back, and answered in it: %v", len(early), early)
			}
			for w := range windows {
				if definite[w] > limit || definite[w]+maybe[w] < limit {
					t.Errorf("window %d admitted %d (and %d that may belong to it), want exactly %d", w, definite[w], maybe[w], limit)
				}
			}
			calls := fleetMetric(t, servers, "floodgate_store_calls_total") - calls0
			hits := fleetMetric(t, servers, "floodgate_store_near_cache_hits_total") - hits0
			t.Logf("near cache %v: %d decisions, %.0f asked of Redis (%.3f a decision), %.0f answered by the near cache; admitted per window %v (+%v across a boundary)",
				near, decisions, calls, calls/float64(decisions), hits, definite, maybe)
			switch {
			case near && (hits == 0 || calls > float64(decisions)/2):
				t.Errorf("with the near cache, %.0f of %d decisions were asked of Redis (%.0f answered by it), want under half", calls, decisions, hits)
			case !near && (hits != 0 || calls != float64(decisions)):
				t.Errorf("without the near cache, %.0f of %d decisions were asked of Redis and %.0f answered by it, want all and none", calls, decisions, hits)
			}
		})
	}
}

// hotKeyLoad asks servers for one key, 200 times a second (8 workers at 25
// a second each), for windows whole seconds from the next one, sending
// only from 50 ms into each second to 50 ms before its end. It returns
// each admission's round trip as the windows (from the first) it was sent
// and answered in, and how many decisions were asked.
func hotKeyLoad(t *testing.T, servers []*server, windows int) (spans [][2]int, decisions int, all []answered) {
	w0 := time.Now().Truncate(time.Second).Add(time.Second)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range 8 {
		s := servers[i%len(servers)]
		wg.Go(func() {
			for next := w0.Add(50*time.Millisecond + time.Duration(i)*5*time.Millisecond); next.Before(w0.Add(time.Duration(windows) * time.Second)); next = next.Add(40 * time.Millisecond) {
				if into := next.Sub(w0) % time.Second; into < 50*time.Millisecond || into >= 950*time.Millisecond {
					continue
				}
				time.Sleep(time.Until(next))
				sent := time.Now()
				ok, err := askHot(s)
				got := time.Now()
				if err != nil {
					t.Errorf("ShouldRateLimit: %v", err)
					return
				}
				mu.Lock()
				all = append(all, answered{sent, got, ok})
				decisions++
				if ok {
					spans = append(spans, [2]int{int(sent.Sub(w0) / time.Second), int(got.Sub(w0) / time.Second)})
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return spans, decisions, all
}

// admittedAfterRefusal returns the admissions, of fixed windows of w, sent
// after a refusal decided wholly in their window had come back, and
// answered in that window: a refused key admitted before its window ended.
func admittedAfterRefusal(all []answered, w time.Duration) []answered {
	firstRefusal := map[int64]time.Time{} // by window: the earliest refusal's return
	for _, a := range all {
		win := a.sent.UnixNano() / int64(w)
		if a.ok || a.got.UnixNano()/int64(w) != win {
			continue
		}
		if f, ok := firstRefusal[win]; !ok || a.got.Before(f) {
			firstRefusal[win] = a.got
		}
	}
	var early []answered
	for _, a := range all {
		win := a.got.UnixNano() / int64(w)
		if f, ok := firstRefusal[win]; ok && a.ok && a.sent.After(f) {
			early = append(early, a)
		}
	}
	return early
}

// askHot asks s for the hot key once, and reports whether it was admitted.
func askHot(s *server) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := s.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "near", Descriptors: []*rlcommon.RateLimitDescriptor{desc("hot", "k")}})
	if err != nil {
		return false, err
	}
	return resp.OverallCode == rlsv3.RateLimitResponse_OK, nil
}

// perWindow counts, for each of windows, the admissions whose round trip
// lies within it (definite) and those whose round trip crosses into or out
// of it (maybe).
func perWindow(spans [][2]int, windows int) (definite, maybe []int) {
	definite, maybe = make([]int, windows), make([]int, windows)
	for _, sp := range spans {
		for w := sp[0]; w <= sp[1] && w < windows; w++ {
			if sp[0] == sp[1] {
				definite[w]++
			} else {
				maybe[w]++
			}
		}
	}
	return definite, maybe
}

// fleetMetric sums a metric over servers' /metrics.
func fleetMetric(t *testing.T, servers []*server, name string) float64 {
	t.Helper()
	sum := 0.0
	for _, s := range servers {
		sum += metricValue(t, s.http, name)
	}
	return sum
}

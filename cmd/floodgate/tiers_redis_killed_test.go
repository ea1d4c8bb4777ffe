package main

import (
	"fmt"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/floodgate/floodgate/internal/redistest"
)

// Redis KILLED (SIGKILL) mid-test, then restarted, with its data (an
// append-only file fsynced at every write) and without (no persistence):
// each tier behaves as docs/REDIS.md "When Redis is lost" says for it, and
// admits no more than that section's bound.

// answered is one request's round trip and its answer.
type answered struct {
	sent, got time.Time
	ok        bool
}

// record is every answer of a run, safe for concurrent use.
type record struct {
	mu  sync.Mutex
	all []answered
}

func (r *record) add(a answered) {
	r.mu.Lock()
	r.all = append(r.all, a)
	r.mu.Unlock()
}

// admitted counts the admissions whose whole round trip lies within
// [from, to).
func (r *record) admitted(from, to time.Time) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, a := range r.all {
		if a.ok && !a.sent.Before(from) && a.got.Before(to) {
			n++
		}
	}
	return n
}

// admittedTouching counts the admissions whose round trip overlaps
// [from, to): every admission that may have been decided in it.
func (r *record) admittedTouching(from, to time.Time) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, a := range r.all {
		if a.ok && a.got.After(from) && a.sent.Before(to) {
			n++
		}
	}
	return n
}

// drive asks nodes() for rlRequest's hot key from workers goroutines, each
// at most once every gap, recording each answer, until stop closes.
func drive(t *testing.T, r *record, nodes func() []*server, workers int, gap time.Duration, stop chan struct{}) *sync.WaitGroup {
	var wg sync.WaitGroup
	for i := range workers {
		wg.Go(func() {
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
					continue
				}
				r.add(answered{sent, time.Now(), resp.OverallCode == rlsv3.RateLimitResponse_OK})
			}
		})
	}
	return &wg
}

// startRedis starts a Redis that keeps its data across a restart
// (durable) or forgets it.
func startRedis(t *testing.T, durable bool) *redistest.Server {
	if durable {
		return redistest.StandaloneDurable(t)
	}
	return redistest.Standalone(t)
}

// windowAt returns the start of the window of length w holding t.
func windowAt(t time.Time, w time.Duration) time.Time { return t.Truncate(w) }

// Local share, two nodes, one key at about 5× its limit of 300 a 2 s
// window, failure mode closed. Redis is killed 150 ms into window k (the
// nodes hold slices) and restarted 750 ms later, in the same window; then
// killed again 1.5 s into window k+1 and restarted 700 ms into window k+2.
//
//   - While Redis is dead the nodes admit only from the slices they hold:
//     at most half the limit in all (each slice is at most the quota left
//     / (2 × nodes)), then the failure mode (closed) refuses. (That they
//     do spend them is TestShareRedisPausedSpendsSliceThenFailureMode's:
//     a starved node's slices may both be spent at the kill.)
//   - A window that starts while Redis is dead admits nothing until it
//     returns (the slices expired with their window; closed refuses).
//   - Restarted with its data, Redis still holds what was counted, slices
//     included: window k admits at most the limit. Restarted empty, it
//     forgot window k's count: window k admits at most what it admitted
//     before the restart (the slices spent while it was dead included)
//     plus the limit (docs/REDIS.md).
//   - Every window without a restart in it admits at most the limit.
func TestShareRedisKilled(t *testing.T) {
	for _, durable := range []bool{true, false} {
		t.Run(fmt.Sprintf("data_kept=%v", durable), func(t *testing.T) {
			srv := startRedis(t, durable)
			const limit, w = 300, 2 * time.Second
			dir := t.TempDir()
			writeRules(t, dir, "share.yaml", shareRules("2s", limit, ", failure_mode: closed"))
			nodes := shareNodes(t, srv, dir, 2, "--store-timeout", "100ms")
			r := &record{}
			stop := make(chan struct{})
			// wait for a window's end, then load from its start
			clearOfWindowEnd(t, w, 2*time.Second)
			k := windowAt(time.Now(), w).Add(w)
			time.Sleep(time.Until(k.Add(-1200 * time.Millisecond)))
			wg := drive(t, r, func() []*server { return nodes }, 16, 16*time.Millisecond, stop) // 1,000/s offered
			time.Sleep(time.Until(k.Add(150 * time.Millisecond)))
			// the kill should find slices held (a starved host may be late)
			for !(metricValue(t, nodes[0].http, "floodgate_store_share_keys") == 1 && metricValue(t, nodes[1].http, "floodgate_store_share_keys") == 1) &&
				time.Now().Before(k.Add(400*time.Millisecond)) {
				time.Sleep(5 * time.Millisecond)
			}
			kill1 := time.Now() // Redis dies within a millisecond of it
			srv.Kill()
			time.Sleep(max(500*time.Millisecond, time.Until(k.Add(900*time.Millisecond))))
			restart1 := time.Now()
			srv.Restart(t)
			back1 := time.Now()
			k1 := k.Add(w)
			time.Sleep(time.Until(k1.Add(1500 * time.Millisecond)))
			kill2 := time.Now()
			srv.Kill()
			k2 := k1.Add(w)
			time.Sleep(time.Until(k2.Add(700 * time.Millisecond)))
			restart2 := time.Now()
			srv.Restart(t)
			time.Sleep(time.Until(k2.Add(w - 10*time.Millisecond)))
			close(stop)
			wg.Wait()
			if back1.After(k1.Add(-300*time.Millisecond)) || kill2.After(k2) || restart2.After(k2.Add(w)) {
				t.Skipf("the host was too slow to keep the steps in their windows: kill at %v, restart at %v–%v, kill at %v, restart at %v into window k",
					kill1.Sub(k), restart1.Sub(k), back1.Sub(k), kill2.Sub(k), restart2.Sub(k))
			}

			dead := r.admitted(kill1, restart1)
			before := r.admittedTouching(k, kill1)
			after := r.admittedTouching(restart1, k1)
			inK := r.admittedTouching(k, k1)
			t.Logf("window k: %d admitted before the kill, %d while Redis was dead (its first 750 ms), %d after the restart; %d in all",
				before, dead, after, inK)
			if dead > limit/2 {
				t.Errorf("%d admitted while Redis was dead: more than the slices held (at most %d)", dead, limit/2)
			}
			if dead == 0 {
				// a starved node's slices are small (100 ms at its rate) and
				// may both be spent at the kill: the paused test requires
				// a slice spent (TestShareRedisPausedSpendsSliceThenFailureMode)
				t.Log("nothing admitted from the slices while Redis was dead")
			}
			sure := r.admitted(k, k1)
			if durable && sure > limit {
				t.Errorf("window k admitted %d with Redis restarted with its data: more than the limit %d", sure, limit)
			}
			if upto := r.admittedTouching(k, restart1); !durable && sure > upto+limit {
				t.Errorf("window k admitted %d with Redis restarted empty: more than the %d before the restart + the limit %d", sure, upto, limit)
			}
			if n := r.admitted(k1, k2); n > limit {
				t.Errorf("window k+1 admitted %d, more than the limit %d", n, limit)
			}
			if n := r.admitted(k2, restart2); n != 0 {
				t.Errorf("window k+2 admitted %d before Redis restarted, with closed as the failure mode and the slices expired", n)
			}
			if n := r.admitted(k2, k2.Add(w)); n > limit {
				t.Errorf("window k+2 admitted %d, more than the limit %d", n, limit)
			}
			t.Logf("window k+1: %d admitted (%d while Redis was dead); window k+2: %d (after the restart)",
				r.admittedTouching(k1, k2), r.admitted(kill2, k2), r.admittedTouching(k2, k2.Add(w)))
		})
	}
}

// Write-back at a budget of 5% of 400 a second, failure mode closed, two
// nodes on one key at 1.5× its limit. Redis is killed 1.3 s in (the key
// far from its limit: each node admits from memory) and restarted 400 ms
// later, in the same second.
//
//   - While Redis is dead the fleet admits at most the budget (5% of 400:
//     each node what is left of its threshold, at most budget × limit /
//     nodes), then the failure mode (closed) refuses.
//   - Restarted with its data, Redis holds every synced hit and the nodes
//     send the ones it missed: every second admits at most limit × (1 +
//     budget).
//   - Restarted empty, it forgot the second's count: that second admits at
//     most what it admitted before the restart plus limit × (1 + budget);
//     every other second at most limit × (1 + budget).
func TestWriteBackRedisKilled(t *testing.T) {
	const budget = 0.05
	most := int(wbLimit * (1 + budget))
	for _, durable := range []bool{true, false} {
		t.Run(fmt.Sprintf("data_kept=%v", durable), func(t *testing.T) {
			srv := startRedis(t, durable)
			dir := t.TempDir()
			writeRules(t, dir, "wb.yaml", wbRules("5%"))
			nodes := []*server{wbNode(t, dir, srv.Addr), wbNode(t, dir, srv.Addr)}
			waitWBNodes(t, nodes, 2)
			l := newWBLoad()
			l.rec = &record{}
			start := time.Now().Truncate(time.Second).Add(time.Second)
			time.Sleep(time.Until(start))
			var wg sync.WaitGroup
			wg.Go(func() { wbDrive(nodes, 3*wbLimit/4, start.Add(4*time.Second), l) })
			time.Sleep(time.Until(start.Add(1300 * time.Millisecond)))
			kill := time.Now()
			srv.Kill()
			time.Sleep(time.Until(start.Add(1700 * time.Millisecond)))
			restart := time.Now()
			srv.Restart(t)
			wg.Wait()
			if restart.Sub(start) >= 2*time.Second-50*time.Millisecond {
				t.Skipf("the host was too slow: Redis restarted %v in, not in the second it was killed in", restart.Sub(start))
			}
			var degraded float64
			for _, s := range nodes {
				select {
				case <-s.done:
					t.Fatalf("a node exited: %v\n%s", s.exit, s.logs())
				default:
				}
				degraded += metricSum(t, s.http, "floodgate_store_degraded_decisions_total")
			}
			dead := l.rec.admitted(kill, restart)
			s1, s2 := start.Add(time.Second), start.Add(2*time.Second)
			before := l.rec.admittedTouching(s1, restart)
			t.Logf("killed %v in, restarted %v in: %s; admitted while dead %d, in second 1 before the restart %d; decided by the failure mode %g",
				kill.Sub(start), restart.Sub(start), l, dead, before, degraded)
			if dead > int(budget*wbLimit) {
				t.Errorf("admitted %d while Redis was dead, more than the budget (%g of %d)", dead, budget, wbLimit)
			}
			if degraded == 0 {
				t.Error("no decision went to the failure mode while Redis was dead")
			}
			if durable {
				l.check(t, budget)
				return
			}
			for sec := start; sec.Before(start.Add(4 * time.Second)); sec = sec.Add(time.Second) {
				n := l.rec.admitted(sec, sec.Add(time.Second))
				bound := most
				if sec.Equal(s1) {
					bound += before
				}
				if n > bound {
					t.Errorf("second %v admitted %d, more than %d", sec.Sub(start), n, bound)
				}
			}
			_ = s2
		})
	}
}

// nearNodes starts n serve processes (near cache on, the default) on srv
// with one rule: key "hot", limit 5 a window of w, failing open.
func nearNodes(t *testing.T, srv *redistest.Server, n int, w string) []*server {
	dir := t.TempDir()
	writeRules(t, dir, "near.yaml", "domain: near\ndescriptors:\n  - key: hot\n    rate_limit: {window: "+w+", requests_per_unit: 5, failure_mode: open}\n")
	return startNodes(n, func() *server {
		s := startServer(t, "--rules", dir, "--data", t.TempDir(), "--store", "redis://"+srv.Addr+"?dial_timeout=5s", "--store-timeout", "200ms")
		s.ask(t, "near", desc("hot", "warm")) // loads the library
		return s
	})
}

// okNear asks s for the hot key's value v and reports whether it was
// admitted.
func okNear(t *testing.T, s *server, v string) bool {
	return s.ask(t, "near", desc("hot", v)).OverallCode == rlsv3.RateLimitResponse_OK
}

// refuseEverywhere spends key k's limit of 5 on nodes[0], then has every
// node of nodes be refused it once by Redis (so each one's near cache
// holds the refusal until the window's end).
func refuseEverywhere(t *testing.T, nodes []*server, k string) {
	t.Helper()
	for i := range 5 {
		if !okNear(t, nodes[0], k) {
			t.Fatalf("request %d of a limit of 5 refused", i+1)
		}
	}
	for i, s := range nodes {
		if okNear(t, s, k) {
			t.Fatalf("node %d: the 6th request of a limit of 5 admitted", i)
		}
	}
}

// The near cache with Redis killed, four nodes, a rule of 5 a 3 s window
// failing open. Each node learned from Redis that the key is refused until
// the window ends (T).
//
//   - Redis killed: every node goes on refusing the key until T, without
//     Redis, while the failure mode (open) admits every other key; after T
//     the failure mode decides the key too (open: admitted).
//   - Redis restarted before T: the nodes that hold the refusal refuse the
//     key until T, with or without Redis's data. A node that never saw the
//     refusal asks Redis: restarted with its data, Redis refuses it (the
//     window's count survived); restarted empty, Redis admits it (it forgot
//     the count: docs/REDIS.md "The near cache", "What it costs").
func TestNearCacheRedisKilled(t *testing.T) {
	t.Run("dead_past_T", nearDeadPastT)
	for _, durable := range []bool{true, false} {
		t.Run(fmt.Sprintf("restarted_before_T/data_kept=%v", durable), func(t *testing.T) { nearRestartedBeforeT(t, durable) })
	}
}

// nearDeadPastT is TestNearCacheRedisKilled with Redis dead past T.
func nearDeadPastT(t *testing.T) {
	const w = 3 * time.Second
	srv := redistest.Standalone(t)
	nodes := nearNodes(t, srv, 4, "3s")
	clearOfWindowEnd(t, w, 2500*time.Millisecond)
	T := windowAt(time.Now(), w).Add(w)
	refuseEverywhere(t, nodes, "k")
	srv.Kill()
	for i, s := range nodes {
		for range 3 {
			if okNear(t, s, "k") {
				t.Errorf("node %d admitted the refused key with Redis dead, before the refusal's end", i)
			}
		}
		if !okNear(t, s, fmt.Sprintf("other-%d", i)) {
			t.Errorf("node %d refused another key with Redis dead: failure_mode open admits", i)
		}
	}
	if time.Now().After(T) {
		t.Skip("the host was too slow: the window ended before the checks")
	}
	for i, s := range nodes {
		if h := metricValue(t, s.http, "floodgate_store_near_cache_hits_total"); h < 3 {
			t.Errorf("node %d: %g near cache hits, want the 3 refusals made without Redis", i, h)
		}
	}
	time.Sleep(time.Until(T) + 20*time.Millisecond)
	for i, s := range nodes {
		if !okNear(t, s, "k") {
			t.Errorf("node %d refused the key after the refusal's end with Redis dead: failure_mode open admits", i)
		}
	}
}

// nearRestartedBeforeT is TestNearCacheRedisKilled with Redis restarted
// before T, with its data or without.
func nearRestartedBeforeT(t *testing.T, durable bool) {
	const w = 3 * time.Second
	srv := startRedis(t, durable)
	nodes := nearNodes(t, srv, 4, "3s")
	clearOfWindowEnd(t, w, 2500*time.Millisecond)
	T := windowAt(time.Now(), w).Add(w)
	refuseEverywhere(t, nodes[:3], "k") // nodes[3] never asks for k
	srv.Kill()
	srv.Restart(t)
	for i, s := range nodes[:3] {
		for range 3 {
			if okNear(t, s, "k") {
				t.Errorf("node %d admitted the key it knows refused, before the refusal's end (Redis restarted)", i)
			}
		}
	}
	fresh := nodes[3]
	onRedisAgain(t, fresh)
	got := okNear(t, fresh, "k")
	if time.Now().After(T.Add(-100 * time.Millisecond)) {
		t.Skip("the host was too slow: the window ended before the checks")
	}
	if durable && got {
		t.Error("Redis restarted with its data admitted the key refused in its window")
	}
	if !durable && !got {
		t.Error("Redis restarted empty refused the key: it should have forgotten the window's count")
	}
}

// onRedisAgain waits until s decides on Redis again after a restart (its
// first call may find its connection broken: the failure mode decides).
func onRedisAgain(t *testing.T, s *server) {
	t.Helper()
	for p := 0; ; p++ {
		d0 := metricValue(t, s.http, "floodgate_store_degraded_decisions_total")
		okNear(t, s, fmt.Sprintf("probe-%d", p))
		if metricValue(t, s.http, "floodgate_store_degraded_decisions_total") == d0 {
			return
		}
		if p == 50 {
			t.Fatal("the node's decisions still go to the failure mode 50 requests after the restart")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

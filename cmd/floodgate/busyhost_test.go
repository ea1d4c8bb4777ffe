package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/floodgate/floodgate/internal/redistest"
)

// flapRedis pauses srv for 200ms in every 1.2s, cycles times, while
// /readyz at addr is polled every 50ms, and returns how many times its
// status changed. Redis is mostly up: each pause is shorter than
// --unready-after, and each stretch of health shorter than --ready-after.
func flapRedis(t *testing.T, srv *redistest.Server, addr string, cycles int) (changes int) {
	t.Helper()
	var stop atomic.Bool
	var wg sync.WaitGroup
	var codes []int
	wg.Go(func() {
		last := 0
		for !stop.Load() {
			code, _ := readyz(t, addr)
			if code != last {
				codes = append(codes, code)
				if last != 0 {
					changes++
				}
				last = code
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
	for range cycles {
		srv.Pause()
		time.Sleep(200 * time.Millisecond)
		srv.Resume()
		time.Sleep(time.Second)
	}
	stop.Store(true)
	wg.Wait()
	t.Logf("/readyz statuses in turn: %v", codes)
	return changes
}

// askLoop keeps n callers asking s for decisions until the returned
// function is called, so that the store's breaker sees Redis's pauses.
func askLoop(s *server, n int) func() {
	var stop atomic.Bool
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for !stop.Load() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				s.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlcommon.RateLimitDescriptor{desc("user", "flap")}})
				cancel()
			}
		})
	}
	return func() { stop.Store(true); wg.Wait() }
}

// A Redis that stalls briefly and often (its breaker flapping, its PINGs
// failing now and then) does not flap serve's /readyz: with the default
// hysteresis (unready after 3s of failed checks, ready after 5s of
// passed ones) it stays ready. Before, /readyz followed the breaker and
// the PING, and changed about twice a stall.
func TestServeReadyzDoesNotFlap(t *testing.T) {
	srv := redistest.Standalone(t)
	dir := t.TempDir()
	writeRules(t, dir, "api.yaml", apiRules)
	s := startServer(t, "--rules", dir, "--data", t.TempDir(), "--store", "redis://"+srv.Addr)
	if code, body := readyz(t, s.http); code != 200 {
		t.Fatalf("readyz before: %d %s", code, body)
	}
	done := askLoop(s, 4)
	changes := flapRedis(t, srv, s.http, 6)
	done()
	if changes != 0 {
		t.Fatalf("/readyz changed %d times while Redis stalled 200ms a second", changes)
	}
}

// The same of proxy's /readyz (on its admin address).
func TestProxyReadyzDoesNotFlap(t *testing.T) {
	srv := redistest.Standalone(t)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer up.Close()
	dir := t.TempDir()
	writeRules(t, dir, "edge.yaml", proxyRules)
	p := startProxy(t, up.URL, dir, "--store", "redis://"+srv.Addr)
	admin := p.addrs["admin"]
	if code, body := readyz(t, admin); code != 200 {
		t.Fatalf("readyz before: %d %s", code, body)
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Go(func() {
		for !stop.Load() {
			if resp, err := http.Get("http://" + p.addrs["proxy"] + "/limited/x"); err == nil {
				resp.Body.Close()
			}
		}
	})
	changes := flapRedis(t, srv, admin, 6)
	stop.Store(true)
	wg.Wait()
	if changes != 0 {
		t.Fatalf("/readyz changed %d times while Redis stalled 200ms a second", changes)
	}
}

// A Redis that is gone for good still makes /readyz unready, after
// --unready-after, and ready again after --ready-after once it is back;
// the answer says, meanwhile, how long the check has been failing.
func TestServeReadyzHysteresisBothWays(t *testing.T) {
	srv := redistest.Standalone(t)
	dir := t.TempDir()
	writeRules(t, dir, "api.yaml", apiRules)
	s := startServer(t, "--rules", dir, "--data", t.TempDir(), "--store", "redis://"+srv.Addr,
		"--unready-after", "1s", "--ready-after", "1s")
	if code, _ := readyz(t, s.http); code != 200 {
		t.Fatalf("readyz before: %d", code)
	}
	// The times are taken before the kill and the restart begin: each may
	// take a while to return on a busy host, while serve already sees it.
	killed := time.Now()
	srv.Kill()
	code, body := readyz(t, s.http)
	if time.Since(killed) < time.Second && code != 200 {
		t.Fatalf("readyz just after the kill: %d %s; want still ready, failing", code, body)
	}
	waitFor(t, "readyz to turn unready", func() bool { code, _ := readyz(t, s.http); return code == http.StatusServiceUnavailable })
	if el := time.Since(killed); el < time.Second {
		t.Fatalf("unready %v after the kill, before --unready-after 1s", el)
	}
	back := time.Now()
	srv.Restart(t)
	waitFor(t, "readyz to turn ready", func() bool { code, _ := readyz(t, s.http); return code == 200 })
	if el := time.Since(back); el < time.Second {
		t.Fatalf("ready %v after the restart, before --ready-after 1s", el)
	}
}

// serve's process starved (stopped 300ms at a time, as a load of 15 on 2
// cores does in bursts) while its Redis is healthy: no breaker opens,
// and /readyz stays ready.
func TestServeStarvedKeepsBreakerClosed(t *testing.T) {
	srv := redistest.Standalone(t)
	dir := t.TempDir()
	writeRules(t, dir, "api.yaml", apiRules)
	s := startServer(t, "--rules", dir, "--data", t.TempDir(), "--store", "redis://"+srv.Addr)
	s.ask(t, "api", desc("user", "warm"))
	done := askLoop(s, 32)
	for range 8 {
		time.Sleep(200 * time.Millisecond)
		s.cmd.Process.Signal(syscall.SIGSTOP)
		time.Sleep(300 * time.Millisecond)
		s.cmd.Process.Signal(syscall.SIGCONT)
		if code, body := readyz(t, s.http); code != 200 {
			t.Errorf("readyz after a stop: %d %s", code, body)
		}
	}
	done()
	// (before, the breaker opened at most stops: thousands of decisions
	// degraded without a call)
	if n := metricValue(t, s.http, "floodgate_store_breaker_opens_total"); n != 0 {
		t.Errorf("the breaker opened %v times on a healthy Redis; timeouts %v, excused %v", n,
			metricValue(t, s.http, "floodgate_store_timeouts_total"), metricValue(t, s.http, "floodgate_store_starved_timeouts_total"))
	}
	t.Logf("timeouts %v, excused %v", metricValue(t, s.http, "floodgate_store_timeouts_total"), metricValue(t, s.http, "floodgate_store_starved_timeouts_total"))
}

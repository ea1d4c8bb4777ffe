package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/floodgate/floodgate/internal/redistest"
)

// deferGauge reads one of the queue edge/orders' gauges from a scrape
// (-1: absent).
func deferGauge(t *testing.T, metrics, name string) float64 {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + name + `\{queue="edge/orders"\} (\S+)$`).FindStringSubmatch(metrics)
	if m == nil {
		return -1
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestProxyDeferMetrics: the binary on a real Redis exports each defer
// queue's depth and the age of its oldest request on /metrics; they move
// as requests are deferred (3 queued, the age growing while the upstream
// holds the first delivery) and fall to 0 once all are delivered.
func TestProxyDeferMetrics(t *testing.T) {
	srv := redistest.Standalone(t)
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Idempotency-Key") != "" {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}
		io.WriteString(w, "ok") //nolint:errcheck
	}))
	defer up.Close()
	var once sync.Once
	unhold := func() { once.Do(func() { close(release) }) }
	defer unhold() // before up.Close, which waits for held deliveries on a failure
	dir := t.TempDir()
	writeRules(t, dir, "edge.yaml", deferRules)
	// a store timeout a starved host keeps: the default 50 ms fails a
	// starved call open, admitting a request the test defers
	p := startProxy(t, up.URL, dir, "--store", "redis://"+srv.Addr+"?dial_timeout=5s", "--store-timeout", "10s")
	base, admin := "http://"+p.addrs["proxy"], "http://"+p.addrs["admin"]+"/metrics"
	scrape := func() (length, age float64) {
		_, _, m := proxyGet(t, admin)
		return deferGauge(t, m, "floodgate_defer_queue_length"), deferGauge(t, m, "floodgate_defer_oldest_age_seconds")
	}
	if l, a := scrape(); l != 0 || a != 0 {
		t.Fatalf("empty queue: length %v age %v, want 0 and 0", l, a)
	}
	if _, _, m := proxyGet(t, admin); deferGauge(t, m, "floodgate_defer_dead_letters") != 0 {
		t.Fatalf("dead letters of an empty queue: %v, want 0", deferGauge(t, m, "floodgate_defer_dead_letters"))
	}
	for i := range 4 {
		resp, err := http.Post(base+"/orders/x", "text/plain", strings.NewReader("b"))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if want := map[bool]int{true: 200, false: 202}[i == 0]; resp.StatusCode != want {
			t.Fatalf("request %d: %d, want %d", i, resp.StatusCode, want)
		}
	}
	l1, a1 := scrape()
	if l1 != 3 {
		t.Fatalf("3 deferred (one held at the upstream): length %v", l1)
	}
	var a2 float64
	redistest.WaitFor(t, 10*time.Second, "the oldest's age growing", func() bool {
		var l2 float64
		l2, a2 = scrape()
		return l2 == 3 && a2 > a1 && a2 > 0
	})
	unhold()
	redistest.WaitFor(t, 20*time.Second, "the queue drained on /metrics", func() bool {
		l, a := scrape()
		return l == 0 && a == 0
	})
	_, _, m := proxyGet(t, admin)
	if !strings.Contains(m, "floodgate_defer_scrape_errors_total 0\n") {
		t.Errorf("scrape errors:\n%s", grepLines(m, "floodgate_defer"))
	}
}

// TestProxyNoDeferMetricsOnMemory: without Redis there are no queues and
// no deferred-queue metrics.
func TestProxyNoDeferMetricsOnMemory(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer up.Close()
	p := startProxy(t, up.URL, t.TempDir())
	if _, _, m := proxyGet(t, "http://"+p.addrs["admin"]+"/metrics"); strings.Contains(m, "floodgate_defer_") {
		t.Errorf("memory store exports:\n%s", grepLines(m, "floodgate_defer_"))
	}
}

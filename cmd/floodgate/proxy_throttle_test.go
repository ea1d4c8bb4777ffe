package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate/floodgate/internal/redistest"
)

// TestThrottleFlags: bad throttler flags are errors; without them there
// is no throttler.
func TestThrottleFlags(t *testing.T) {
	for _, args := range [][]string{{"--throttle-max-inflight", "-1"}, {"--throttle-queue-cost", "-1ms"},
		{"--throttle-max-wait", "-1s"}, {"--criticality-header", ""}} {
		if _, err := proxyFlags(append([]string{"--upstream", "http://127.0.0.1:1"}, args...), io.Discard); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
	c, err := proxyFlags([]string{"--upstream", "http://127.0.0.1:1"}, io.Discard)
	if err != nil || c.throttle.throttler() != nil {
		t.Errorf("default: %v; want no throttler", err)
	}
	c, err = proxyFlags([]string{"--upstream", "http://127.0.0.1:1", "--throttle-adaptive"}, io.Discard)
	if err != nil || c.throttle.throttler() == nil {
		t.Errorf("--throttle-adaptive: %v; want a throttler", err)
	}
}

// throttleRules: /limited/ allows one request an hour per client.
const throttleRules = `domain: edge
http:
  - name: limited
    match: {path_prefix: /limited/}
    key: [remote_address]
    rate_limit: {unit: hour, requests_per_unit: 1, algorithm: token_bucket}
`

// sampleValue reads one sample of a scrape (-1: absent).
func sampleValue(t *testing.T, metrics, sample string) float64 {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(sample) + ` (\S+)$`).FindStringSubmatch(metrics)
	if m == nil {
		return -1
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestProxyThrottleShedsByCriticality runs the binary with a throttler of
// one request in flight and a queue of 2.5 ms of predicted cost (two
// requests of the 1 ms an unmeasured route is predicted at) in front of
// an upstream that holds every request until released:
//   - a queued client that leaves gives its place back (canceled);
//   - with the queue full of SHEDDABLE, another SHEDDABLE is shed at once
//     with 503 and Retry-After, never reaching the upstream;
//   - a CRITICAL arrival evicts the newest SHEDDABLE (503) and runs once
//     the upstream answers;
//   - a quota refusal stays 429 while the queue is full;
//   - afterwards nothing is in flight or queued, the upstream saw exactly
//     the admitted requests, and the proxy's goroutines are back.
func TestProxyThrottleShedsByCriticality(t *testing.T) {
	release := make(chan struct{})
	var arrived atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived.Add(1)
		if r.URL.Path != "/limited/a" {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}
		io.WriteString(w, "ok "+r.URL.Path) //nolint:errcheck
	}))
	defer up.Close()
	dir := t.TempDir()
	writeRules(t, dir, "edge.yaml", throttleRules)
	p := startProxy(t, up.URL, dir, "--throttle-max-inflight", "1", "--throttle-queue-cost", "2500us", "--throttle-max-wait", "60s")
	base, admin := "http://"+p.addrs["proxy"], "http://"+p.addrs["admin"]+"/metrics"
	scrape := func() string { _, _, m := proxyGet(t, admin); return m }
	gauge := func(name string) float64 { return sampleValue(t, scrape(), name) }
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	type result struct {
		name   string
		status int
		retry  string
	}
	results := make(chan result, 256)
	send := func(name, path, crit string) {
		req, _ := http.NewRequest("GET", base+path, nil)
		if crit != "" {
			req.Header.Set("X-Criticality", crit)
		}
		resp, err := client.Do(req)
		if err != nil {
			results <- result{name: name, status: -1}
			return
		}
		io.Copy(io.Discard, resp.Body) //nolint:errcheck
		resp.Body.Close()
		results <- result{name, resp.StatusCode, resp.Header.Get("Retry-After")}
	}
	next := func() result {
		t.Helper()
		select {
		case r := <-results:
			return r
		case <-time.After(20 * time.Second):
			t.Fatalf("no answer in 20s\n%s", p.logs())
		}
		return result{}
	}
	waitGauge := func(name string, want float64) {
		t.Helper()
		redistest.WaitFor(t, 10*time.Second, fmt.Sprintf("%s = %v", name, want), func() bool { return gauge(name) == want })
	}
	// the quota of /limited/ spent while the throttler is idle
	if st, _, _ := proxyGet(t, base+"/limited/a"); st != 200 {
		t.Fatalf("/limited/ first: %d", st)
	}
	goroutines := gauge("go_goroutines")

	go send("A", "/slow/a", "") // CRITICAL by default: runs, held by the upstream
	waitGauge("floodgate_throttle_in_flight", 1)

	// a queued client that leaves
	c, err := net.Dial("tcp", p.addrs["proxy"])
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "GET /slow/gone HTTP/1.1\r\nHost: x\r\nX-Criticality: SHEDDABLE\r\n\r\n")
	waitGauge("floodgate_throttle_queue_length", 1)
	c.Close()
	waitGauge("floodgate_throttle_queue_length", 0)

	// SHEDDABLE requests fill the queue (how many fit depends on the
	// cost predicted from /limited/a's) until one is shed at once
	var queued []string
	for i := 1; ; i++ {
		if i > 200 {
			t.Fatalf("200 SHEDDABLE requests queued and none shed")
		}
		name := fmt.Sprint("S", i)
		go send(name, "/"+name, "SHEDDABLE")
		var r result
		redistest.WaitFor(t, 10*time.Second, name+" queued or shed", func() bool {
			select {
			case r = <-results:
				return true
			default:
				return gauge("floodgate_throttle_queue_length") == float64(len(queued)+1)
			}
		})
		if r.name == "" {
			queued = append(queued, name)
			continue
		}
		if r.name != name || r.status != 503 || r.retry != "1" || len(queued) == 0 {
			t.Fatalf("SHEDDABLE at a full queue: %+v after %d queued; want %s 503 Retry-After 1", r, len(queued), name)
		}
		break
	}
	newest := queued[len(queued)-1]
	go send("C", "/slow/c", "CRITICAL") // evicts the newest SHEDDABLE
	if r := next(); r.name != newest || r.status != 503 {
		t.Fatalf("CRITICAL at a full queue: %+v; want %s evicted with 503", r, newest)
	}
	if st, _, _ := proxyGet(t, base+"/limited/b"); st != 429 {
		t.Errorf("over quota while the throttler is full: %d, want 429", st)
	}
	if q := gauge("floodgate_throttle_queue_length"); q != float64(len(queued)) {
		t.Errorf("queue after the eviction: %v, want %d", q, len(queued))
	}
	close(release)
	got := map[string]int{}
	for range len(queued) + 1 {
		r := next()
		got[r.name] = r.status
	}
	for _, name := range append([]string{"A", "C"}, queued[:len(queued)-1]...) {
		if got[name] != 200 {
			t.Errorf("admitted request %s: %d, want 200 (all: %v)", name, got[name], got)
		}
	}
	waitGauge("floodgate_throttle_in_flight", 0)
	m := scrape()
	for sample, want := range map[string]float64{
		"floodgate_throttle_queue_length":                                            0,
		`floodgate_throttle_shed_total{criticality="SHEDDABLE",reason="queue_full"}`: 1,
		`floodgate_throttle_shed_total{criticality="SHEDDABLE",reason="evicted"}`:    1,
		`floodgate_throttle_shed_total{criticality="SHEDDABLE",reason="canceled"}`:   1,
		`floodgate_throttle_shed_total{criticality="CRITICAL",reason="queue_full"}`:  0,
		"floodgate_throttle_admitted_total":                                          float64(len(queued) + 2), // /limited/a, A, C, the queued but the evicted
		"floodgate_throttle_completions_total":                                       float64(len(queued) + 2),
		`floodgate_proxy_requests_total{outcome="refused"}`:                          1,
	} {
		if v := sampleValue(t, m, sample); v != want {
			t.Errorf("%s = %v, want %v (queued %v)\n%s", sample, v, want, queued, grepLines(m, "floodgate_throttle"))
		}
	}
	// /limited/a, A, C and the admitted SHEDDABLE reached the upstream;
	// the shed, the evicted, the canceled and the over-quota did not
	if n := arrived.Load(); n != int64(len(queued)+2) {
		t.Errorf("the upstream saw %d requests, want %d", n, len(queued)+2)
	}
	redistest.WaitFor(t, 10*time.Second, "the proxy's goroutines back", func() bool { return gauge("go_goroutines") <= goroutines+2 })
}

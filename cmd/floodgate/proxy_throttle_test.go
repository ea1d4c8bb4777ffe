package main

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate/floodgate/internal/redistest"
)

// TestThrottleFlags: bad throttler flags are errors; without them there
// is no throttler.
func TestThrottleFlags(t *testing.T) {
	for _, args := range [][]string{{"--throttle-max-inflight", "-1"}, {"--throttle-queue-cost", "-1ms"},
		{"--throttle-max-wait", "-1s"}, {"--criticality-header", ""}, {"--throttle-spare", "0"}, {"--throttle-spare", "1.5"}, {"--throttle-spare", "NaN"}, {"--defer-poll-rate", "0"}, {"--defer-poll-rate", "NaN"}} {
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

// throttleRules: /limited/ allows one request an hour per client, at
// criticality SHEDDABLE at most.
const throttleRules = `domain: edge
http:
  - name: limited
    match: {path_prefix: /limited/}
    key: [remote_address]
    criticality: SHEDDABLE
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

// throttleRig drives TestProxyThrottleShedsByCriticality's proxy.
type throttleRig struct {
	t           *testing.T
	p           *server
	base, admin string
	client      *http.Client
	results     chan throttleResult
}

// throttleResult is one request's answer (status -1: no answer).
type throttleResult struct {
	name   string
	status int
	retry  string
}

// send sends GET path with criticality crit ("": none) and reports its
// answer on results, as name.
func (r *throttleRig) send(name, path, crit string) {
	req, _ := http.NewRequest("GET", r.base+path, nil)
	if crit != "" {
		req.Header.Set("X-Criticality", crit)
	}
	resp, err := r.client.Do(req)
	if err != nil {
		r.results <- throttleResult{name: name, status: -1}
		return
	}
	io.Copy(io.Discard, resp.Body) //nolint:errcheck
	resp.Body.Close()
	r.results <- throttleResult{name, resp.StatusCode, resp.Header.Get("Retry-After")}
}

// next returns the next answer.
func (r *throttleRig) next() throttleResult {
	r.t.Helper()
	select {
	case res := <-r.results:
		return res
	case <-time.After(20 * time.Second):
		r.t.Fatalf("no answer in 20s\n%s", r.p.logs())
	}
	return throttleResult{}
}

func (r *throttleRig) scrape() string { _, _, m := proxyGet(r.t, r.admin); return m }

func (r *throttleRig) gauge(name string) float64 { return sampleValue(r.t, r.scrape(), name) }

func (r *throttleRig) waitGauge(name string, want float64) {
	r.t.Helper()
	redistest.WaitFor(r.t, 10*time.Second, fmt.Sprintf("%s = %v", name, want), func() bool { return r.gauge(name) == want })
}

// fill sends SHEDDABLE requests one at a time until one is shed at once
// (503, Retry-After: 1), and returns the names of those queued.
func (r *throttleRig) fill() []string {
	r.t.Helper()
	var queued []string
	for i := 1; i <= 200; i++ {
		name := fmt.Sprint("S", i)
		go r.send(name, "/"+name, "SHEDDABLE")
		var res throttleResult
		redistest.WaitFor(r.t, 10*time.Second, name+" queued or shed", func() bool {
			select {
			case res = <-r.results:
				return true
			default:
				return r.gauge("floodgate_throttle_queue_length") == float64(len(queued)+1)
			}
		})
		if res.name == "" {
			queued = append(queued, name)
			continue
		}
		if res.name != name || res.status != 503 || res.retry != "1" || len(queued) == 0 {
			r.t.Fatalf("SHEDDABLE at a full queue: %+v after %d queued; want %s 503 Retry-After 1", res, len(queued), name)
		}
		return queued
	}
	r.t.Fatalf("200 SHEDDABLE requests queued and none shed")
	return nil
}

// TestProxyThrottleShedsByCriticality runs the binary with a throttler of
// one request in flight and a queue of 20 ms of predicted cost (how many
// requests fit depends on the cost measured for the first) in front of
// an upstream that holds every request until released:
//   - a queued client that leaves gives its place back (canceled);
//   - with the queue full of SHEDDABLE, another SHEDDABLE is shed at once
//     with 503 and Retry-After, never reaching the upstream;
//   - a CRITICAL arrival evicts the newest SHEDDABLE (503) and runs once
//     the upstream answers;
//   - a request over its quota is shed at the full queue (503: the
//     throttler is asked before the gate), claiming CRITICAL_PLUS in vain
//     on its SHEDDABLE route, and is 429 once the server is idle;
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
	var once sync.Once
	unhold := func() { once.Do(func() { close(release) }) }
	defer unhold() // before up.Close, which waits for held requests on a failure
	dir := t.TempDir()
	writeRules(t, dir, "edge.yaml", throttleRules)
	p := startProxy(t, up.URL, dir, "--throttle-max-inflight", "1", "--throttle-queue-cost", "20ms", "--throttle-max-wait", "60s")
	r := &throttleRig{t: t, p: p, base: "http://" + p.addrs["proxy"], admin: "http://" + p.addrs["admin"] + "/metrics",
		client: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}, results: make(chan throttleResult, 256)}
	base := r.base
	// the quota of /limited/ spent while the throttler is idle
	if st, _, _ := proxyGet(t, base+"/limited/a"); st != 200 {
		t.Fatalf("/limited/ first: %d", st)
	}
	goroutines := r.gauge("go_goroutines")

	go r.send("A", "/slow/a", "") // CRITICAL by default: runs, held by the upstream
	r.waitGauge("floodgate_throttle_in_flight", 1)

	// a queued client that leaves
	c, err := net.Dial("tcp", p.addrs["proxy"])
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "GET /slow/gone HTTP/1.1\r\nHost: x\r\nX-Criticality: SHEDDABLE\r\n\r\n")
	r.waitGauge("floodgate_throttle_queue_length", 1)
	c.Close()
	r.waitGauge("floodgate_throttle_queue_length", 0)

	// SHEDDABLE requests fill the queue until one is shed at once
	queued := r.fill()
	newest := queued[len(queued)-1]
	t.Logf("%d queued in 20 ms of predicted cost; the first request cost %gs", len(queued), sampleValue(t, r.scrape(), "floodgate_throttle_cost_actual_seconds_total"))
	go r.send("C", "/slow/c", "CRITICAL") // evicts the newest SHEDDABLE
	if res := r.next(); res.name != newest || res.status != 503 {
		t.Fatalf("CRITICAL at a full queue: %+v; want %s evicted with 503", res, newest)
	}
	go r.send("L", "/limited/b", "CRITICAL_PLUS") // its route caps it at SHEDDABLE
	if res := r.next(); res.name != "L" || res.status != 503 {
		t.Errorf("over quota while the throttler is full: %+v, want 503 (shed before the gate)", res)
	}
	if q := r.gauge("floodgate_throttle_queue_length"); q != float64(len(queued)) {
		t.Errorf("queue after the eviction: %v, want %d", q, len(queued))
	}
	unhold()
	got := map[string]int{}
	for range len(queued) + 1 {
		res := r.next()
		got[res.name] = res.status
	}
	for _, name := range append([]string{"A", "C"}, queued[:len(queued)-1]...) {
		if got[name] != 200 {
			t.Errorf("admitted request %s: %d, want 200 (all: %v)", name, got[name], got)
		}
	}
	r.waitGauge("floodgate_throttle_in_flight", 0)
	if st, _, _ := proxyGet(t, base+"/limited/b"); st != 429 {
		t.Errorf("over quota, the throttler idle: %d, want 429", st)
	}
	m := r.scrape()
	for sample, want := range map[string]float64{
		"floodgate_throttle_queue_length":                                            0,
		`floodgate_throttle_shed_total{criticality="SHEDDABLE",reason="queue_full"}`: 2,
		`floodgate_throttle_shed_total{criticality="SHEDDABLE",reason="evicted"}`:    1,
		`floodgate_throttle_shed_total{criticality="SHEDDABLE",reason="canceled"}`:   1,
		`floodgate_throttle_shed_total{criticality="CRITICAL",reason="queue_full"}`:  0,
		"floodgate_throttle_admitted_total":                                          float64(len(queued) + 3), // /limited/a, A, C, the queued but the evicted, the last /limited/b
		"floodgate_throttle_completions_total":                                       float64(len(queued) + 2), // the refused /limited/b released, not completed
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
	// fasthttp keeps an idle worker goroutine for 10 s
	// (MaxIdleWorkerDuration) after its connection's last request
	redistest.WaitFor(t, 30*time.Second, "the proxy's goroutines back", func() bool { return r.gauge("go_goroutines") <= goroutines+2 })
}

// TestProxyThrottleShedBodyCloses: with no queue (--throttle-queue-cost
// 0) and the one slot held, a POST with a 100 kB body is shed with 503
// (on its header: internal/proxy's TestShedOnHeader) and the connection
// closes: neither the requests inside its body nor the one after it are
// read as requests.
func TestProxyThrottleShedBodyCloses(t *testing.T) {
	release := make(chan struct{})
	var mu sync.Mutex
	var paths []string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		paths = append(paths, r.URL.Path)
		mu.Unlock()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer up.Close()
	var once sync.Once
	unhold := func() { once.Do(func() { close(release) }) }
	defer unhold()
	p := startProxy(t, up.URL, t.TempDir(), "--throttle-max-inflight", "1", "--throttle-queue-cost", "0")
	r := &throttleRig{t: t, p: p, base: "http://" + p.addrs["proxy"], admin: "http://" + p.addrs["admin"] + "/metrics",
		client: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}, results: make(chan throttleResult, 4)}
	go r.send("A", "/held", "")
	r.waitGauge("floodgate_throttle_in_flight", 1)
	c, err := net.Dial("tcp", p.addrs["proxy"])
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second)) //nolint:errcheck
	smuggled := "GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
	body := smuggled + strings.Repeat("x", 100000-2*len(smuggled)) + smuggled
	fmt.Fprintf(c, "POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n%s%s", body, smuggled)
	b, _ := io.ReadAll(c) // to the close
	if !bytes.HasPrefix(b, []byte("HTTP/1.1 503 ")) || !bytes.Contains(b, []byte("Retry-After: 1\r\n")) ||
		!bytes.Contains(b, []byte("Connection: close\r\n")) || bytes.Count(b, []byte("HTTP/1.1 ")) != 1 {
		t.Fatalf("shed POST read %q; want one 503 with Retry-After and Connection: close", b)
	}
	unhold()
	if res := r.next(); res.status != 200 {
		t.Errorf("the held request: %+v", res)
	}
	r.waitGauge("floodgate_throttle_in_flight", 0)
	mu.Lock()
	defer mu.Unlock()
	if len(paths) != 1 || paths[0] != "/held" {
		t.Errorf("the upstream saw %v; want only /held", paths)
	}
}

// elasticRules: /e/ allows 2 requests a minute per X-Client, up to 4
// while the throttler has spare capacity.
const elasticRules = `domain: edge
http:
  - name: elastic
    match: {path_prefix: /e/}
    key: [{header: X-Client}]
    rate_limit: {unit: minute, requests_per_unit: 2, mode: elastic, elastic_ceiling: 4}
`

// TestProxyElasticFollowsThrottler: the binary with 4 throttler slots and
// --throttle-spare 0.5 feeds the rules file's elastic limit: a client
// gets 4 of 6 through while the proxy is idle, 2 of 6 while 2 requests
// are held by the upstream (3 in flight with the one decided), and 4
// again once they are answered. Without a throttler the rules file's
// elastic mode is refused (rules' errors_test).
func TestProxyElasticFollowsThrottler(t *testing.T) {
	release := make(chan struct{})
	held := make(chan struct{}, 4)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/held" {
			held <- struct{}{}
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}
	}))
	defer up.Close()
	var once sync.Once
	unhold := func() { once.Do(func() { close(release) }) }
	defer unhold()
	dir := t.TempDir()
	writeRules(t, dir, "edge.yaml", elasticRules)
	p := startProxy(t, up.URL, dir, "--throttle-max-inflight", "4", "--throttle-spare", "0.5")
	base := "http://" + p.addrs["proxy"]
	passed := func(client string) int {
		n := 0
		for range 6 {
			if st, _, _ := proxyGet(t, base+"/e/x", "X-Client", client); st == 200 {
				n++
			}
		}
		return n
	}
	if n := passed("c1"); n != 4 {
		t.Errorf("idle: %d of 6 passed, want 4 (the elastic ceiling)", n)
	}
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { proxyGet(t, base+"/held") })
		select {
		case <-held:
		case <-time.After(20 * time.Second):
			t.Fatal("the held request did not reach the upstream")
		}
	}
	if n := passed("c2"); n != 2 {
		t.Errorf("2 of 4 slots held: %d of 6 passed, want 2 (the limit)", n)
	}
	unhold()
	wg.Wait()
	if n := passed("c3"); n != 4 {
		t.Errorf("idle again: %d of 6 passed, want 4", n)
	}
}

// throttleDelayRules: /slow/ allows one request a minute per X-Client and delays
// the next up to a minute.
const throttleDelayRules = `domain: edge
http:
  - name: slow
    match: {path_prefix: /slow/}
    key: [{header: X-Client}]
    action: delay
    max_delay: 1m
    rate_limit: {unit: minute, requests_per_unit: 1, algorithm: token_bucket}
`

// TestProxyThrottleDelayHoldsNoSlot runs the binary with a throttler of 2
// slots and no queue: 4 requests in a delay action's wait (a minute each)
// hold no slot (in flight 0, all 4 admitted before the gate and 4
// suspended), so requests of another route are served at once (before
// the change 2 of the 4 held both slots for their minute and the rest
// were shed with 503). Their
// clients' leaving ends the delays (gone_while_delayed); nothing is left
// in flight or queued.
func TestProxyThrottleDelayHoldsNoSlot(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })) //nolint:errcheck
	defer up.Close()
	dir := t.TempDir()
	writeRules(t, dir, "edge.yaml", throttleDelayRules)
	p := startProxy(t, up.URL, dir, "--throttle-max-inflight", "2", "--throttle-queue-cost", "0")
	r := &throttleRig{t: t, p: p, base: "http://" + p.addrs["proxy"], admin: "http://" + p.addrs["admin"] + "/metrics"}
	for i := range 4 {
		if st, _, _ := proxyGet(t, r.base+"/slow/x", "X-Client", fmt.Sprint("c", i)); st != 200 {
			t.Fatalf("client %d's first request: %d", i, st)
		}
	}
	var conns []net.Conn
	for i := range 4 {
		c, err := net.Dial("tcp", p.addrs["proxy"])
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "GET /slow/x HTTP/1.1\r\nHost: x\r\nX-Client: c%d\r\n\r\n", i)
		conns = append(conns, c)
	}
	redistest.WaitFor(t, 10*time.Second, "4 requests in their delay, holding no slot", func() bool {
		m := r.scrape()
		return sampleValue(t, m, "floodgate_throttle_admitted_total") == 8 && sampleValue(t, m, "floodgate_throttle_in_flight") == 0 &&
			sampleValue(t, m, "floodgate_throttle_suspended_total") == 4
	})
	for i := range 3 {
		start := time.Now()
		if st, _, _ := proxyGet(t, r.base+"/free"); st != 200 || time.Since(start) > 10*time.Second {
			t.Fatalf("request %d of another route while 4 are delayed: %d after %v, want 200 at once", i+1, st, time.Since(start))
		}
	}
	for _, c := range conns {
		c.Close()
	}
	r.waitGauge(`floodgate_proxy_client_errors_total{reason="gone_while_delayed"}`, 4)
	m := r.scrape()
	for sample, want := range map[string]float64{
		"floodgate_throttle_in_flight":                     0,
		"floodgate_throttle_queue_length":                  0,
		"floodgate_throttle_completions_total":             7,  // the 4 first and the 3 others
		"floodgate_throttle_admitted_total":                11, // each once: 8, and the 3 others
		"floodgate_throttle_readmitted_total":              0,  // the 4 left during their delay
		`floodgate_proxy_requests_total{outcome="passed"}`: 7,
	} {
		if v := sampleValue(t, m, sample); v != want {
			t.Errorf("%s = %v, want %v\n%s", sample, v, want, grepLines(m, "floodgate_"))
		}
	}
}

package httplimit_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/deferq"
	"github.com/floodgate/floodgate/gate"
	"github.com/floodgate/floodgate/httplimit"
	"github.com/floodgate/floodgate/internal/redistest"
	"github.com/floodgate/floodgate/rules"
	"github.com/redis/rueidis"
)

const deferRules = `domain: web
http:
  - name: orders
    match: {path_prefix: /orders}
    key: [remote_address]
    action: defer
    rate_limit: {unit: second, requests_per_unit: 2}
    defer: {max_queue: 2, result_ttl: 1m}
`

func deferLimits(t *testing.T, yaml string) (*rules.Config, []gate.Limit) {
	t.Helper()
	dom, err := rules.Parse("web.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := rules.NewConfig(dom)
	if err != nil {
		t.Fatal(err)
	}
	limits, err := gate.FromRules(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cfg, limits
}

// TestDeferAction: a rules file's defer route passes requests under its
// limit, answers those over it 202 with a poll Location on the same
// listener, refuses with 503 once its queue (max_queue 2) is full, and a
// worker delivers the queued ones to the handler at the route's rate (2/s:
// 500ms apart on the queue's clock) with an Idempotency-Key; the poll
// then serves the handler's response.
func TestDeferAction(t *testing.T) {
	srv := redistest.Standalone(t)
	cfg, limits := deferLimits(t, deferRules)
	l := limits[0]
	if l.Action != gate.Defer || l.DeferInterval() != 500*time.Millisecond || l.Defer.MaxQueue != 2 || l.Defer.ResultTTL != time.Minute {
		t.Fatalf("limit from rules: %+v (interval %v)", l, l.DeferInterval())
	}
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	qclk := clock.NewManual(time.Unix(1_800_000_000, 0))
	q, err := deferq.New(c, deferq.Options{Name: l.Name, Interval: l.DeferInterval(), MaxLen: l.Defer.MaxQueue, ResultTTL: l.Defer.ResultTTL, Clock: qclk})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := httplimit.New(httplimit.Options{
		Config: gate.Config{Rules: cfg, Limits: limits, Clock: clock.NewManual(time.Unix(1_800_000_000, 0)), Logger: slog.New(slog.DiscardHandler)},
		Defer:  map[string]httplimit.Deferrer{l.Name: q},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer mw.Close()
	var mu sync.Mutex
	var keys []string
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		keys = append(keys, r.Header.Get(deferq.IdempotencyHeader))
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "done "+r.URL.RequestURI()) //nolint:errcheck
	})
	s := httptest.NewServer(mw.Handler(next))
	defer s.Close()

	do := func(method, path string) *http.Response { return doBody(t, method, s.URL+path) }
	locs := fillQueue(t, do, l.Name)
	for _, loc := range locs {
		if st := do("GET", loc).StatusCode; st != http.StatusAccepted {
			t.Fatalf("poll %s before delivery: %d, want 202", loc, st)
		}
	}
	if st := do("GET", httplimit.DeferPollPrefix+"nosuchqueue/1-1.000000000000000000000000").StatusCode; st != http.StatusNotFound {
		t.Errorf("poll of an unknown queue: %d, want 404", st)
	}
	mu.Lock()
	if len(keys) != 2 {
		t.Fatalf("the handler saw %d requests before any delivery, want the 2 passed", len(keys))
	}
	mu.Unlock()

	deliverPaced(t, q, qclk, next)
	for _, loc := range locs {
		checkBody(t, s.URL+loc, http.StatusCreated, "done /orders/later")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(keys) != 4 || keys[2] == "" || keys[3] == "" || keys[2] == keys[3] {
		t.Errorf("idempotency keys seen: %q; want the two deliveries' distinct keys", keys)
	}
}

// fillQueue sends 2 requests under the limit (201 from the handler), 2
// over it (202 and a poll Location of queue name) and one more (503: the
// queue of 2 is full); it returns the Locations.
func fillQueue(t *testing.T, do func(method, path string) *http.Response, name string) []string {
	t.Helper()
	for i := range 2 {
		if st := do("POST", "/orders/direct").StatusCode; st != http.StatusCreated {
			t.Fatalf("request %d under the limit: %d, want 201 from the handler", i, st)
		}
	}
	var locs []string
	for i := range 2 {
		resp := do("POST", "/orders/later")
		loc := resp.Header.Get("Location")
		if resp.StatusCode != http.StatusAccepted || !strings.HasPrefix(loc, httplimit.DeferPollPrefix+name+"/") {
			t.Fatalf("request %d over the limit: %d Location %q, want 202 and a poll location", i, resp.StatusCode, loc)
		}
		locs = append(locs, loc)
	}
	if resp := do("POST", "/orders/later"); resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("over the limit with the queue full: %d, want 503 with Retry-After", resp.StatusCode)
	}
	return locs
}

// deliverPaced has one worker deliver two requests of q to next, the
// second exactly 500ms of qclk after the first (not at 499ms).
func deliverPaced(t *testing.T, q *deferq.Queue, qclk *clock.Manual, next http.Handler) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	deliver := deferq.ToHandler(next, 1<<20)
	if ok, err := q.Once(ctx, "w", deliver); !ok || err != nil {
		t.Fatal(ok, err)
	}
	done := make(chan error, 1)
	go func() { _, err := q.Once(ctx, "w", deliver); done <- err }()
	if err := qclk.WaitForSleepers(ctx, 1); err != nil {
		t.Fatal(err)
	}
	qclk.Advance(499 * time.Millisecond)
	if qclk.Sleepers() != 1 {
		t.Fatal("second delivery before the route's interval (500ms)")
	}
	qclk.Advance(time.Millisecond)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// doBody sends a request with a small body and drains the answer.
func doBody(t *testing.T, method, url string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader("payload"))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body) //nolint:errcheck
	resp.Body.Close()
	return resp
}

// checkBody GETs url and wants status and body.
func checkBody(t *testing.T, url string, status int, body string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != status || string(b) != body {
		t.Errorf("GET %s: %d %q, want %d %q", url, resp.StatusCode, b, status, body)
	}
}

// TestDeferNeedsQueueAndPolicy: a defer limit without a queue in
// Options.Defer, or without its own rate_limit, is an error, not a
// silent 429.
func TestDeferNeedsQueueAndPolicy(t *testing.T) {
	cfg, limits := deferLimits(t, deferRules)
	_, err := httplimit.New(httplimit.Options{Config: gate.Config{Rules: cfg, Limits: limits}})
	if err == nil || !strings.Contains(err.Error(), limits[0].Name) {
		t.Errorf("no queue: %v", err)
	}
	noRate := `domain: web
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 5}
http:
  - key: [remote_address]
    action: defer
`
	dom, err := rules.Parse("web.yaml", []byte(noRate))
	if err != nil {
		t.Fatal(err)
	}
	cfg, _ = rules.NewConfig(dom)
	limits, err = gate.FromRules(cfg)
	if err == nil {
		_, err = gate.New(gate.Config{Rules: cfg, Limits: limits})
	}
	if err == nil || !strings.Contains(err.Error(), "defer needs") {
		t.Errorf("defer without a rate_limit: %v", err)
	}
	if deferq.PollPrefix != httplimit.DeferPollPrefix {
		t.Errorf("poll prefixes differ: %q, %q", deferq.PollPrefix, httplimit.DeferPollPrefix)
	}
}

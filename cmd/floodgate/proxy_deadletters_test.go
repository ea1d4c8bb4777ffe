package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/floodgate/floodgate/internal/redistest"
)

// TestProxyDeferFlagsBad: a bad --defer-max-deliveries, --defer-max-dead,
// --defer-poll-concurrency or --defer-claim-idle (or its FLOODGATE_*
// twin) exits non-zero before anything starts, naming the flag and the
// value; proxy -h documents each with its variable.
func TestProxyDeferFlagsBad(t *testing.T) {
	for _, c := range [][2]string{
		{"--defer-max-deliveries", "0"}, {"--defer-max-deliveries", "-3"}, {"--defer-max-deliveries", "two"},
		{"--defer-max-dead", "0"}, {"--defer-max-dead", "-1"}, {"--defer-max-dead", "1e3"},
		{"--defer-poll-concurrency", "0"}, {"--defer-poll-concurrency", "-64"},
		{"--defer-claim-idle", "0s"}, {"--defer-claim-idle", "-1s"},
	} {
		code, _, errs := cli(t, "proxy", "--upstream", "http://127.0.0.1:1", c[0], c[1])
		if code == 0 || !strings.Contains(errs, c[0][2:]) || !strings.Contains(errs, c[1]) {
			t.Errorf("%s %s: exit %d, %q; want non-zero naming the flag and the value", c[0], c[1], code, errs)
		}
	}
	t.Setenv("FLOODGATE_DEFER_MAX_DELIVERIES", "none")
	if code, _, errs := cli(t, "proxy", "--upstream", "http://127.0.0.1:1"); code == 0 || !strings.Contains(errs, `FLOODGATE_DEFER_MAX_DELIVERIES="none"`) {
		t.Errorf("FLOODGATE_DEFER_MAX_DELIVERIES=none: exit %d, %q", code, errs)
	}
	t.Setenv("FLOODGATE_DEFER_MAX_DELIVERIES", "0")
	if code, _, errs := cli(t, "proxy", "--upstream", "http://127.0.0.1:1"); code == 0 || !strings.Contains(errs, "--defer-max-deliveries 0") {
		t.Errorf("FLOODGATE_DEFER_MAX_DELIVERIES=0: exit %d, %q", code, errs)
	}
	os.Unsetenv("FLOODGATE_DEFER_MAX_DELIVERIES")
	_, help, _ := cli(t, "help", "proxy")
	for _, s := range []string{"-defer-max-deliveries", "FLOODGATE_DEFER_MAX_DELIVERIES", "-defer-max-dead", "FLOODGATE_DEFER_MAX_DEAD",
		"-defer-poll-concurrency", "FLOODGATE_DEFER_POLL_CONCURRENCY"} {
		if !strings.Contains(help, s) {
			t.Errorf("floodgate help proxy does not name %s", s)
		}
	}
	if code, out, _ := cli(t, "help", "deadletters"); code != 0 || !strings.Contains(out, "deadletters requeue --queue NAME ID...") {
		t.Errorf("floodgate help deadletters: exit %d\n%s", code, out)
	}
	if code, _, errs := cli(t, "deadletters", "purge"); code != exitUsage || !strings.Contains(errs, `unknown subcommand "purge"`) {
		t.Errorf("deadletters purge: exit %d %q", code, errs)
	}
	if code, _, errs := cli(t, "deadletters", "list", "--limit", "0"); code != exitUsage || !strings.Contains(errs, "--limit 0") {
		t.Errorf("deadletters list --limit 0: exit %d %q", code, errs)
	}
	c, err := proxyFlags([]string{"--upstream", "http://127.0.0.1:1", "--defer-max-deliveries", "7", "--defer-max-dead", "9", "--defer-poll-concurrency", "3"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o := c.deferq.options(); o.MaxDeliveries != 7 || o.MaxDead != 9 || o.PollConcurrency != 3 || o.ClaimIdle != 30*time.Second || o.PollRate != 10 {
		t.Errorf("options %+v", o)
	}
}

// deadUpstream is an upstream whose deliveries of deferred requests (those
// with an Idempotency-Key) fail at the transport (the connection closed
// unanswered) while fail is set, and are answered 201 otherwise; it
// counts both by key and keeps each served request's X-Test header.
type deadUpstream struct {
	fail   atomic.Bool
	mu     sync.Mutex
	failed map[string]int
	served map[string]int
	hdr    map[string]string
}

func (u *deadUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	key := r.Header.Get("Idempotency-Key")
	if key != "" && u.fail.Load() {
		u.mu.Lock()
		u.failed[key]++
		u.mu.Unlock()
		c, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			c.Close()
		}
		return
	}
	if key != "" {
		u.mu.Lock()
		u.served[key]++
		u.hdr[key] = r.Header.Get("X-Test")
		u.mu.Unlock()
	}
	w.WriteHeader(http.StatusCreated)
	io.WriteString(w, "done "+string(b)) //nolint:errcheck
}

func (u *deadUpstream) counts(key string) (failed, served int, hdr string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.failed[key], u.served[key], u.hdr[key]
}

// TestProxyDeadLetters runs floodgate proxy on Redis with
// --defer-max-deliveries 2, --defer-max-dead 2 and
// --defer-poll-concurrency 1 in front of an upstream that fails every
// delivery at the transport:
//   - each of 3 deferred requests is tried exactly twice, then
//     dead-lettered (its poll 502); the dead-letter stream keeps 2;
//   - with Redis paused, of 4 polls at once one waits for Redis and 3
//     are 503 at once (--defer-poll-concurrency 1);
//   - floodgate deadletters list shows the 2 kept; without the admin
//     token the CLI exits 4 and the admin API answers 401, moving
//     nothing; an unknown queue, an unknown id and the dropped one exit
//     3 (404) saying so;
//   - the upstream healed, one is requeued by the CLI and delivered once,
//     with its Idempotency-Key and header, its result at its first poll
//     location; the other is requeued by two admin calls at once: one
//     200, one 404, and it is delivered once; the queue ends empty.
func TestProxyDeadLetters(t *testing.T) {
	for _, k := range []string{"FLOODGATE_ADMIN_TOKEN", "FLOODGATE_ADMIN_URL", "FLOODGATE_ADMIN_TOKEN_FILE"} {
		t.Setenv(k, "")
		os.Unsetenv(k)
	}
	srv := redistest.Standalone(t)
	up := &deadUpstream{failed: map[string]int{}, served: map[string]int{}, hdr: map[string]string{}}
	up.fail.Store(true)
	us := httptest.NewServer(up)
	defer us.Close()
	dir := t.TempDir()
	writeRules(t, dir, "edge.yaml", deferRules)
	p := startProxy(t, us.URL, dir, "--store", "redis://"+srv.Addr, "--store-timeout", "10s", "--admin-token", adminTestToken, "--defer-claim-idle", "300ms",
		"--defer-max-deliveries", "2", "--defer-max-dead", "2", "--defer-poll-concurrency", "1", "--defer-poll-rate", "1000")
	base, admin := "http://"+p.addrs["proxy"], p.addrs["admin"]
	post := func(path, body string) *http.Response {
		req, _ := http.NewRequest("POST", base+path, strings.NewReader(body))
		req.Header.Set("X-Test", "hdr-"+body)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body) //nolint:errcheck
		resp.Body.Close()
		return resp
	}
	if resp := post("/orders/first", "b0"); resp.StatusCode != http.StatusCreated {
		t.Fatalf("the first request: %d, want 201 from the upstream", resp.StatusCode)
	}
	var locs, keys, ids []string
	for i := 1; i <= 3; i++ {
		resp := post("/orders/x", fmt.Sprint("b", i))
		loc := resp.Header.Get("Location")
		if resp.StatusCode != http.StatusAccepted || loc == "" {
			t.Fatalf("request %d: %d %q, want 202 and a Location", i, resp.StatusCode, loc)
		}
		id := loc[strings.LastIndexByte(loc, '/')+1 : strings.IndexByte(loc, '.')]
		locs, ids, keys = append(locs, loc), append(ids, id), append(keys, "edge/orders/"+id)
	}
	metrics := func() string { _, _, m := proxyGet(t, "http://"+admin+"/metrics"); return m }
	redistest.WaitFor(t, 30*time.Second, "the 3 dead-lettered", func() bool {
		m := metrics()
		return sampleValue(t, m, `floodgate_defer_queue_length{queue="edge/orders"}`) == 0 &&
			sampleValue(t, m, `floodgate_defer_dead_letters{queue="edge/orders"}`) == 2
	})
	for i, k := range keys {
		if failed, served, _ := up.counts(k); failed != 2 || served != 0 {
			t.Errorf("request %d: %d failed deliveries, %d served; want exactly 2 failed (--defer-max-deliveries 2)", i+1, failed, served)
		}
		if st, _, body := proxyGet(t, base+locs[i]); st != http.StatusBadGateway || !strings.Contains(body, "2 attempts") {
			t.Errorf("poll %d of a dead letter: %d %q, want 502 naming 2 attempts", i+1, st, body)
		}
	}

	// --defer-poll-concurrency 1: Redis paused, one poll waits on it and
	// the others are 503 at once
	rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if err := rc.Do(context.Background(), rc.B().ClientPause().Timeout(3000).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	codes := make(chan int, 4)
	start := time.Now()
	for range 4 {
		wg.Go(func() {
			resp, err := http.Get(base + locs[2])
			if err != nil {
				codes <- -1
				return
			}
			resp.Body.Close()
			if resp.StatusCode == http.StatusServiceUnavailable && time.Since(start) > 2500*time.Millisecond {
				codes <- -503 // not at once: it waited for Redis
				return
			}
			codes <- resp.StatusCode
		})
	}
	wg.Wait()
	close(codes)
	got := map[int]int{}
	for c := range codes {
		got[c]++
	}
	if got[http.StatusServiceUnavailable] != 3 || got[http.StatusBadGateway] != 1 {
		t.Errorf("4 polls at once, Redis paused, --defer-poll-concurrency 1: %v; want 3 × 503 at once, 1 × 502", got)
	}

	// the CLI lists the 2 kept: the oldest was dropped
	code, out, errs := cli(t, "deadletters", "list", "--admin", admin, "--token", adminTestToken, "--json")
	var ans deadLettersAnswer
	if code != 0 || json.Unmarshal([]byte(out), &ans) != nil {
		t.Fatalf("deadletters list: exit %d %s %s", code, out, errs)
	}
	if len(ans.Queues) != 1 || ans.Queues[0].Queue != "edge/orders" || ans.Queues[0].Dead != 2 || len(ans.Queues[0].Letters) != 2 ||
		ans.Queues[0].Letters[0].ID != ids[1] || ans.Queues[0].Letters[1].ID != ids[2] ||
		ans.Queues[0].Letters[0].Method != "POST" || ans.Queues[0].Letters[0].URL != "/orders/x" {
		t.Errorf("deadletters list: %+v; want %s and %s", ans, ids[1], ids[2])
	}
	if code, out, _ := cli(t, "deadletters", "list", "--admin", admin, "--token", adminTestToken); code != 0 || !strings.Contains(out, ids[2]) || !strings.Contains(out, "edge/orders: 2 dead letters") {
		t.Errorf("deadletters list (table): exit %d\n%s", code, out)
	}

	// without the token: refused, nothing moved
	if code, _, errs := cli(t, "deadletters", "list", "--admin", admin); code != exitAuth {
		t.Errorf("deadletters list without a token: exit %d %q, want %d", code, errs, exitAuth)
	}
	if code, _, _ := cli(t, "deadletters", "requeue", "--queue", "edge/orders", ids[1], "--admin", admin, "--token", "0123456789abcdef0123456789abcdeX"); code != exitAuth {
		t.Errorf("deadletters requeue with a wrong token: exit %d, want %d", code, exitAuth)
	}
	requeue := func(id, token string) int {
		req, _ := http.NewRequest("POST", "http://"+admin+"/v1/deadletters/requeue", strings.NewReader(`{"queue":"edge/orders","id":"`+id+`"}`))
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
			return -1
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if st := requeue(ids[1], ""); st != http.StatusUnauthorized {
		t.Errorf("requeue without a token: %d, want 401", st)
	}
	if n := sampleValue(t, metrics(), `floodgate_defer_dead_letters{queue="edge/orders"}`); n != 2 {
		t.Errorf("dead letters after the refused calls: %v, want 2", n)
	}

	// unknown queue, unknown id, the dropped one: 404, exit 3
	for _, c := range []struct{ queue, id, want string }{
		{"edge/nope", ids[1], `no deferred queue named "edge/nope"`},
		{"edge/orders", "1-1", `no dead letter "1-1"`},
		{"edge/orders", ids[0], "no dead letter"},
	} {
		code, _, errs := cli(t, "deadletters", "requeue", "--queue", c.queue, c.id, "--admin", admin, "--token", adminTestToken)
		if code != exitNotFound || !strings.Contains(errs, c.want) {
			t.Errorf("requeue %s %s: exit %d %q; want %d saying %q", c.queue, c.id, code, errs, exitNotFound, c.want)
		}
	}
	if code, _, _ := cli(t, "deadletters", "requeue", "--queue", "edge/orders", "--admin", admin, "--token", adminTestToken); code != exitUsage {
		t.Errorf("requeue with neither ID nor --all: exit %d, want %d", code, exitUsage)
	}

	// healed: requeued by the CLI, delivered once as it was first queued
	up.fail.Store(false)
	code, out, errs = cli(t, "deadletters", "requeue", "--queue", "edge/orders", ids[1], "--admin", admin, "--token", adminTestToken)
	if code != 0 || !strings.Contains(out, "requeued edge/orders "+ids[1]) {
		t.Fatalf("deadletters requeue: exit %d %q %q", code, out, errs)
	}
	delivered := func(i int) {
		t.Helper()
		redistest.WaitFor(t, 30*time.Second, fmt.Sprint("request ", i+1, " delivered"), func() bool {
			st, _, _ := proxyGet(t, base+locs[i])
			return st == http.StatusCreated
		})
		if _, _, body := proxyGet(t, base+locs[i]); body != fmt.Sprint("done b", i+1) {
			t.Errorf("poll %d after the requeue: %q", i+1, body)
		}
	}
	delivered(1)

	// two requeues of one id at once: one moves it
	sts := make(chan int, 2)
	for range 2 {
		wg.Go(func() { sts <- requeue(ids[2], adminTestToken) })
	}
	wg.Wait()
	close(sts)
	got = map[int]int{}
	for st := range sts {
		got[st]++
	}
	if got[http.StatusOK] != 1 || got[http.StatusNotFound] != 1 {
		t.Errorf("two requeues of one id at once: %v; want one 200 and one 404", got)
	}
	delivered(2)
	redistest.WaitFor(t, 30*time.Second, "the queue empty", func() bool {
		m := metrics()
		return sampleValue(t, m, `floodgate_defer_queue_length{queue="edge/orders"}`) == 0 &&
			sampleValue(t, m, `floodgate_defer_dead_letters{queue="edge/orders"}`) == 0
	})
	for _, i := range []int{1, 2} {
		if failed, served, hdr := up.counts(keys[i]); failed != 2 || served != 1 || hdr != fmt.Sprint("hdr-b", i+1) {
			t.Errorf("request %d: %d failed, %d served, X-Test %q; want 2, then 1 with its header", i+1, failed, served, hdr)
		}
	}
	if code, out, _ := cli(t, "deadletters", "requeue", "--queue", "edge/orders", "--all", "--admin", admin, "--token", adminTestToken); code != 0 || !strings.Contains(out, "requeued 0 dead letters") {
		t.Errorf("requeue --all with none: exit %d %q", code, out)
	}
}

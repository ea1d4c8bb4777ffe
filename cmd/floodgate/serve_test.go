package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/floodgate/floodgate/internal/redistest"
	"github.com/floodgate/floodgate/internal/testproc"
)

var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "floodgate-bin")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "floodgate")
	args := []string{"build", "-race", "-o", binary, "."}
	if os.Getenv("FLOODGATE_TEST_NORACE") == "1" { // a measurement's (bench/flood.sh), not CI's
		args = append(args[:1], args[2:]...)
	}
	if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building floodgate: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// server is one running `floodgate serve`.
type server struct {
	cmd               *exec.Cmd
	grpc, http, admin string
	conn              *grpc.ClientConn
	client            rlsv3.RateLimitServiceClient
	logMu             sync.Mutex
	log               bytes.Buffer
	done              chan struct{}
	exit              error
	addrs             map[string]string // by API, as logged
}

func startServer(t *testing.T, args ...string) *server {
	t.Helper()
	s := startServerNoClient(t, args...)
	var err error
	s.conn, err = grpc.NewClient(s.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	s.client = rlsv3.NewRateLimitServiceClient(s.conn)
	return s
}

// startServerNoClient starts `floodgate serve` and learns its addresses.
func startServerNoClient(t *testing.T, args ...string) *server {
	t.Helper()
	args = append([]string{"serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
		"--admin-addr", "127.0.0.1:0", "--log-format", "json", "--reload-interval", "100ms"}, args...)
	s := startBinary(t, args, "grpc", "http", "admin")
	s.grpc, s.http, s.admin = s.addrs["grpc"], s.addrs["http"], s.addrs["admin"]
	return s
}

// startBinary runs the floodgate binary with args (which must ask for JSON
// logs) until it has logged a listening address for each of apis.
func startBinary(t *testing.T, args []string, apis ...string) *server {
	t.Helper()
	s := &server{cmd: exec.Command(binary, args...), done: make(chan struct{}), addrs: map[string]string{}}
	stderr, err := s.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	// dies with the test binary, however that ends (see testproc)
	proc, err := testproc.Start(s.cmd)
	if err != nil {
		t.Fatal(err)
	}
	addrs := make(chan [2]string, len(apis))
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Bytes()
			s.logMu.Lock()
			s.log.Write(line)
			s.log.WriteByte('\n')
			s.logMu.Unlock()
			var m struct{ Msg, API, Addr string }
			if json.Unmarshal(line, &m) == nil && m.Msg == "listening" {
				select {
				case addrs <- [2]string{m.API, m.Addr}:
				default:
				}
			}
		}
	}()
	go func() { s.exit = proc.Wait(); close(s.done) }()
	timeout := time.After(60 * time.Second)
	for len(s.addrs) < len(apis) {
		select {
		case a := <-addrs:
			s.addrs[a[0]] = a[1]
		case <-s.done:
			t.Fatalf("floodgate %s exited: %v\n%s", args[0], s.exit, s.logs())
		case <-timeout:
			t.Fatalf("floodgate %s did not listen in time\n%s", args[0], s.logs())
		}
	}
	t.Cleanup(func() { s.stop(t) })
	return s
}

func (s *server) logs() string {
	s.logMu.Lock()
	defer s.logMu.Unlock()
	return s.log.String()
}

// stop sends SIGTERM and waits: the server drains and exits 0.
func (s *server) stop(t *testing.T) {
	select {
	case <-s.done:
		return
	default:
	}
	if s.conn != nil {
		s.conn.Close()
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
		if s.exit != nil {
			t.Errorf("floodgate serve exited with %v after SIGTERM\n%s", s.exit, s.logs())
		}
	case <-time.After(20 * time.Second):
		s.cmd.Process.Kill()
		t.Errorf("floodgate serve did not stop on SIGTERM\n%s", s.logs())
	}
}

func desc(kv ...string) *rlcommon.RateLimitDescriptor {
	d := &rlcommon.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func (s *server) ask(t *testing.T, domain string, ds ...*rlcommon.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := s.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds})
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	return resp
}

func writeRules(t *testing.T, dir, name, body string) {
	t.Helper()
	tmp := filepath.Join(dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		t.Fatal(err)
	}
}

const apiRules = `domain: api
descriptors:
  - key: user
    rate_limit:
      unit: hour
      requests_per_unit: 50
  - key: path
    value: /health
    rate_limit:
      unlimited: true
  - key: remote_address
    descriptors:
      - key: path
        value: /login
        rate_limit:
          name: login
          unit: hour
          requests_per_unit: 3
  - key: shadow
    shadow_mode: true
    rate_limit:
      unit: hour
      requests_per_unit: 1
`

func TestServeExactUnderConcurrency(t *testing.T) {
	dir := t.TempDir()
	writeRules(t, dir, "api.yaml", apiRules)
	s := startServer(t, "--rules", dir, "--data", t.TempDir())
	clearOfWindowEnd(t, time.Hour, 30*time.Second) // the user limit: 50 an hour, a fixed window
	var ok, over atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10 {
				resp := s.ask(t, "api", desc("user", "alice"))
				if resp.OverallCode == rlsv3.RateLimitResponse_OK {
					ok.Add(1)
				} else {
					over.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if ok.Load() != 50 || over.Load() != 110 {
		t.Fatalf("admitted %d, denied %d; want exactly 50 and 110", ok.Load(), over.Load())
	}
	resp := s.ask(t, "api", desc("user", "bob"))
	st := resp.Statuses[0]
	if st.CurrentLimit.GetRequestsPerUnit() != 50 || st.CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_HOUR || st.LimitRemaining != 49 {
		t.Fatalf("status %v", st)
	}
	var names []string
	for _, h := range resp.ResponseHeadersToAdd {
		names = append(names, h.Key+": "+h.Value)
	}
	joined := strings.Join(names, "\n")
	if !strings.Contains(joined, "RateLimit-Policy: ") || !strings.Contains(joined, ";q=50;w=3600") || !strings.Contains(joined, "RateLimit: ") || !strings.Contains(joined, ";r=49;") {
		t.Fatalf("headers:\n%s", joined)
	}
}

func TestServeEnvoySemantics(t *testing.T) {
	dir := t.TempDir()
	writeRules(t, dir, "api.yaml", apiRules)
	s := startServer(t, "--rules", dir, "--data", t.TempDir())
	clearOfWindowEnd(t, time.Hour, 30*time.Second)
	for range 5 { // unlimited
		if r := s.ask(t, "api", desc("path", "/health")); r.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("unlimited path limited: %v", r)
		}
	}
	for i := range 5 { // nested: remote_address then path; depth must match
		r := s.ask(t, "api", desc("remote_address", "10.0.0.1", "path", "/login"))
		if want := i < 3; (r.OverallCode == rlsv3.RateLimitResponse_OK) != want {
			t.Fatalf("login attempt %d: %v", i, r.OverallCode)
		}
		if i == 0 && r.Statuses[0].CurrentLimit.GetName() != "login" {
			t.Fatalf("current_limit.name = %q, want the rule's name", r.Statuses[0].CurrentLimit.GetName())
		}
	}
	if r := s.ask(t, "api", desc("remote_address", "10.0.0.1")); r.Statuses[0].CurrentLimit != nil {
		t.Fatalf("a shallower descriptor must not match the nested limit: %v", r)
	}
	for range 3 { // shadow mode never blocks
		if r := s.ask(t, "api", desc("shadow", "x")); r.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("shadow mode blocked: %v", r)
		}
	}
	// Each descriptor counts on its own even when another is over.
	for range 3 {
		s.ask(t, "api", desc("user", "carol"), desc("remote_address", "10.0.0.9", "path", "/login"))
	}
	r := s.ask(t, "api", desc("user", "carol"), desc("remote_address", "10.0.0.9", "path", "/login"))
	if r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || r.Statuses[0].Code != rlsv3.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != 46 {
		t.Fatalf("per-descriptor counting: %v", r)
	}
}

func TestServeBadRequests(t *testing.T) {
	dir := t.TempDir()
	writeRules(t, dir, "api.yaml", apiRules)
	s := startServer(t, "--rules", dir, "--data", t.TempDir())
	ctx := context.Background()
	huge := make([]*rlcommon.RateLimitDescriptor, 10_000)
	for i := range huge {
		huge[i] = desc("user", "x")
	}
	for name, req := range map[string]*rlsv3.RateLimitRequest{
		"empty domain":   {Descriptors: []*rlcommon.RateLimitDescriptor{desc("user", "a")}},
		"no descriptors": {Domain: "api"},
		"huge list":      {Domain: "api", Descriptors: huge},
	} {
		_, err := s.client.ShouldRateLimit(ctx, req)
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: err %v, want InvalidArgument", name, err)
		}
	}
	// Still alive, still right.
	if r := s.ask(t, "api", desc("user", "dave")); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("after bad requests: %v", r)
	}
	// What a client's request controls is not an error (Envoy would fail
	// open on one): an empty descriptor (a missing header with
	// skip_if_absent) matches nothing; a 64 KiB value is limited.
	if r := s.ask(t, "api", &rlcommon.RateLimitDescriptor{}, desc("user", "dave")); r.OverallCode != rlsv3.RateLimitResponse_OK ||
		len(r.Statuses) != 2 || r.Statuses[0].CurrentLimit != nil || r.Statuses[1].LimitRemaining != 48 {
		t.Fatalf("an empty descriptor beside dave's: %v", r)
	}
	if r := s.ask(t, "api", desc("user", strings.Repeat("x", 64<<10))); r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != 49 {
		t.Fatalf("a 64 KiB value: %v", r)
	}
	// huge hits (Envoy's hits_addend can come from a header) are over the
	// limit, and consume nothing
	resp, err := s.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "api", HitsAddend: 4_000_000_000, Descriptors: []*rlcommon.RateLimitDescriptor{desc("user", "huge")}})
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 50 {
		t.Fatalf("hits_addend 4,000,000,000: %v, %v; want OVER_LIMIT", resp, err)
	}
	if r := s.ask(t, "api", desc("user", "huge")); r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != 49 {
		t.Fatalf("after a refused huge request: %v; want nothing consumed", r)
	}
	// HTTP: /json answers 200 or 429 with the same JSON; junk gets 400.
	post := func(body string) int {
		resp, err := http.Post("http://"+s.http+"/json", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	if c := post(`{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"erin"}]}]}`); c != 200 {
		t.Fatalf("/json: %d", c)
	}
	if c := post(`{"domain":`); c != 400 {
		t.Fatalf("/json with junk: %d, want 400", c)
	}
	for _, p := range []string{"/healthz", "/readyz", "/metrics"} {
		resp, err := http.Get("http://" + s.http + p)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("GET %s: %v %v", p, resp, err)
		}
		resp.Body.Close()
	}
}

// With --reload-interval 0 the files are not polled: SIGHUP alone
// reloads them.
func TestServeReloadAndRefusedFile(t *testing.T) {
	dir := t.TempDir()
	writeRules(t, dir, "api.yaml", apiRules)
	s := startServer(t, "--rules", dir, "--data", t.TempDir(), "--reload-interval", "0")
	if r := s.ask(t, "api", desc("user", "frank")); r.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 50 {
		t.Fatalf("before reload: %v", r)
	}
	writeRules(t, dir, "api.yaml", strings.Replace(apiRules, "requests_per_unit: 50", "requests_per_unit: 7", 1))
	s.cmd.Process.Signal(syscall.SIGHUP)
	waitFor(t, "the new limit", func() bool {
		return s.ask(t, "api", desc("user", "frank")).Statuses[0].CurrentLimit.GetRequestsPerUnit() == 7
	})
	// A broken file is refused; the old rules keep working.
	writeRules(t, dir, "api.yaml", strings.Replace(apiRules, "unit: hour", "unit: fortnight", 1))
	s.cmd.Process.Signal(syscall.SIGHUP)
	waitFor(t, "the refusal in the log", func() bool { return strings.Contains(s.logs(), "rules file refused") })
	if r := s.ask(t, "api", desc("user", "frank")); r.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 7 {
		t.Fatalf("after a broken file: %v", r)
	}
	if !strings.Contains(s.logs(), "fortnight") {
		t.Fatalf("the refusal does not say what was wrong:\n%s", s.logs())
	}
}

func TestServeOverridesSurviveRestartAndAdminToken(t *testing.T) {
	dir, data := t.TempDir(), t.TempDir()
	writeRules(t, dir, "api.yaml", apiRules)
	s := startServer(t, "--rules", dir, "--data", data, "--admin-token", "s3cret")
	put := func(token string) int {
		req, _ := http.NewRequest("PUT", "http://"+s.admin+"/v1/overrides/api/"+overrideKey(t, s), strings.NewReader(`{"limit":2,"period":"1h"}`))
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if c := put(""); c != http.StatusUnauthorized {
		t.Fatalf("admin without token: %d, want 401", c)
	}
	if c := put("wrong"); c != http.StatusUnauthorized {
		t.Fatalf("admin with a wrong token: %d, want 401", c)
	}
	if c := put("s3cret"); c != http.StatusOK {
		t.Fatalf("admin with the token: %d", c)
	}
	check := func(s *server) {
		t.Helper()
		waitFor(t, "the override", func() bool {
			return s.ask(t, "api", desc("user", "241531")).Statuses[0].CurrentLimit.GetRequestsPerUnit() == 2
		})
	}
	check(s)
	s.stop(t)
	s2 := startServer(t, "--rules", dir, "--data", data, "--admin-token", "s3cret")
	check(s2)
}

// overrideKey asks the admin API what key the service uses for user=241531.
func overrideKey(t *testing.T, s *server) string {
	req, _ := http.NewRequest("POST", "http://"+s.admin+"/v1/keys/inspect", strings.NewReader(`{"domain":"api","entries":[{"key":"user","value":"241531"}]}`))
	req.Header.Set("Authorization", "Bearer s3cret")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct{ Key string }
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || out.Key == "" {
		t.Fatalf("inspect: %v %+v", err, out)
	}
	return out.Key
}

// Two instances on one Redis admit exactly the limit between them.
func TestServeTwoInstancesShareRedis(t *testing.T) {
	srv := redistest.Standalone(t)
	dir := t.TempDir()
	writeRules(t, dir, "api.yaml", apiRules)
	// the store's timeout is not the subject: generous, or a starved host
	// times calls out and the rule's failure mode (open) admits them
	a := startServer(t, "--rules", dir, "--data", t.TempDir(), "--store", "redis://"+srv.Addr, "--store-timeout", "10s")
	b := startServer(t, "--rules", dir, "--data", t.TempDir(), "--store", "redis://"+srv.Addr, "--store-timeout", "10s")
	clearOfWindowEnd(t, time.Hour, 30*time.Second)
	var ok atomic.Int64
	var wg sync.WaitGroup
	for _, s := range []*server{a, b} {
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 10 {
					if s.ask(t, "api", desc("user", "shared")).OverallCode == rlsv3.RateLimitResponse_OK {
						ok.Add(1)
					}
				}
			}()
		}
	}
	wg.Wait()
	if ok.Load() != 50 {
		t.Fatalf("two instances admitted %d in all, want exactly the limit of 50", ok.Load())
	}
}

func TestServeStartsWithNoFlags(t *testing.T) {
	work := t.TempDir()
	cmd := exec.Command(binary, "serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0")
	cmd.Dir = work
	var out syncBuffer
	cmd.Stderr = &out
	proc, err := testproc.Start(cmd)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "serving", func() bool { return strings.Contains(out.String(), "floodgate serving") })
	cmd.Process.Signal(syscall.SIGTERM)
	if err := proc.Wait(); err != nil {
		t.Fatalf("exit %v\n%s", err, out.String())
	}
}

// clearOfWindowEnd returns once at least need remains before the end of
// the current fixed window of length w (windows align to the Unix epoch):
// a test counting exactly in a fixed window must not see it reset midway.
// Near the end it waits for the next window to begin.
func clearOfWindowEnd(t *testing.T, w, need time.Duration) {
	t.Helper()
	now := time.Now()
	if left := now.Truncate(w).Add(w).Sub(now); left < need {
		t.Logf("%v before a %v window ends: waiting for the next one", left, w)
		time.Sleep(left + 10*time.Millisecond)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// With its Redis down the service still answers every call in time, by the
// rules' failure modes, and /readyz says it is degraded; it recovers when
// Redis returns.
func TestServeRedisDownDegradesAndRecovers(t *testing.T) {
	srv := redistest.Standalone(t)
	dir := t.TempDir()
	writeRules(t, dir, "api.yaml", apiRules)
	starve := redistest.WatchStarvation(t)
	s := startServer(t, "--rules", dir, "--data", t.TempDir(), "--store", "redis://"+srv.Addr)
	ready := func() (int, string) { return readyz(t, s.http) }
	// readiness's first sample is taken as it is: a PING that a starved
	// host answers late keeps it unready for --ready-after (5 s)
	waitFor(t, "readyz before Redis is killed", func() bool { code, _ := ready(); return code == 200 })
	srv.Kill()
	waitFor(t, "readyz to report the store", func() bool {
		start := time.Now()
		r := s.ask(t, "api", desc("user", "down")) // fail open by default
		// a second, and the few wake-ups of a call (the client's, the
		// server's, the store's) as late as this host makes them
		if el, most := time.Since(start), starve.Allow(time.Second, 4); el > most || r.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("while Redis is down: %v after %s (at most %s)", r.OverallCode, el, most)
		}
		code, body := ready()
		// the store's counters say so too, once the breaker opens
		return code == http.StatusServiceUnavailable && strings.Contains(body, "degraded") &&
			metricValue(t, s.http, "floodgate_store_breaker_open") == 1
	})
	for _, name := range []string{"floodgate_store_errors_total", "floodgate_store_degraded_decisions_total", "floodgate_store_calls_total"} {
		if v := metricValue(t, s.http, name); v < 1 {
			t.Fatalf("%s %v after failed calls", name, v)
		}
	}
	srv.Restart(t)
	waitFor(t, "readyz to recover", func() bool {
		s.ask(t, "api", desc("user", "up"))
		code, _ := ready()
		return code == 200
	})
}

// metricValue reads one series (a name, with its labels if it has any,
// as /metrics writes them) from the server's /metrics.
func metricValue(t *testing.T, addr, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return f
		}
	}
	t.Fatalf("no %s in /metrics", name)
	return 0
}

// A silent Redis (paused: it takes the call and never answers) does not
// run a caller past its deadline: the store gives up on Redis before the
// caller's deadline, early enough for the rules' failure modes to answer
// (as Envoy needs, which gives its calls 20ms), though --store-timeout is
// far longer.
func TestServeSilentRedisAnswersWithinCallerDeadline(t *testing.T) {
	srv := redistest.Standalone(t)
	dir := t.TempDir()
	writeRules(t, dir, "api.yaml", `domain: api
descriptors:
  - key: open
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: closed
    rate_limit: {unit: hour, requests_per_unit: 5, failure_mode: closed}
`)
	s := startServer(t, "--rules", dir, "--data", t.TempDir(), "--store", "redis://"+srv.Addr, "--store-timeout", "10s")
	s.ask(t, "api", desc("open", "warm")) // connected, library loaded
	// an override in the domain: the first call's key is looked up too
	req, _ := http.NewRequest("POST", "http://"+s.admin+"/v1/keys/inspect", strings.NewReader(`{"domain":"api","entries":[{"key":"open","value":"other"}]}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var out struct{ Key string }
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || out.Key == "" {
		t.Fatalf("inspect: %v %+v", err, out)
	}
	resp.Body.Close()
	req, _ = http.NewRequest("PUT", "http://"+s.admin+"/v1/overrides/api/"+out.Key, strings.NewReader(`{"limit":2,"period":"1h"}`))
	if resp, err = http.DefaultClient.Do(req); err != nil || resp.StatusCode/100 != 2 {
		t.Fatalf("put override: %v %v", resp, err)
	}
	resp.Body.Close()
	srv.Pause()
	defer srv.Resume()
	for _, tc := range []struct {
		key  string
		want rlsv3.RateLimitResponse_Code
	}{{"open", rlsv3.RateLimitResponse_OK}, {"closed", rlsv3.RateLimitResponse_OVER_LIMIT}} {
		// 2s: the override lookup gives up half-way, and the store a
		// fifth of the rest (200ms) before the deadline, room enough on a
		// loaded machine (of Envoy's 20ms: 10ms, and 2ms before)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		start := time.Now()
		rr, err := s.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlcommon.RateLimitDescriptor{desc(tc.key, "x")}})
		cancel()
		if err != nil || rr.GetOverallCode() != tc.want {
			t.Fatalf("%s, Redis silent: %v, %v after %v; want %v by the failure mode within the deadline\n%s", tc.key, rr.GetOverallCode(), err, time.Since(start), tc.want, s.logs())
		}
	}
}

// A negative duration flag is refused with the flag's name, before
// anything starts.
func TestServeRefusesNegativeDurations(t *testing.T) {
	for _, f := range []string{"--reload-interval", "--drain-timeout", "--store-timeout"} {
		var out, errb bytes.Buffer
		code := run([]string{"serve", "--data", t.TempDir(), "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
			"--admin-addr", "127.0.0.1:0", f, "-1s"}, &out, &errb)
		if code == 0 || !strings.Contains(errb.String(), f+" -1s") {
			t.Errorf("%s -1s: exit %d\n%s", f, code, errb.String())
		}
	}
}

// A FLOODGATE_* variable that does not parse is an error naming it, as the
// flag's value would be (it used to be passed over for the default).
func TestServeRefusesBadEnvironment(t *testing.T) {
	for name, v := range map[string]string{"FLOODGATE_DRAIN_TIMEOUT": "bogus", "FLOODGATE_X_RATELIMIT_HEADERS": "yes"} {
		t.Run(name, func(t *testing.T) {
			t.Setenv(name, v)
			var out, errb bytes.Buffer
			code := run([]string{"serve", "--data", t.TempDir(), "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
				"--admin-addr", "127.0.0.1:0"}, &out, &errb)
			if code == 0 || !strings.Contains(errb.String(), name+"=") {
				t.Errorf("exit %d\n%s", code, errb.String())
			}
		})
	}
}

// An idle instance whose Redis is gone says so in /readyz: no decision
// has failed yet, so /readyz asks Redis itself (at once in its answer,
// and unready after --unready-after: the hysteresis).
func TestServeReadyzIdleRedisDown(t *testing.T) {
	srv := redistest.Standalone(t)
	dir := t.TempDir()
	writeRules(t, dir, "api.yaml", apiRules)
	s := startServer(t, "--rules", dir, "--data", t.TempDir(), "--store", "redis://"+srv.Addr, "--unready-after", "500ms")
	ready := func() (int, string) { return readyz(t, s.http) }
	if code, body := ready(); code != 200 {
		t.Fatalf("readyz with Redis up: %d %s", code, body)
	}
	srv.Kill()
	if code, body := ready(); !strings.Contains(body, "PING") {
		t.Fatalf("readyz of an idle instance with Redis down: %d %s", code, body)
	}
	waitFor(t, "readyz to turn unready", func() bool {
		code, body := ready()
		return code == http.StatusServiceUnavailable && strings.Contains(body, "PING")
	})
	srv.Restart(t)
	waitFor(t, "readyz to recover", func() bool { code, _ := ready(); return code == 200 })
}

// readyz returns the status and body of GET /readyz at addr.
func readyz(t *testing.T, addr string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

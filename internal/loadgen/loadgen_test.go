package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"

	"github.com/floodgate/floodgate/internal/testproc"
)

// syncBuffer is a bytes.Buffer safe for a writer and a reader goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func listen(t *testing.T) net.Listener {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return lis
}

func startEmpty(t *testing.T) string {
	lis := listen(t)
	s := EmptyServer(lis)
	t.Cleanup(s.Stop)
	return lis.Addr().String()
}

func startHandler(t *testing.T, h rlsv3.RateLimitServiceServer) string {
	lis := listen(t)
	s := serveHandler(lis, h)
	t.Cleanup(s.Stop)
	return lis.Addr().String()
}

// starvedTimeout is the per-request timeout of the open-loop tests: a
// request's timeout is also how long after the run the backlog may take
// to clear, and on a starved host (CI on 2 shared cores) a backlog of
// 1000 requests at 16 in flight took longer than the default 5 s. The
// tests check what was sent and measured, not how fast the host is.
const starvedTimeout = time.Minute

// checkSane checks the counts and percentiles of a result of a clean run
// whose requests had timeout (0: the default, 5 s).
func checkSane(t *testing.T, res *Result, timeout time.Duration) {
	t.Helper()
	if res.Requests == 0 || res.OK != res.Requests || res.Errors != 0 || res.OverLimit != 0 || res.Unknown != 0 {
		t.Fatalf("counts: requests %d ok %d over %d unknown %d errors %d %v",
			res.Requests, res.OK, res.OverLimit, res.Unknown, res.Errors, res.ErrorCodes)
	}
	h := res.LatencyHist
	if h.Count() != res.Requests {
		t.Fatalf("histogram holds %d latencies for %d requests", h.Count(), res.Requests)
	}
	l := res.Latency
	if !(0 < l.Min && l.Min <= l.P50 && l.P50 <= l.P90 && l.P90 <= l.P99 && l.P99 <= l.P999 && l.P999 <= l.Max) {
		t.Fatalf("percentiles out of order: %+v", l)
	}
	if l.Min > l.Mean || l.Mean > l.Max {
		t.Fatalf("mean outside [min, max]: %+v", l)
	}
	// a loopback round trip takes more than 5 µs; nothing can take longer
	// than the run and the timeout, even on a starved machine
	if timeout == 0 {
		timeout = 5 * time.Second
	}
	if l.P50 < 5 || l.Max > (res.WarmupSeconds+res.DurationSeconds+timeout.Seconds())*1e6 {
		t.Fatalf("implausible latencies: %+v", l)
	}
	if want := float64(res.Requests) / res.DurationSeconds; res.RPS < want*0.999 || res.RPS > want*1.001 {
		t.Fatalf("rps %v, want %v", res.RPS, want)
	}
}

func TestClosedLoopEmpty(t *testing.T) {
	addr := startEmpty(t)
	progress := &syncBuffer{}
	res, err := Run(context.Background(), Config{
		Addr: addr, Concurrency: 8, Conns: 2, Duration: time.Second, Warmup: 200 * time.Millisecond,
		CPUPid: os.Getpid(), Progress: progress,
	})
	if err != nil {
		t.Fatal(err)
	}
	checkSane(t, res, 0)
	if res.Mode != "closed" || res.Concurrency != 8 || res.Open != nil {
		t.Fatalf("mode %q concurrency %d open %v", res.Mode, res.Concurrency, res.Open)
	}
	if res.DurationSeconds != 1 {
		t.Fatalf("measured %vs, want 1", res.DurationSeconds)
	}
	// in-process server: its CPU includes the client's, so just check it is there
	if res.ServerCPU == nil || res.ServerCPU.PID != os.Getpid() || res.ServerCPU.Seconds <= 0 || res.ServerCPU.USPerDecision <= 0 {
		t.Fatalf("server cpu %+v", res.ServerCPU)
	}
	if res.StoreCPU != nil {
		t.Fatalf("store cpu %+v without --store-pid", res.StoreCPU)
	}
	if res.ClientCPU == nil || res.ClientCPU.Seconds <= 0 {
		t.Fatalf("client cpu %+v", res.ClientCPU)
	}
	if !strings.Contains(progress.String(), "req/s") {
		t.Fatalf("no progress line: %q", progress.String())
	}
	var text bytes.Buffer
	if err := res.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"closed loop, 8 callers on 2 connections", "requests ", "p99.9 ", "server cpu ", "µs/decision"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, text.String())
		}
	}
	t.Logf("\n%s", text.String())
}

// --store-pid reports another process's CPU beside the server's: here a
// shell spinning in a loop, which uses what CPU it is given whatever the
// requests do (about a core on an idle host, a few hundredths on a starved
// one); a process that is not there fails the run before it starts.
func TestStorePid(t *testing.T) {
	addr := startEmpty(t)
	busy, err := testproc.Start(exec.Command("sh", "-c", "while :; do :; done"))
	if err != nil {
		t.Fatal(err)
	}
	pid := busy.Cmd.Process.Pid
	t.Cleanup(func() { busy.Cmd.Process.Kill(); busy.Wait() })
	before, err := procCPU(pid)
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(context.Background(), Config{
		Addr: addr, Concurrency: 2, Duration: time.Second, Warmup: 50 * time.Millisecond,
		CPUPid: os.Getpid(), StorePid: pid,
	})
	if err != nil {
		t.Fatal(err)
	}
	after, err := procCPU(pid)
	if err != nil {
		t.Fatal(err)
	}
	// the shell's CPU over the measured phase: some, at most what it used
	// over the whole run, per the phase's wall time
	c := res.StoreCPU
	if c == nil || c.PID != pid || c.Seconds <= 0 || c.Seconds > (after-before).Seconds()+1e-9 || c.USPerDecision <= 0 {
		t.Fatalf("store cpu %+v; the shell used %v over the run", c, after-before)
	}
	if want := c.Seconds / res.DurationSeconds; c.Cores < want*0.999 || c.Cores > want*1.001 {
		t.Fatalf("store cpu %+v: %v cores, want %v s over %v s", c, c.Cores, c.Seconds, res.DurationSeconds)
	}
	var b strings.Builder
	if err := res.WriteText(&b); err != nil || !strings.Contains(b.String(), fmt.Sprintf("store cpu    pid %d:", pid)) {
		t.Fatalf("report (%v):\n%s", err, b.String())
	}
	_, err = Run(context.Background(), Config{Addr: addr, Concurrency: 1, Duration: time.Second, StorePid: 1 << 30})
	if err == nil || !strings.Contains(err.Error(), "--store-pid") {
		t.Fatalf("missing store pid: %v", err)
	}
}

func TestOpenLoopEmpty(t *testing.T) {
	addr := startEmpty(t)
	res, err := Run(context.Background(), Config{
		Addr: addr, Rate: 500, Duration: time.Second, Warmup: 200 * time.Millisecond, Timeout: starvedTimeout,
	})
	if err != nil {
		t.Fatal(err)
	}
	checkSane(t, res, starvedTimeout)
	o := res.Open
	if res.Mode != "open" || o == nil {
		t.Fatalf("mode %q open %v", res.Mode, o)
	}
	// due at t0 + i*2ms: i = 100..599 fall in [200ms, 1200ms)
	if o.Intended != 500 || o.Sent != 500 || o.Unsent != 0 || res.Requests != 500 {
		t.Fatalf("intended %d sent %d unsent %d requests %d, want 500 500 0 500", o.Intended, o.Sent, o.Unsent, res.Requests)
	}
	if o.Late > o.Sent || res.SendLagHist.Count() != o.Sent {
		t.Fatalf("late %d of %d, %d send lags", o.Late, o.Sent, res.SendLagHist.Count())
	}
	// a worker is started only for a request no idle one could take: at
	// most one per request, 600 in warmup and window (a starved host
	// started 554)
	if o.PeakInFlight < 1 || o.Workers < 1 || o.Workers > 600 {
		t.Fatalf("peak %d workers %d", o.PeakInFlight, o.Workers)
	}
	var text bytes.Buffer
	res.WriteText(&text)
	t.Logf("\n%s", text.String())
}

// stallServer stalls the whole service once for stall: the request with
// sequence number stallAt holds a lock that every request takes.
type stallServer struct {
	rlsv3.UnimplementedRateLimitServiceServer
	mu      sync.Mutex
	n       atomic.Int64
	stallAt int64
	stall   time.Duration
}

func (s *stallServer) ShouldRateLimit(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	s.mu.Lock()
	if s.n.Add(1) == s.stallAt {
		time.Sleep(s.stall)
	}
	s.mu.Unlock()
	return okResponse, nil
}

// A 200 ms stall of the server in the middle of an open-loop run at
// 1000/s: every request due during the stall waits for its end, so about a
// fifth of the requests have latencies spread over 0..200 ms measured from
// their intended send times: p99 is near 200 ms and max is the stall. With
// only 16 requests allowed in flight, most requests due during the stall
// cannot even be sent (they go out late, after it): measured from the
// actual send time they would look fast (coordinated omission); measured
// from the intended time they must not.
func TestOpenLoopStall(t *testing.T) {
	const stall = 200 * time.Millisecond
	for _, tc := range []struct {
		name        string
		maxInFlight int
	}{{"ample workers", 0}, {"16 in flight", 16}} {
		t.Run(tc.name, func(t *testing.T) {
			addr := startHandler(t, &stallServer{stallAt: 400, stall: stall}) // ~400 ms in
			res, err := Run(context.Background(), Config{
				Addr: addr, Rate: 1000, Duration: time.Second, MaxInFlight: tc.maxInFlight, Timeout: starvedTimeout,
			})
			if err != nil {
				t.Fatal(err)
			}
			var text bytes.Buffer
			res.WriteText(&text)
			t.Logf("\n%s", text.String())
			checkSane(t, res, starvedTimeout)
			o := res.Open
			if o.Intended != 1000 || o.Sent != 1000 || o.Unsent != 0 {
				t.Fatalf("intended %d sent %d unsent %d", o.Intended, o.Sent, o.Unsent)
			}
			h := res.LatencyHist
			// at least the stall; at most the run and the backlog's time
			// to clear (the timeout)
			if h.Max() < stall || h.Max() > time.Second+starvedTimeout {
				t.Errorf("max %v, want the %v stall", h.Max(), stall)
			}
			if p := h.Quantile(0.99); p < 150*time.Millisecond {
				t.Errorf("p99 %v hides the stall (want >= 150ms)", p)
			}
			if p := h.Quantile(0.9); p < 40*time.Millisecond {
				t.Errorf("p90 %v hides the stall (want >= 40ms)", p)
			}
			if tc.maxInFlight > 0 {
				if o.Late < 100 || o.PeakInFlight > int64(tc.maxInFlight) {
					t.Errorf("late %d (want >= 100), peak in flight %d (cap %d)", o.Late, o.PeakInFlight, tc.maxInFlight)
				}
				if lag := res.SendLagHist.Max(); lag < 150*time.Millisecond {
					t.Errorf("max send lag %v, want most of the stall", lag)
				}
			} else if o.PeakInFlight < 100 {
				t.Errorf("peak in flight %d: the schedule was not kept through the stall", o.PeakInFlight)
			}
		})
	}
}

// recordServer keeps the descriptors it is sent.
type recordServer struct {
	rlsv3.UnimplementedRateLimitServiceServer
	mu   sync.Mutex
	seen map[string]int
	hits map[uint32]int
	dom  map[string]int
}

func (s *recordServer) ShouldRateLimit(_ context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	var parts []string
	for _, d := range req.Descriptors {
		var es []string
		for _, e := range d.Entries {
			es = append(es, e.Key+"="+e.Value)
		}
		parts = append(parts, strings.Join(es, ","))
	}
	s.mu.Lock()
	s.seen[strings.Join(parts, " | ")]++
	s.hits[req.HitsAddend]++
	s.dom[req.Domain]++
	s.mu.Unlock()
	code := rlsv3.RateLimitResponse_OK
	if strings.HasSuffix(parts[0], "7") {
		code = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	return &rlsv3.RateLimitResponse{OverallCode: code}, nil
}

func TestKeysAndDescriptors(t *testing.T) {
	rec := &recordServer{seen: map[string]int{}, hits: map[uint32]int{}, dom: map[string]int{}}
	addr := startHandler(t, rec)
	d1, _ := ParseDescriptor("tenant=acme,user=u")
	d2, _ := ParseDescriptor("path=/x")
	res, err := Run(context.Background(), Config{
		Addr: addr, Concurrency: 4, Duration: 300 * time.Millisecond,
		Domain: "edge", Descriptors: []Descriptor{d1, d2}, Keys: 10, Hits: 3,
	})
	if err != nil {
		t.Fatal(err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	re := regexp.MustCompile(`^tenant=acme,user=u(\d) \| path=/x(\d)$`)
	var total int
	for k, n := range rec.seen {
		m := re.FindStringSubmatch(k)
		if m == nil || m[1] != m[2] {
			t.Fatalf("unexpected descriptors %q", k)
		}
		total += n
	}
	if len(rec.seen) > 10 || (total >= 200 && len(rec.seen) != 10) {
		t.Fatalf("%d distinct keys in %d requests, want 10: %v", len(rec.seen), total, rec.seen)
	}
	if rec.hits[3] != total || rec.dom["edge"] != total {
		t.Fatalf("hits %v domains %v of %d", rec.hits, rec.dom, total)
	}
	// key 7 is over limit: about a tenth
	if res.OK+res.OverLimit != res.Requests || (res.Requests >= 200 && (res.OverLimit == 0 || res.OverLimit > res.Requests/4)) {
		t.Fatalf("ok %d over %d of %d", res.OK, res.OverLimit, res.Requests)
	}

	// one hot key: values as given, no suffix
	rec.seen = map[string]int{}
	rec.mu.Unlock()
	_, err = Run(context.Background(), Config{Addr: addr, Concurrency: 2, Duration: 100 * time.Millisecond, Descriptors: []Descriptor{d1}})
	rec.mu.Lock()
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.seen) != 1 || rec.seen["tenant=acme,user=u"] == 0 {
		t.Fatalf("hot key: %v", rec.seen)
	}
}

func TestKeyDraw(t *testing.T) {
	d1, _ := ParseDescriptor("a=x,b=y")
	d2, _ := ParseDescriptor("c=z")
	for _, keys := range []int{7, prebuildMax + 1} { // prebuilt, built per call
		cfg := Config{Keys: keys, Descriptors: []Descriptor{d1, d2}}
		cfg.setDefaults()
		r := &run{cfg: &cfg, reqs: newRequests(&cfg)}
		count := map[string]int{}
		const n = 7000
		for range n {
			req := r.pick()
			if req.Domain != "bench" || len(req.Descriptors) != 2 {
				t.Fatalf("request %v", req)
			}
			e := req.Descriptors[0].Entries
			if e[0].Key != "a" || e[0].Value != "x" || e[1].Key != "b" || req.Descriptors[1].Entries[0].Value != "z"+strings.TrimPrefix(e[1].Value, "y") {
				t.Fatalf("request %v", req)
			}
			k, err := strconv.Atoi(strings.TrimPrefix(e[1].Value, "y"))
			if err != nil || k < 0 || k >= keys {
				t.Fatalf("key %q of %d", e[1].Value, keys)
			}
			count[e[1].Value]++
		}
		if keys == 7 {
			if len(count) != 7 {
				t.Fatalf("keys drawn: %v", count)
			}
			for k, c := range count { // 1000 expected; 6 sigma is about 190
				if c < 800 || c > 1200 {
					t.Errorf("key %s drawn %d times of %d", k, c, n)
				}
			}
		} else if len(count) < n*9/10 {
			t.Errorf("%d distinct keys in %d draws among %d", len(count), n, keys)
		}
	}
}

// cancelServer answers OK and cancels a run once a request comes from
// past the run's first (or at the first, for from 0). Run's probe before
// the clock starts (hits_addend 0) does not count.
type cancelServer struct {
	rlsv3.UnimplementedRateLimitServiceServer
	from   time.Duration
	cancel context.CancelFunc
	mu     sync.Mutex
	first  time.Time
	at     time.Time // when it cancelled
}

func (s *cancelServer) ShouldRateLimit(_ context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if h := req.Descriptors[0].HitsAddend; h != nil && h.Value == 0 {
		return okResponse, nil // the probe
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	if s.first.IsZero() {
		s.first = now
	}
	if s.at.IsZero() && now.Sub(s.first) >= s.from {
		s.at = now
		s.cancel()
	}
	return okResponse, nil
}

func (s *cancelServer) cancelledAt() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.at
}

// An interrupt ends a run at once, with what the measured phase had; one
// during the warmup is an error. The server cancels the run itself, at a
// point of the run rather than of the wall clock: on a starved host the
// run's start took more than the 600 ms a timer had allowed.
func TestInterrupt(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	// 500 ms into the run (its first request is at its start or after):
	// 400 ms of the measured phase at least
	srv := &cancelServer{from: 500 * time.Millisecond, cancel: cancel}
	addr := startHandler(t, srv)
	start := time.Now()
	res, err := Run(ctx, Config{Addr: addr, Concurrency: 4, Duration: 10 * time.Second, Warmup: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	took, ran := time.Since(srv.cancelledAt()), time.Since(start)
	// at once: well before the 10 s the run had left
	if took > 5*time.Second {
		t.Fatalf("the run ended %v after the interrupt", took)
	}
	if !res.Interrupted || res.DurationSeconds < 0.4 || res.DurationSeconds > ran.Seconds() || res.Requests == 0 {
		t.Fatalf("interrupted %v after %vs (of %v in all) with %d requests", res.Interrupted, res.DurationSeconds, ran, res.Requests)
	}

	ctx, cancel = context.WithCancel(context.Background())
	addr = startHandler(t, &cancelServer{cancel: cancel}) // at the first request, a minute before the warmup ends
	if _, err := Run(ctx, Config{Addr: addr, Rate: 100, Duration: time.Second, Warmup: time.Minute}); err == nil || !strings.Contains(err.Error(), "warmup") {
		t.Fatalf("interrupted in warmup: %v", err)
	}
}

func TestMainUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "--addr HOST:PORT is required"},
		{[]string{"--addr", "localhost"}, "want host:port"},
		{[]string{"--bogus"}, "flag provided but not defined: -bogus"},
		{[]string{"--addr", "x:1", "--concurrency", "abc"}, `invalid value "abc" for flag -concurrency`},
		{[]string{"--addr", "x:1", "--concurrency", "0"}, "--concurrency must be at least 1"},
		{[]string{"--addr", "x:1", "--rate", "100", "--concurrency", "8"}, "exclude each other"},
		{[]string{"--addr", "x:1", "--rate", "-5"}, "--rate must be"},
		{[]string{"--addr", "x:1", "--max-inflight", "5"}, "open loop only"},
		{[]string{"--addr", "x:1", "--duration", "-1s"}, "--duration must be positive"},
		{[]string{"--addr", "x:1", "--duration", "10"}, `invalid value "10" for flag -duration`},
		{[]string{"--addr", "x:1", "--descriptor", "novalue"}, `"novalue" is not key=value`},
		{[]string{"--addr", "x:1", "--descriptor", "=v"}, "empty key"},
		{[]string{"--addr", "x:1", "--keys", "0"}, "--keys must be at least 1"},
		{[]string{"--addr", "x:1", "--store-pid", "-3"}, "--store-pid must be a process id"},
		{[]string{"--addr", "x:1", "--hits", "5000000000"}, "--hits 5000000000 is out of range"},
		{[]string{"--addr", "x:1", "--tls-cert", "c.pem"}, "--tls-cert and --tls-key go together"},
		{[]string{"--addr", "x:1", "extra"}, `unexpected argument "extra"`},
		{[]string{"--serve-empty", "127.0.0.1:0", "--addr", "x:1"}, "--serve-empty takes no other flag but --stock"},
		{[]string{"--addr", "x:1", "--stock"}, "--stock goes with --serve-empty"},
	} {
		var stdout, stderr bytes.Buffer
		code := mainCtx(context.Background(), tc.args, &stdout, &stderr)
		if code != 2 || !strings.Contains(stderr.String(), tc.want) || !strings.HasPrefix(stderr.String(), "floodgate bench: ") || stdout.Len() != 0 {
			t.Errorf("%q: exit %d, stderr %q; want 2 and %q", tc.args, code, stderr.String(), tc.want)
		}
	}

	var stdout, stderr bytes.Buffer
	if code := mainCtx(context.Background(), []string{"-h"}, &stdout, &stderr); code != 0 || !strings.Contains(stderr.String(), "-concurrency") {
		t.Errorf("-h: exit %d, %q", code, stderr.String())
	}
}

func TestMainEndToEnd(t *testing.T) {
	// --serve-empty on a free port, then bench it through Main
	ctx, cancel := context.WithCancel(context.Background())
	serveErr := &syncBuffer{}
	served := make(chan int)
	go func() { served <- mainCtx(ctx, []string{"--serve-empty", "127.0.0.1:0"}, &bytes.Buffer{}, serveErr) }()
	re := regexp.MustCompile(`on (127\.0\.0\.1:\d+) \(pid (\d+)\)`)
	var m []string
	for deadline := time.Now().Add(5 * time.Second); m == nil && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		m = re.FindStringSubmatch(serveErr.String())
	}
	if m == nil {
		t.Fatalf("--serve-empty said %q", serveErr.String())
	}
	if pid, _ := strconv.Atoi(m[2]); pid != os.Getpid() {
		t.Fatalf("pid %s", m[2])
	}

	var stdout, stderr bytes.Buffer
	code := mainCtx(context.Background(), []string{"--addr", m[1], "--duration", "300ms", "--warmup", "0s",
		"--concurrency", "4", "--json", "--quiet", "--cpu-pid", m[2], "--descriptor", "a=b,c=d", "--keys", "3"}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	if stderr.Len() != 0 {
		t.Fatalf("--quiet printed %q", stderr.String())
	}
	var res Result
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		t.Fatalf("%v: %s", err, stdout.String())
	}
	if res.OK == 0 || res.Requests != res.OK || res.Latency.P99 <= 0 || res.ServerCPU == nil || res.Keys != 3 || res.Descriptors[0] != "a=b,c=d" {
		t.Fatalf("json result %s", stdout.String())
	}

	stdout.Reset()
	stderr.Reset()
	code = mainCtx(context.Background(), []string{"--addr", m[1], "--duration", "1100ms", "--warmup", "0s", "--rate", "200"}, &stdout, &stderr)
	if code != 0 || !strings.Contains(stdout.String(), "open loop at 200 req/s") || !strings.Contains(stdout.String(), "220 due, 220 sent") ||
		!strings.Contains(stderr.String(), "req/s") {
		t.Fatalf("exit %d\nstdout %s\nstderr %s", code, stdout.String(), stderr.String())
	}

	cancel()
	select {
	case code := <-served:
		if code != 0 {
			t.Fatalf("--serve-empty exit %d", code)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("--serve-empty did not stop")
	}

	// nothing listens there any more
	stderr.Reset()
	code = mainCtx(context.Background(), []string{"--addr", m[1], "--timeout", "300ms", "--duration", "1s"}, &stdout, &stderr)
	if code != 1 || !strings.Contains(stderr.String(), "cannot reach "+m[1]) {
		t.Fatalf("unreachable: exit %d, %q", code, stderr.String())
	}
}

func TestNotRateLimitService(t *testing.T) {
	lis := listen(t)
	s := grpc.NewServer() // nothing registered
	go s.Serve(lis)
	defer s.Stop()
	_, err := Run(context.Background(), Config{Addr: lis.Addr().String(), Duration: time.Second})
	if err == nil || !strings.Contains(err.Error(), "does not serve") {
		t.Fatalf("got %v", err)
	}
}

func TestServeEmptyStock(t *testing.T) {
	// --serve-empty --stock serves the empty handler on grpc-go's defaults
	ctx, cancel := context.WithCancel(context.Background())
	serveErr := &syncBuffer{}
	served := make(chan int)
	go func() {
		served <- mainCtx(ctx, []string{"--serve-empty", "127.0.0.1:0", "--stock"}, &bytes.Buffer{}, serveErr)
	}()
	re := regexp.MustCompile(`stock empty RateLimitService on (127\.0\.0\.1:\d+)`)
	var m []string
	for deadline := time.Now().Add(5 * time.Second); m == nil && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		m = re.FindStringSubmatch(serveErr.String())
	}
	if m == nil {
		cancel()
		t.Fatalf("--serve-empty --stock said %q", serveErr.String())
	}
	var stdout, stderr bytes.Buffer
	code := mainCtx(context.Background(), []string{"--addr", m[1], "--duration", "200ms", "--warmup", "0s",
		"--concurrency", "2", "--json", "--quiet"}, &stdout, &stderr)
	cancel()
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	var res Result
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		t.Fatal(err)
	}
	if res.OK == 0 || res.Requests != res.OK || res.Errors != 0 {
		t.Fatalf("json result %s", stdout.String())
	}
	if code := <-served; code != 0 {
		t.Fatalf("--serve-empty --stock exit %d", code)
	}
}

// checkCounter counts the requests whose every descriptor has hits_addend
// 0 (checks) and the others.
type checkCounter struct {
	rlsv3.UnimplementedRateLimitServiceServer
	checks, counted atomic.Int64
}

func (c *checkCounter) ShouldRateLimit(_ context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	check := len(req.Descriptors) > 0
	for _, d := range req.Descriptors {
		if d.HitsAddend == nil || d.HitsAddend.Value != 0 {
			check = false
		}
	}
	if check {
		c.checks.Add(1)
	} else {
		c.counted.Add(1)
	}
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, nil
}

// The request that checks each connection before the clock starts is a
// check (hits_addend 0): it consumes nothing, so a limit of 50 shows 50
// OK in the report, not 49.
func TestConnectionCheckConsumesNothing(t *testing.T) {
	c := &checkCounter{}
	addr := startHandler(t, c)
	d, _ := ParseDescriptor("user=u")
	res, err := Run(context.Background(), Config{Addr: addr, Concurrency: 2, Conns: 3, Duration: 100 * time.Millisecond, Descriptors: []Descriptor{d}})
	if err != nil {
		t.Fatal(err)
	}
	if c.checks.Load() != 3 {
		t.Fatalf("%d checks, want one per connection (3)", c.checks.Load())
	}
	if uint64(c.counted.Load()) < res.Requests {
		t.Fatalf("%d counted requests at the server, %d in the report", c.counted.Load(), res.Requests)
	}
}

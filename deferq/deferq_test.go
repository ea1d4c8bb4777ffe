package deferq_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/deferq"
	"github.com/floodgate/floodgate/internal/redistest"
	"github.com/floodgate/floodgate/internal/testproc"
	"github.com/redis/rueidis"
)

func client(t testing.TB, addr string) rueidis.Client {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func newQueue(t testing.TB, addr string, o deferq.Options) *deferq.Queue {
	t.Helper()
	if o.Name == "" {
		o.Name = "orders"
	}
	q, err := deferq.New(client(t, addr), o)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// front is the accepting listener: POST /orders is deferred, the poll
// path answers polls.
func front(t testing.TB, q *deferq.Queue) *httptest.Server {
	mux := http.NewServeMux()
	mux.HandleFunc("/orders", q.Accept)
	mux.Handle(deferq.PollPrefix, q)
	s := httptest.NewServer(mux)
	t.Cleanup(s.Close)
	return s
}

// upstream counts deliveries by idempotency key and echoes the body.
type upstream struct {
	mu    sync.Mutex
	keys  map[string]int
	order []string // bodies, in delivery order
	at    []int64  // clock readings at delivery
	clk   deferq.Clock
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	u.mu.Lock()
	if u.keys == nil {
		u.keys = map[string]int{}
	}
	u.keys[r.Header.Get(deferq.IdempotencyHeader)]++
	u.order = append(u.order, string(b))
	if u.clk != nil {
		u.at = append(u.at, u.clk.NowMicro())
	}
	u.mu.Unlock()
	w.Header().Set("X-Echo-Header", r.Header.Get("X-Test"))
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, "%s %s %s", r.Method, r.URL.RequestURI(), b)
}

func (u *upstream) count(key string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.keys[key]
}

func post(t testing.TB, url, body string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if len(body) < 100 {
		req.Header.Set("X-Test", "hdr-"+body)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body) //nolint:errcheck
	resp.Body.Close()
	return resp
}

func get(t testing.TB, url string) (int, string, http.Header) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

// accept posts n requests and returns their poll locations.
func accept(t testing.TB, s *httptest.Server, n int) []string {
	t.Helper()
	var locs []string
	for i := range n {
		resp := post(t, s.URL+"/orders?n="+fmt.Sprint(i), fmt.Sprint("body", i))
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("request %d: status %d, want 202", i, resp.StatusCode)
		}
		loc := resp.Header.Get("Location")
		if !strings.HasPrefix(loc, deferq.PollPrefix+"orders/") {
			t.Fatalf("Location %q", loc)
		}
		locs = append(locs, loc)
	}
	return locs
}

func idOf(loc string) string { return loc[strings.LastIndexByte(loc, '/')+1:] }

// keyOf is the Idempotency-Key of the request polled at loc (a queue
// named "orders").
func keyOf(loc string) string { return "orders/" + sidOf(loc) }

// sidOf is the stream id in the poll location loc.
func sidOf(loc string) string {
	id := idOf(loc)
	return id[:strings.IndexByte(id, '.')]
}

// TestDeliversEach: every accepted request is pending (202) until a worker
// runs, then delivered once with its method, URI, headers, body and
// idempotency key, and its response is served at the poll location.
func TestDeliversEach(t *testing.T) {
	srv := redistest.Standalone(t)
	q := newQueue(t, srv.Addr, deferq.Options{})
	f := front(t, q)
	up := &upstream{}
	us := httptest.NewServer(up)
	defer us.Close()
	locs := accept(t, f, 5)
	for _, l := range locs {
		if st, _, _ := get(t, f.URL+l); st != http.StatusAccepted {
			t.Fatalf("before delivery: poll %s = %d, want 202", l, st)
		}
	}
	d := deferq.ToUpstream(http.DefaultClient, us.URL, 1<<20)
	for range locs {
		if ok, err := q.Once(context.Background(), "w1", d); !ok || err != nil {
			t.Fatalf("Once = %v, %v", ok, err)
		}
	}
	for i, l := range locs {
		st, body, h := get(t, f.URL+l)
		want := fmt.Sprintf("POST /orders?n=%d body%d", i, i)
		if st != http.StatusCreated || body != want || h.Get("X-Echo-Header") != fmt.Sprint("hdr-body", i) {
			t.Errorf("poll %s = %d %q %v; want 201 %q", l, st, body, h, want)
		}
		if n := up.count(keyOf(l)); n != 1 {
			t.Errorf("%s delivered %d times, want 1", l, n)
		}
	}
	if n, _ := q.Len(context.Background()); n != 0 {
		t.Errorf("Len after delivery = %d, want 0", n)
	}
	if ok, err := q.Once(context.Background(), "w1", d); ok || err != nil {
		t.Errorf("Once on an empty queue = %v, %v; want false, nil", ok, err)
	}
	if _, ok, err := q.Oldest(context.Background()); ok || err != nil {
		t.Errorf("Oldest on an empty queue = %v, %v; want false, nil", ok, err)
	}
}

// TestSurvivesRestart: requests accepted by one process's queue (its
// client closed, Redis itself restarted from its append-only file) are
// delivered by a new Queue on the same Redis.
func TestSurvivesRestart(t *testing.T) {
	srv := redistest.StandaloneDurable(t)
	c1, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	q1, err := deferq.New(c1, deferq.Options{Name: "orders"})
	if err != nil {
		t.Fatal(err)
	}
	f1 := httptest.NewServer(http.HandlerFunc(q1.Accept))
	locs := make([]string, 3)
	for i := range locs {
		resp := post(t, f1.URL+"/orders", fmt.Sprint("body", i))
		locs[i] = resp.Header.Get("Location")
	}
	f1.Close()
	c1.Close()
	srv.Restart(t)

	q2 := newQueue(t, srv.Addr, deferq.Options{})
	f2 := front(t, q2)
	up := &upstream{}
	d := deferq.ToHandler(up, 1<<20)
	for range locs {
		if ok, err := q2.Once(context.Background(), "after-restart", d); !ok || err != nil {
			t.Fatalf("Once after restart = %v, %v", ok, err)
		}
	}
	for i, l := range locs {
		if st, body, _ := get(t, f2.URL+l); st != http.StatusCreated || !strings.HasSuffix(body, fmt.Sprint("body", i)) {
			t.Errorf("poll %s after restart = %d %q", l, st, body)
		}
	}
}

// TestFullQueue: a queue of MaxLen 3 answers the fourth request 503 with
// Retry-After, and takes requests again once one is delivered.
func TestFullQueue(t *testing.T) {
	srv := redistest.Standalone(t)
	q := newQueue(t, srv.Addr, deferq.Options{MaxLen: 3})
	f := front(t, q)
	accept(t, f, 3)
	resp := post(t, f.URL+"/orders", "over")
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("full queue: %d Retry-After %q; want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if n, _ := q.Len(context.Background()); n != 3 {
		t.Fatalf("Len = %d after a refused request, want 3 (the refusal queued nothing)", n)
	}
	if at, ok, err := q.Oldest(context.Background()); !ok || err != nil || time.Since(at) > time.Hour || time.Since(at) < -time.Hour {
		t.Errorf("Oldest = %v, %v, %v; want about now", at, ok, err)
	}
	if ok, err := q.Once(context.Background(), "w", deferq.ToHandler(&upstream{}, 100)); !ok || err != nil {
		t.Fatal(ok, err)
	}
	accept(t, f, 1)
}

// TestOrderAndRate: one worker on a manual clock with Interval 1s
// delivers in the order accepted, one per second of the clock: never a
// second delivery before the interval has passed.
func TestOrderAndRate(t *testing.T) {
	srv := redistest.Standalone(t)
	clk := clock.NewManual(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	q := newQueue(t, srv.Addr, deferq.Options{Interval: time.Second, Clock: clk})
	f := front(t, q)
	const n = 5
	accept(t, f, n)
	up := &upstream{clk: clk}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	done := make(chan struct{})
	go func() { q.Run(ctx, "w", deferq.ToHandler(up, 100)); close(done) }() //nolint:errcheck
	delivered := func() int {
		up.mu.Lock()
		defer up.mu.Unlock()
		return len(up.order)
	}
	for k := 1; k < n; k++ {
		if err := clk.WaitForSleepers(ctx, 1); err != nil {
			t.Fatalf("worker never waited for slot %d: %v", k+1, err)
		}
		if got := delivered(); got != k {
			t.Fatalf("%d delivered while waiting for slot %d, want %d", got, k+1, k)
		}
		clk.Advance(999 * time.Millisecond)
		if clk.Sleepers() != 1 || delivered() != k {
			t.Fatalf("slot %d: delivered %d after 999ms, before the interval", k+1, delivered())
		}
		clk.Advance(time.Millisecond)
	}
	redistest.WaitFor(t, 10*time.Second, "last delivery", func() bool { return delivered() == n })
	cancel()
	<-done
	for i, b := range up.order {
		if b != fmt.Sprint("body", i) {
			t.Errorf("delivery %d was %q, want body%d (order)", i, b, i)
		}
		if i > 0 && up.at[i]-up.at[i-1] != time.Second.Microseconds() {
			t.Errorf("delivery %d came %dus after the previous, want 1s", i, up.at[i]-up.at[i-1])
		}
	}
}

// TestHostileInput: a body over MaxBody is 413 and queues nothing;
// malformed, unknown and wrong-token poll ids are 404, never a panic; a
// result is 404 once ResultTTL has passed.
func TestHostileInput(t *testing.T) {
	srv := redistest.Standalone(t)
	q := newQueue(t, srv.Addr, deferq.Options{MaxBody: 1024, ResultTTL: 300 * time.Millisecond})
	f := front(t, q)
	resp := post(t, f.URL+"/orders", strings.Repeat("x", 8<<20))
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("8 MiB body: %d, want 413", resp.StatusCode)
	}
	if n, _ := q.Len(context.Background()); n != 0 {
		t.Errorf("Len = %d after a too-large body, want 0", n)
	}
	locs := accept(t, f, 1)
	id := idOf(locs[0])
	bad := []string{"", ".", "x", "0-0", "0-0.", "-.", "1-1.zz", id + "0", strings.ToUpper(id),
		sidOf(locs[0]) + ".000000000000000000000000", "99999999999999999999999-1." + id[len(sidOf(locs[0]))+1:],
		strings.Repeat("9", 5000) + "-1.abc", "1-1.%00", "../../etc", "1-1..", "１-1.aaaaaaaaaaaaaaaaaaaaaaaa"}
	for _, b := range bad {
		st, _, _ := get(t, f.URL+deferq.PollPrefix+"orders/"+strings.ReplaceAll(b, "%", "%25"))
		if st != http.StatusNotFound {
			t.Errorf("poll id %q: %d, want 404", b, st)
		}
	}
	if st, _, _ := get(t, f.URL+deferq.PollPrefix+"other/"+id); st != http.StatusNotFound {
		t.Errorf("poll through another queue's name: %d, want 404", st)
	}
	if ok, err := q.Once(context.Background(), "w", deferq.ToHandler(&upstream{}, 10)); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if st, body, _ := get(t, f.URL+locs[0]); st != http.StatusCreated || len(body) != 10 {
		t.Errorf("result: %d %q; want 201 with the body cut to 10 bytes", st, body)
	}
	redistest.WaitFor(t, 10*time.Second, "result expiry", func() bool {
		st, _, _ := get(t, f.URL+locs[0])
		return st == http.StatusNotFound
	})
}

// TestNewRejectsBadOptions: bad options are errors, not panics.
func TestNewRejectsBadOptions(t *testing.T) {
	srv := redistest.Standalone(t)
	c := client(t, srv.Addr)
	for _, o := range []deferq.Options{{}, {Name: "a b"}, {Name: "x{y}"}, {Name: "ok", MaxLen: -1}, {Name: "ok", ClaimIdle: time.Microsecond}} {
		if _, err := deferq.New(c, o); err == nil {
			t.Errorf("New(%+v) = nil error", o)
		}
	}
}

// helperEnv, when set, makes TestHelperWorker a worker process:
// "redisaddr upstreamURL".
const helperEnv = "DEFERQ_HELPER_WORKER"

// TestHelperWorker is the worker process TestKilledWorker kills.
func TestHelperWorker(t *testing.T) {
	spec := os.Getenv(helperEnv)
	if spec == "" {
		t.Skip("helper process only")
	}
	addr, up, _ := strings.Cut(spec, " ")
	q := newQueue(t, addr, deferq.Options{ClaimIdle: 300 * time.Millisecond, Block: 100 * time.Millisecond})
	q.Run(context.Background(), "victim", deferq.ToUpstream(http.DefaultClient, up, 1<<20)) //nolint:errcheck
}

// TestKilledWorker: a worker process killed with SIGKILL in the middle of
// a delivery (the upstream has the request, the worker has not stored the
// answer) loses nothing: another worker reclaims the pending entry and
// delivers it again with the same idempotency key, and every request is
// delivered at least once.
func TestKilledWorker(t *testing.T) {
	srv := redistest.Standalone(t)
	q := newQueue(t, srv.Addr, deferq.Options{ClaimIdle: 300 * time.Millisecond, Block: 100 * time.Millisecond})
	f := front(t, q)
	const n, holdAt = 5, 2 // the victim delivers 0 and 1, and dies delivering 2
	locs := accept(t, f, n)

	up := &upstream{}
	held := make(chan struct{})
	var once sync.Once
	us := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(deferq.IdempotencyHeader) == keyOf(locs[holdAt]) && up.count(keyOf(locs[holdAt])) == 0 {
			up.ServeHTTP(httptest.NewRecorder(), r) // count it, answer never
			once.Do(func() { close(held) })
			<-r.Context().Done()
			return
		}
		up.ServeHTTP(w, r)
	}))
	defer us.Close()

	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperWorker$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"="+srv.Addr+" "+us.URL)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	p, err := testproc.Start(cmd)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-held:
	case <-time.After(15 * time.Second):
		p.Cmd.Process.Kill() //nolint:errcheck
		p.Wait()             //nolint:errcheck
		t.Fatal("the victim never delivered the held request")
	}
	if err := p.Cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	p.Wait() //nolint:errcheck
	for i := range holdAt {
		if up.count(keyOf(locs[i])) != 1 {
			t.Fatalf("before the kill: request %d delivered %d times, want 1", i, up.count(keyOf(locs[i])))
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { q.Run(ctx, "rescuer", deferq.ToUpstream(http.DefaultClient, us.URL, 1<<20)); close(done) }() //nolint:errcheck
	redistest.WaitFor(t, 15*time.Second, "every request done", func() bool {
		for _, l := range locs {
			if st, _, _ := q.Status(context.Background(), idOf(l)); st != deferq.Done {
				return false
			}
		}
		return true
	})
	cancel()
	<-done
	for i, l := range locs {
		c, want := up.count(keyOf(l)), 1
		if i == holdAt {
			want = 2 // once to the victim, once more after the reclaim
		}
		if c != want {
			t.Errorf("request %d delivered %d times, want %d", i, c, want)
		}
		if st, body, _ := get(t, f.URL+l); st != http.StatusCreated || !strings.HasSuffix(body, fmt.Sprint("body", i)) {
			t.Errorf("poll %d: %d %q", i, st, body)
		}
	}
}

// TestCutUpstreamBody: a response cut to the worker's bound is served
// whole at the poll (the upstream's Content-Length is not replayed over
// the shorter body).
func TestCutUpstreamBody(t *testing.T) {
	srv := redistest.Standalone(t)
	q := newQueue(t, srv.Addr, deferq.Options{})
	f := front(t, q)
	us := httptest.NewServer(&upstream{})
	defer us.Close()
	locs := accept(t, f, 1)
	if ok, err := q.Once(context.Background(), "w", deferq.ToUpstream(http.DefaultClient, us.URL, 5)); !ok || err != nil {
		t.Fatal(ok, err)
	}
	resp, err := http.Get(f.URL + locs[0])
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusCreated || string(body) != "POST " || err != nil {
		t.Errorf("poll: %d %q (%v); want 201 %q read whole", resp.StatusCode, body, err, "POST ")
	}
}

// TestSharedRate: two workers on separate clients (two processes' worth)
// share the queue's pace: with Interval 1s on one manual clock, their
// deliveries come 1s apart, never together.
func TestSharedRate(t *testing.T) {
	srv := redistest.Standalone(t)
	clk := clock.NewManual(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	o := deferq.Options{Interval: time.Second, Clock: clk}
	qa, qb := newQueue(t, srv.Addr, o), newQueue(t, srv.Addr, o)
	accept(t, front(t, qa), 3)
	up := &upstream{clk: clk}
	d := deferq.ToHandler(up, 100)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if ok, err := qa.Once(ctx, "a", d); !ok || err != nil { // slot 0: now
		t.Fatal(ok, err)
	}
	errs := make(chan error, 2)
	once := func(q *deferq.Queue, name string) {
		_, err := q.Once(ctx, name, d)
		errs <- err
	}
	go once(qb, "b")
	if err := clk.WaitForSleepers(ctx, 1); err != nil { // b holds slot 1s
		t.Fatal(err)
	}
	go once(qa, "a")
	if err := clk.WaitForSleepers(ctx, 2); err != nil { // a holds slot 2s
		t.Fatal(err)
	}
	clk.Advance(time.Second)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	if clk.Sleepers() != 1 {
		t.Fatalf("%d sleepers after the first slot, want 1: the other worker's slot is 1s later", clk.Sleepers())
	}
	clk.Advance(time.Second)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	up.mu.Lock()
	defer up.mu.Unlock()
	if len(up.at) != 3 || up.at[1]-up.at[0] != 1e6 || up.at[2]-up.at[1] != 1e6 {
		t.Errorf("deliveries at %v (us), want 3, 1s apart", up.at)
	}
}

// TestConcurrentAcceptBound: 40 concurrent requests against a queue of 10:
// exactly 10 are accepted (202) and queued, the rest 503; never more.
func TestConcurrentAcceptBound(t *testing.T) {
	srv := redistest.Standalone(t)
	q := newQueue(t, srv.Addr, deferq.Options{MaxLen: 10})
	f := front(t, q)
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[int]int{}
	for i := range 40 {
		wg.Go(func() {
			resp, err := http.Post(f.URL+"/orders", "text/plain", strings.NewReader(fmt.Sprint(i)))
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			mu.Lock()
			codes[resp.StatusCode]++
			mu.Unlock()
		})
	}
	wg.Wait()
	n, err := q.Len(context.Background())
	if codes[http.StatusAccepted] != 10 || codes[http.StatusServiceUnavailable] != 30 || n != 10 || err != nil {
		t.Errorf("codes %v, Len %d (%v); want 10×202, 30×503, 10 queued", codes, n, err)
	}
}

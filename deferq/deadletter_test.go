package deferq_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/deferq"
	"github.com/floodgate/floodgate/internal/redistest"
)

// flaky is a Deliver that fails the requests whose body is in fail, and
// records every attempt's body in order.
type flaky struct {
	mu       sync.Mutex
	fail     map[string]bool
	attempts []string
}

func (f *flaky) deliver(_ context.Context, r *http.Request) (*deferq.Result, error) {
	b, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.attempts = append(f.attempts, string(b))
	if f.fail[string(b)] {
		return nil, errors.New("upstream down")
	}
	return &deferq.Result{Status: http.StatusOK, Body: b}, nil
}

func (f *flaky) seen() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.attempts...)
}

// onceUntil calls Once until it has handed out a request (claimed after
// ClaimIdle, or read) or dead-lettered one, or fails the test after 10 s.
func onceUntil(t *testing.T, q *deferq.Queue, d deferq.Deliver) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, _ := q.Len(context.Background())
		ok, err := q.Once(context.Background(), "w", d)
		m, _ := q.Len(context.Background())
		if ok || err != nil || m < n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no request handed out in 10 s")
		}
	}
}

// TestDeadLetter: a request whose delivery always fails is tried exactly
// MaxDeliveries (3) times, then moved to the dead-letter stream: its poll
// answers 502, the queue is empty, DeadLen counts it and DeadLetters
// shows it. The dead-letter stream keeps at most MaxDead (2): of 4 dead
// requests, the newest 2. A request that succeeds on its second try is
// delivered, not dead-lettered.
func TestDeadLetter(t *testing.T) {
	srv := redistest.Standalone(t)
	q := newQueue(t, srv.Addr, deferq.Options{MaxDeliveries: 3, MaxDead: 2, ClaimIdle: 30 * time.Millisecond, Block: 5 * time.Millisecond})
	f := front(t, q)
	locs := accept(t, f, 1) // body0
	fl := &flaky{fail: map[string]bool{"body0": true}}
	for range 4 { // 3 attempts, then the dead-lettering
		onceUntil(t, q, fl.deliver)
	}
	if got := fl.seen(); len(got) != 3 {
		t.Fatalf("attempts %v; want exactly 3 (MaxDeliveries)", got)
	}
	st, body, _ := get(t, f.URL+locs[0])
	if st != http.StatusBadGateway || !strings.Contains(body, "3 attempts") {
		t.Errorf("poll of the dead request: %d %q; want 502 naming 3 attempts", st, body)
	}
	ctx := context.Background()
	if n, _ := q.Len(ctx); n != 0 {
		t.Errorf("Len = %d after dead-lettering, want 0", n)
	}
	if n, _ := q.DeadLen(ctx); n != 1 {
		t.Errorf("DeadLen = %d, want 1", n)
	}
	ds, err := q.DeadLetters(ctx, 10)
	if err != nil || len(ds) != 1 || ds[0].ID != sidOf(locs[0]) || ds[0].Method != "POST" || ds[0].URL != "/orders?n=0" {
		t.Errorf("DeadLetters = %+v, %v", ds, err)
	}
	// 3 more dead (accept numbers them body0..body2 again): the stream
	// keeps the newest 2
	fl.mu.Lock()
	fl.fail = map[string]bool{"body0": true, "body1": true, "body2": true}
	fl.mu.Unlock()
	more := accept(t, f, 3)
	for range 3 * 4 {
		onceUntil(t, q, fl.deliver)
	}
	if n, _ := q.DeadLen(ctx); n != 2 {
		t.Errorf("DeadLen = %d after 4 dead with MaxDead 2, want 2", n)
	}
	if ds, _ := q.DeadLetters(ctx, 10); len(ds) != 2 || ds[0].ID != sidOf(more[1]) || ds[1].ID != sidOf(more[2]) {
		t.Errorf("dead letters %+v; want the newest two, %s and %s", ds, sidOf(more[1]), sidOf(more[2]))
	}
	if n, _ := q.Len(ctx); n != 0 {
		t.Errorf("Len = %d, want 0", n)
	}
	// fails once, then succeeds: delivered on the second try
	fl.mu.Lock()
	fl.fail = map[string]bool{"body0": true}
	fl.attempts = nil
	fl.mu.Unlock()
	loc := accept(t, f, 1)[0]
	onceUntil(t, q, fl.deliver)
	fl.mu.Lock()
	fl.fail = nil
	fl.mu.Unlock()
	onceUntil(t, q, fl.deliver)
	if st, body, _ := get(t, f.URL+loc); st != 200 || body != "body0" || len(fl.seen()) != 2 {
		t.Errorf("a request failing once: poll %d %q after %v; want 200 on the second try", st, body, fl.seen())
	}
	if n, _ := q.DeadLen(ctx); n != 2 {
		t.Errorf("DeadLen = %d, want still 2", n)
	}
}

// TestOrderAfterReclaim: one worker, five requests; the first delivery
// fails. The worker goes on with the second and third; once the first
// has been pending for ClaimIdle, the next Once reclaims it before it
// reads the fourth: the order is 0 (failed), 1, 2, 0, 3, 4 — a reclaimed
// request comes after those a worker took meanwhile, and before those
// not yet taken (docs/THROTTLE.md, "Guarantees and limits").
func TestOrderAfterReclaim(t *testing.T) {
	srv := redistest.Standalone(t)
	q := newQueue(t, srv.Addr, deferq.Options{ClaimIdle: time.Second, Block: 5 * time.Millisecond})
	f := front(t, q)
	accept(t, f, 5)
	fl := &flaky{fail: map[string]bool{"body0": true}}
	ctx := context.Background()
	if ok, err := q.Once(ctx, "w", fl.deliver); !ok || err == nil {
		t.Fatalf("the failing delivery: %v, %v", ok, err)
	}
	fl.mu.Lock()
	fl.fail = nil
	fl.mu.Unlock()
	for range 2 {
		if ok, err := q.Once(ctx, "w", fl.deliver); !ok || err != nil {
			t.Fatal(ok, err)
		}
	}
	if got := strings.Join(fl.seen(), " "); got != "body0 body1 body2" {
		t.Fatalf("before the reclaim: %s", got) // the first was not reclaimed before ClaimIdle
	}
	time.Sleep(1100 * time.Millisecond) // past ClaimIdle on Redis's clock: what is tested is the order, not the time
	for range 3 {
		if ok, err := q.Once(ctx, "w", fl.deliver); !ok || err != nil {
			t.Fatal(ok, err)
		}
	}
	if got := strings.Join(fl.seen(), " "); got != "body0 body1 body2 body0 body3 body4" {
		t.Errorf("order %s; want body0 body1 body2 body0 body3 body4", got)
	}
}

// redisCalls returns how many times Redis ran cmd (INFO commandstats).
func redisCalls(t *testing.T, c rueidis.Client, cmd string) int64 {
	t.Helper()
	s, err := c.Do(context.Background(), c.B().Info().Section("commandstats").Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(s, "\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_"+cmd+":calls="); ok {
			n, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
			return n
		}
	}
	return 0
}

// TestPollRate: a client polling ids (PollRate 5 a second, a burst of
// 10, on a manual clock) gets 10 answers, then 429 with Retry-After —
// and Redis is asked nothing for the refused polls (its own count of
// GET commands); another client is not affected; a fifth of a second
// later the client has one more poll. Polls past PollConcurrency are
// 503 without asking Redis (a poll held on a paused Redis).
func TestPollRate(t *testing.T) {
	srv := redistest.Standalone(t)
	clk := clock.NewManual(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	q := newQueue(t, srv.Addr, deferq.Options{PollRate: 5, PollConcurrency: 1, Clock: clk})
	ctx := context.Background()
	id := "1-1.000000000000000000000000"
	admin := client(t, srv.Addr)
	before := redisCalls(t, admin, "get")
	for i := range 10 {
		if st, _, err := q.PollStatus(ctx, "192.0.2.1:4000", id); err != nil || st != deferq.Unknown {
			t.Fatalf("poll %d within the burst: %v, %v", i+1, st, err)
		}
	}
	for range 100 {
		if _, _, err := q.PollStatus(ctx, "192.0.2.1:4001", id); err != deferq.ErrPollRate {
			t.Fatalf("past the burst: %v, want ErrPollRate", err)
		}
	}
	if n := redisCalls(t, admin, "get") - before; n != 10 {
		t.Errorf("Redis ran %d GETs for 10 polls answered and 100 refused, want 10", n)
	}
	if _, _, err := q.PollStatus(ctx, "192.0.2.2", id); err != nil {
		t.Errorf("another client: %v", err)
	}
	clk.Advance(200 * time.Millisecond)
	if _, _, err := q.PollStatus(ctx, "192.0.2.1", id); err != nil {
		t.Errorf("200ms later: %v, want one more poll", err)
	}
	if _, _, err := q.PollStatus(ctx, "192.0.2.1", id); err != deferq.ErrPollRate {
		t.Errorf("and no second: %v", err)
	}
	// the handler: 10 × 404 (the id is unknown), then 429 with Retry-After
	f := front(t, q)
	for i := range 11 {
		st, _, h := get(t, f.URL+deferq.PollPrefix+"orders/"+id)
		if want := map[bool]int{true: 429, false: 404}[i == 10]; st != want || st == 429 && h.Get("Retry-After") != "1" {
			t.Errorf("poll %d over HTTP: %d %v, want %d", i+1, st, h, want)
		}
	}

	// PollConcurrency 1: one poll held in a paused Redis, the next is 503 at once
	if err := admin.Do(ctx, admin.B().ClientPause().Timeout(1500).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	held := make(chan error, 1)
	go func() { _, _, err := q.PollStatus(ctx, "", id); held <- err }()
	deadline := time.Now().Add(10 * time.Second)
	for q.PollsInFlight() != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the held poll never asked Redis")
		}
		time.Sleep(time.Millisecond)
	}
	if _, _, err := q.PollStatus(ctx, "", id); err != deferq.ErrPollBusy {
		t.Errorf("a second poll while one waits on Redis: %v, want ErrPollBusy", err)
	}
	if err := <-held; err != nil {
		t.Errorf("the held poll: %v", err)
	}
}

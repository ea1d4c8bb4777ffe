package deferq_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/floodgate/floodgate/deferq"
	"github.com/floodgate/floodgate/internal/redistest"
)

// attempt is one delivery a recorder saw.
type attempt struct{ key, method, uri, hdr, body string }

// recorder is a Deliver that records each attempt and fails them while
// fail is set (a transport error: the request stays queued).
type recorder struct {
	mu       sync.Mutex
	fail     bool
	attempts []attempt
}

func (r *recorder) deliver(_ context.Context, req *http.Request) (*deferq.Result, error) {
	b, _ := io.ReadAll(req.Body)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.attempts = append(r.attempts, attempt{req.Header.Get(deferq.IdempotencyHeader), req.Method, req.RequestURI, req.Header.Get("X-Test"), string(b)})
	if r.fail {
		return nil, errors.New("upstream down")
	}
	return &deferq.Result{Status: http.StatusCreated, Body: []byte("done " + string(b))}, nil
}

func (r *recorder) set(fail bool) {
	r.mu.Lock()
	r.fail = fail
	r.mu.Unlock()
}

func (r *recorder) seen() []attempt {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]attempt(nil), r.attempts...)
}

// kill dead-letters every queued request with r failing: Once until the
// queue is empty.
func kill(t *testing.T, q *deferq.Queue, r *recorder) {
	t.Helper()
	r.set(true)
	deadline := time.Now().Add(20 * time.Second)
	for {
		if n, _ := q.Len(context.Background()); n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the queue did not empty into the dead-letter stream in 20 s")
		}
		onceUntil(t, q, r.deliver)
	}
}

// TestRequeue: a request dead-lettered after MaxDeliveries (2) failed
// attempts is requeued: its poll answers 202 pending again (was 502), it
// leaves the dead-letter stream, and it is delivered as a fresh one, the
// same method, URI, header, body and Idempotency-Key as its first
// attempts; its delivery count starts again (dead again after exactly 2
// more failed attempts, then requeued and delivered once, its result at
// its first poll location). Requeueing it once more, an unknown id or a
// malformed one is ErrNotDead; into a full queue, ErrFull with nothing
// moved.
func TestRequeue(t *testing.T) {
	srv := redistest.Standalone(t)
	q := newQueue(t, srv.Addr, deferq.Options{MaxDeliveries: 2, MaxLen: 2, ClaimIdle: 30 * time.Millisecond, Block: 5 * time.Millisecond})
	f := front(t, q)
	ctx := context.Background()
	loc := accept(t, f, 1)[0]
	r := &recorder{}
	kill(t, q, r)
	first := r.seen()
	if len(first) != 2 {
		t.Fatalf("attempts before the dead letter: %+v; want 2", first)
	}
	if st, _, _ := get(t, f.URL+loc); st != http.StatusBadGateway {
		t.Fatalf("poll of the dead letter: %d, want 502", st)
	}
	id := sidOf(loc)
	if err := q.Requeue(ctx, id); err != nil {
		t.Fatalf("Requeue(%s): %v", id, err)
	}
	if st, body, _ := get(t, f.URL+loc); st != http.StatusAccepted {
		t.Errorf("poll after the requeue: %d %q, want 202 pending", st, body)
	}
	if n, _ := q.DeadLen(ctx); n != 0 {
		t.Errorf("DeadLen after the requeue = %d, want 0", n)
	}
	if n, _ := q.Len(ctx); n != 1 {
		t.Errorf("Len after the requeue = %d, want 1", n)
	}
	if err := q.Requeue(ctx, id); !errors.Is(err, deferq.ErrNotDead) {
		t.Errorf("a second Requeue: %v, want ErrNotDead", err)
	}

	// its delivery count starts again: exactly 2 more attempts, then dead
	kill(t, q, r)
	again := r.seen()[len(first):]
	if len(again) != 2 {
		t.Fatalf("attempts after the requeue: %+v; want 2 (MaxDeliveries again)", again)
	}
	for _, a := range again {
		if a != first[0] {
			t.Errorf("a requeued attempt %+v; want it as the first, %+v", a, first[0])
		}
	}
	if first[0].key != keyOf(loc) || first[0].hdr != "hdr-body0" || first[0].uri != "/orders?n=0" || first[0].body != "body0" {
		t.Errorf("the first attempt: %+v", first[0])
	}
	if st, _, _ := get(t, f.URL+loc); st != http.StatusBadGateway {
		t.Errorf("poll of the dead letter again: %d, want 502", st)
	}

	// requeued again, into a full queue: refused, nothing moved
	more := accept(t, f, 2) // MaxLen 2
	if err := q.Requeue(ctx, id); !errors.Is(err, deferq.ErrFull) {
		t.Errorf("Requeue into a full queue: %v, want ErrFull", err)
	}
	if n, _ := q.DeadLen(ctx); n != 1 {
		t.Errorf("DeadLen after a refused requeue = %d, want 1", n)
	}
	r.set(false)
	for range 2 {
		onceUntil(t, q, r.deliver)
	}
	for _, l := range more {
		if st, _, _ := get(t, f.URL+l); st != http.StatusCreated {
			t.Errorf("the 2 others: poll %d", st)
		}
	}

	// requeued once more, delivered once, its result at its first location
	if err := q.Requeue(ctx, id); err != nil {
		t.Fatal(err)
	}
	n := len(r.seen())
	onceUntil(t, q, r.deliver)
	last := r.seen()[n:]
	if len(last) != 1 || last[0] != first[0] {
		t.Errorf("the delivery after the requeue: %+v; want one, as the first %+v", last, first[0])
	}
	if st, body, _ := get(t, f.URL+loc); st != http.StatusCreated || body != "done body0" {
		t.Errorf("poll after delivery: %d %q, want 201 \"done body0\"", st, body)
	}
	if n, _ := q.Len(ctx); n != 0 {
		t.Errorf("Len at the end = %d", n)
	}
	for _, bad := range []string{"1-1", "0-0", "x", "", "1-1.000000000000000000000000", strings.Repeat("9", 30) + "-1", id} {
		if err := q.Requeue(ctx, bad); !errors.Is(err, deferq.ErrNotDead) {
			t.Errorf("Requeue(%q): %v, want ErrNotDead", bad, err)
		}
	}
}

// TestRequeueConcurrent: 16 Requeues of one dead letter at once, on two
// clients: exactly one moves it, the others are ErrNotDead; the queue
// holds it once and it is delivered once. RequeueAll moves every dead
// letter there is (3) and none twice.
func TestRequeueConcurrent(t *testing.T) {
	srv := redistest.Standalone(t)
	o := deferq.Options{MaxDeliveries: 1, ClaimIdle: 30 * time.Millisecond, Block: 5 * time.Millisecond}
	q := newQueue(t, srv.Addr, o)
	q2 := newQueue(t, srv.Addr, o)
	f := front(t, q)
	ctx := context.Background()
	loc := accept(t, f, 1)[0]
	r := &recorder{}
	kill(t, q, r)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := range 16 {
		qq := []*deferq.Queue{q, q2}[i%2]
		wg.Go(func() { errs <- qq.Requeue(ctx, sidOf(loc)) })
	}
	wg.Wait()
	close(errs)
	ok, notDead := 0, 0
	for err := range errs {
		switch {
		case err == nil:
			ok++
		case errors.Is(err, deferq.ErrNotDead):
			notDead++
		default:
			t.Errorf("a concurrent Requeue: %v", err)
		}
	}
	if ok != 1 || notDead != 15 {
		t.Errorf("16 Requeues at once: %d moved, %d ErrNotDead; want 1 and 15", ok, notDead)
	}
	if n, _ := q.Len(ctx); n != 1 {
		t.Errorf("Len = %d, want the one requeued once", n)
	}
	if n, _ := q.DeadLen(ctx); n != 0 {
		t.Errorf("DeadLen = %d, want 0", n)
	}
	r.set(false)
	before := len(r.seen())
	onceUntil(t, q, r.deliver)
	if ok, err := q.Once(ctx, "w", r.deliver); ok || err != nil {
		t.Errorf("a second Once: %v, %v; want nothing left", ok, err)
	}
	if got := r.seen()[before:]; len(got) != 1 || got[0].key != keyOf(loc) {
		t.Errorf("deliveries after the requeue: %+v; want one, key %s", got, keyOf(loc))
	}

	locs := accept(t, f, 3)
	kill(t, q, r)
	if n, _ := q.DeadLen(ctx); n != 3 {
		t.Fatalf("DeadLen = %d, want 3", n)
	}
	var moved [2]int
	for i, qq := range []*deferq.Queue{q, q2} {
		wg.Go(func() {
			n, err := qq.RequeueAll(ctx)
			if err != nil {
				t.Errorf("RequeueAll: %v", err)
			}
			moved[i] = n
		})
	}
	wg.Wait()
	if moved[0]+moved[1] != 3 {
		t.Errorf("two RequeueAll at once moved %v; want 3 in all", moved)
	}
	if n, _ := q.Len(ctx); n != 3 {
		t.Errorf("Len after RequeueAll = %d, want 3", n)
	}
	for _, l := range locs {
		if st, _, _ := get(t, f.URL+l); st != http.StatusAccepted {
			t.Errorf("poll of a requeued request: %d, want 202", st)
		}
	}
	if n, err := q.RequeueAll(ctx); n != 0 || err != nil {
		t.Errorf("RequeueAll with no dead letters: %d, %v", n, err)
	}
}

// TestDeadIndexBounded: the dead-letter stream's index follows its cap:
// with MaxDead 2 and 4 dead letters, the 2 dropped are ErrNotDead and the
// index holds 2 ids (it would otherwise grow with every dead letter).
func TestDeadIndexBounded(t *testing.T) {
	srv := redistest.Standalone(t)
	q := newQueue(t, srv.Addr, deferq.Options{MaxDeliveries: 1, MaxDead: 2, ClaimIdle: 30 * time.Millisecond, Block: 5 * time.Millisecond})
	f := front(t, q)
	locs := accept(t, f, 4)
	kill(t, q, &recorder{})
	ctx := context.Background()
	c := client(t, srv.Addr)
	if n, err := c.Do(ctx, c.B().Hlen().Key("{floodgate:defer:orders}:deadidx").Build()).AsInt64(); err != nil || n != 2 {
		t.Errorf("index entries: %d, %v; want 2", n, err)
	}
	ds, _ := q.DeadLetters(ctx, 10)
	kept := map[string]bool{}
	for _, d := range ds {
		kept[d.ID] = true
	}
	for _, l := range locs {
		err := q.Requeue(ctx, sidOf(l))
		if kept[sidOf(l)] != (err == nil) {
			t.Errorf("Requeue(%s): %v (kept: %v)", sidOf(l), err, kept)
		}
	}
	if n := len(kept); n != 2 {
		t.Errorf("kept %d, want 2", n)
	}

}

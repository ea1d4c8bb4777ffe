package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/redistest"
	"github.com/floodgate/floodgate/redisstore"
)

// fcalls returns how many FCALLs Redis at addr has run.
func fcalls(t *testing.T, addr string) int {
	t.Helper()
	out, err := redistest.Cmd(addr, "INFO", "commandstats")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_fcall:calls="); ok {
			n, _ := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
			return n
		}
	}
	return 0
}

// Concurrent callers' decisions share calls, and every key still admits
// exactly its limit.
func TestCoalescedConcurrentExact(t *testing.T) {
	srv := redistest.Standalone(t)
	s, err := redisstore.New("redis://"+srv.Addr, redisstore.Options{ClientTime: true, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !redisstore.Coalescing(s) {
		t.Fatal("a standalone store does not coalesce")
	}
	p := floodgate.MustPolicy("co", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 25, Period: time.Hour})
	now := time.Date(2026, 5, 1, 0, 10, 0, 0, time.UTC).UnixMicro() // the same instant for every call
	const keys, callers, perCaller = 16, 64, 20
	admitted := make([]atomic.Int64, keys)
	before := fcalls(t, srv.Addr)
	var wg sync.WaitGroup
	for c := range callers {
		wg.Go(func() {
			for i := range perCaller {
				k := (c + i) % keys
				d, err := s.Do(context.Background(), now, p.Op(floodgate.OpAllow, fmt.Sprint("k", k), 1, 0))
				if err != nil || d.Degraded {
					t.Errorf("caller %d: %+v %v", c, d, err)
					return
				}
				if d.Allowed {
					admitted[k].Add(1)
				}
			}
		})
	}
	wg.Wait()
	for k := range admitted {
		if n := admitted[k].Load(); n != 25 {
			t.Errorf("key %d admitted %d, want exactly 25", k, n)
		}
	}
	calls := fcalls(t, srv.Addr) - before
	if decisions := callers * perCaller; calls >= decisions/2 {
		t.Errorf("%d decisions took %d calls: they were not combined", decisions, calls)
	}
	t.Logf("%d decisions in %d calls", callers*perCaller, calls)
	if st := s.Stats(); st.Errors != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// A caller that gives up while queued behind a batch is never decided; the
// batch in flight completes.
func TestCoalescedCallerLeavesQueue(t *testing.T) {
	srv := redistest.Standalone(t)
	s, err := redisstore.New("redis://"+srv.Addr, redisstore.Options{Timeout: 10 * time.Second, Batches: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	p := floodgate.MustPolicy("q", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 5, Period: time.Hour})
	ctx := context.Background()
	if _, err := s.Do(ctx, 0, p.Op(floodgate.OpAllow, "warm", 1, 0)); err != nil { // loads the library
		t.Fatal(err)
	}

	srv.Pause()
	first := make(chan floodgate.Decision)
	go func() {
		d, err := s.Do(ctx, 0, p.Op(floodgate.OpAllow, "first", 1, 0))
		if err != nil {
			t.Error(err)
		}
		first <- d
	}()
	waitUntil(t, "the first call in flight", func() bool { in, _ := redisstore.CoalescerState(s); return in == 1 })
	qctx, cancel := context.WithCancel(ctx)
	left := make(chan error)
	go func() {
		_, err := s.Do(qctx, 0, p.Op(floodgate.OpAllow, "queued", 1, 0))
		left <- err
	}()
	waitUntil(t, "the second call queued", func() bool { _, q := redisstore.CoalescerState(s); return q == 1 })
	cancel()
	if err := <-left; !errors.Is(err, context.Canceled) {
		t.Fatalf("queued caller that gave up: %v, want context.Canceled", err)
	}
	srv.Resume()
	if d := <-first; !d.Allowed || d.Degraded || d.Remaining != 4 {
		t.Fatalf("the call in flight: %+v", d)
	}
	waitUntil(t, "the coalescer idle", func() bool { in, q := redisstore.CoalescerState(s); return in == 0 && q == 0 })
	if d, _ := s.Do(ctx, 0, p.Op(floodgate.OpPeek, "queued", 0, 0)); d.Remaining != 5 {
		t.Fatalf("the abandoned call was decided: remaining %d, want 5", d.Remaining)
	}
}

// In one batch, a key whose state is unreadable fails alone: its rules'
// failure modes decide it, and the other keys are decided by Redis. A
// batch that finds the library gone loads it again.
func TestBatchOneBadKey(t *testing.T) {
	srv := redistest.Standalone(t)
	s, err := redisstore.New("redis://"+srv.Addr, redisstore.Options{ClientTime: true, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	p := floodgate.MustPolicy("bad", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 5, Period: time.Hour, OnStoreFailure: floodgate.FailClosed})
	ctx := context.Background()
	now := time.Date(2026, 5, 1, 0, 10, 0, 0, time.UTC).UnixMicro()
	if _, err := redistest.Cmd(srv.Addr, "SET", s.Key("bad", "b"), "\xc1 not msgpack"); err != nil {
		t.Fatal(err)
	}
	redistest.Cmd(srv.Addr, "FUNCTION", "FLUSH")
	ops := []floodgate.Op{p.Op(floodgate.OpAllow, "a", 1, 0), p.Op(floodgate.OpAllow, "b", 1, 0), p.Op(floodgate.OpAllow, "c", 1, 0)}
	out := make([]floodgate.Decision, 3)
	if err := s.DoBatch(ctx, now, ops, out); err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{0, 2} {
		if d := out[i]; !d.Allowed || d.Degraded || d.Remaining != 4 {
			t.Errorf("good key %d: %+v", i, d)
		}
	}
	if d := out[1]; d.Allowed || !d.Degraded {
		t.Errorf("unreadable key: %+v, want refused by its fail-closed rule", d)
	}
	if st := s.Stats(); st.Errors != 1 || st.Degraded != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

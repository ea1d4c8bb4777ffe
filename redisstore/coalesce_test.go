package redisstore_test

import (
	"context"
	"encoding/binary"
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
// exactly its limit. Each round holds Redis (SIGSTOP) until every caller
// is in flight or queued, so the round's decisions meet in the coalescer
// however the host schedules the callers.
func TestCoalescedConcurrentExact(t *testing.T) {
	srv := redistest.Standalone(t)
	// One call slot: with Redis held, the first caller's call is in
	// flight and every other caller queued, whatever the scheduling.
	// The near cache off: the callers refused here would not reach the
	// coalescer.
	s := openStore(t, srv, redisstore.Options{ClientTime: true, Timeout: 30 * time.Second, Batches: 1, NoNearCache: true})
	if !redisstore.Coalescing(s) {
		t.Fatal("a standalone store does not coalesce")
	}
	p := floodgate.MustPolicy("co", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 25, Period: time.Hour})
	now := time.Date(2026, 5, 1, 0, 10, 0, 0, time.UTC).UnixMicro()                                  // the same instant for every call
	if _, err := s.Do(context.Background(), now, p.Op(floodgate.OpPeek, "warm", 1, 0)); err != nil { // loads the library
		t.Fatal(err)
	}
	const keys, callers, rounds = 16, 64, 20
	admitted := make([]atomic.Int64, keys)
	before := fcalls(t, srv.Addr)
	for i := range rounds {
		srv.Pause()
		var wg sync.WaitGroup
		for c := range callers {
			wg.Go(func() {
				k := (c + i) % keys
				d, err := s.Do(context.Background(), now, p.Op(floodgate.OpAllow, fmt.Sprint("k", k), 1, 0))
				if err != nil || d.Degraded {
					t.Errorf("round %d, caller %d: %+v %v", i, c, d, err)
					return
				}
				if d.Allowed {
					admitted[k].Add(1)
				}
			})
		}
		for deadline := time.Now().Add(30 * time.Second); ; {
			if inflight, queued := redisstore.CoalescerState(s); inflight == 1 && queued == callers-1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: the callers never all reached the coalescer", i)
			}
			time.Sleep(time.Millisecond)
		}
		srv.Resume()
		wg.Wait()
	}
	for k := range admitted {
		if n := admitted[k].Load(); n != 25 {
			t.Errorf("key %d admitted %d, want exactly 25", k, n)
		}
	}
	calls := fcalls(t, srv.Addr) - before
	if decisions := callers * rounds; calls >= decisions/4 {
		t.Errorf("%d decisions took %d calls: they were not combined", decisions, calls)
	}
	t.Logf("%d decisions in %d calls", callers*rounds, calls)
	if st := s.Stats(); st.Errors != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// A caller that gives up while queued behind a batch is never decided; the
// batch in flight completes.
func TestCoalescedCallerLeavesQueue(t *testing.T) {
	srv := redistest.Standalone(t)
	s := openStore(t, srv, redisstore.Options{Timeout: 10 * time.Second, Batches: 1})
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
// batch that finds the library gone loads it again. On the caller's
// clock and on Redis's (the packed function's fast path), for a value
// that is no state and for a key of another type (a list: GET itself
// fails).
func TestBatchOneBadKey(t *testing.T) {
	srv := redistest.Standalone(t)
	for _, clientTime := range []bool{true, false} {
		for _, bad := range []string{"string", "list"} {
			t.Run(fmt.Sprintf("clientTime=%v/%s", clientTime, bad), func(t *testing.T) {
				oneBadKey(t, srv, clientTime, bad)
			})
		}
	}
}

func oneBadKey(t *testing.T, srv *redistest.Server, clientTime bool, bad string) {
	s := openStore(t, srv, redisstore.Options{ClientTime: clientTime, Timeout: 5 * time.Second, Prefix: fmt.Sprint("obk", clientTime, bad)})
	p := floodgate.MustPolicy("bad", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 5, Period: time.Hour, OnStoreFailure: floodgate.FailClosed})
	ctx := context.Background()
	now := time.Now().UnixMicro()
	var err error
	if bad == "list" {
		_, err = redistest.Cmd(srv.Addr, "RPUSH", s.Key("bad", "b"), "x")
	} else {
		_, err = redistest.Cmd(srv.Addr, "SET", s.Key("bad", "b"), "\xc1 not msgpack")
	}
	if err != nil {
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

// A batch of decisions under several policies (calendar rules among them,
// each sent once per batch) decides as separate calls do.
func TestBatchMixedPolicies(t *testing.T) {
	srv := redistest.Standalone(t)
	opts := redisstore.Options{ClientTime: true, Timeout: 5 * time.Second, Prefix: "mixb"}
	batched := openStore(t, srv, opts)
	opts.Prefix, opts.NoCoalescing = "mixs", true
	single := openStore(t, srv, opts)
	paris, _ := time.LoadLocation("Europe/Paris")
	pols := []*floodgate.Policy{
		floodgate.MustPolicy("day", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 7, Calendar: floodgate.CalendarDay, Location: paris}),
		floodgate.MustPolicy("tb", floodgate.Rule{Algorithm: floodgate.TokenBucket, Limit: 3, Period: time.Second, Burst: 5}),
		floodgate.MustPolicy("two", floodgate.Rule{Name: "s", Algorithm: floodgate.SlidingLog, Limit: 4, Period: time.Minute},
			floodgate.Rule{Name: "w", Algorithm: floodgate.FixedWindow, Limit: 6, Calendar: floodgate.CalendarWeek, Location: paris}),
	}
	ctx := context.Background()
	now := time.Date(2026, 3, 28, 23, 59, 0, 0, time.UTC).UnixMicro() // Paris changes clocks that night
	for round := range 40 {
		now += int64(round%4) * 700_000
		var ops []floodgate.Op
		for i := range 1 + round%5 {
			p := pols[(round+i)%len(pols)]
			ops = append(ops, p.Op(floodgate.OpAllow, fmt.Sprint("k", (round+i)%3), 1, 0))
		}
		got, want := make([]floodgate.Decision, len(ops)), make([]floodgate.Decision, len(ops))
		if err := batched.DoBatch(ctx, now, ops, got); err != nil {
			t.Fatal(err)
		}
		if err := single.DoBatch(ctx, now, ops, want); err != nil {
			t.Fatal(err)
		}
		for i := range ops {
			if got[i] != want[i] {
				t.Fatalf("round %d op %d (%s %s): batched %+v, single %+v", round, i, ops[i].Policy.Name(), ops[i].Key, got[i], want[i])
			}
		}
	}
	for _, s := range []*redisstore.Store{batched, single} {
		if st := s.Stats(); st.Errors != 0 || st.Degraded != 0 {
			t.Fatalf("stats %+v", st)
		}
	}
}

// A slot's own connection that breaks (killed by the server here) fails
// one call, which its rules' failure modes decide, and is replaced: the
// next calls are Redis's again.
func TestCoalescerReplacesBrokenConnection(t *testing.T) {
	srv := redistest.Standalone(t)
	s := openStore(t, srv, redisstore.Options{ClientTime: true, Timeout: 5 * time.Second})
	p := floodgate.MustPolicy("conn", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 100, Period: time.Hour, OnStoreFailure: floodgate.FailOpen})
	ctx := context.Background()
	now := time.Date(2026, 5, 1, 0, 10, 0, 0, time.UTC).UnixMicro()
	do := func() floodgate.Decision {
		t.Helper()
		d, err := s.Do(ctx, now, p.Op(floodgate.OpAllow, "k", 1, 0))
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	if d := do(); d.Degraded || d.Remaining != 99 {
		t.Fatalf("before: %+v", d)
	}
	if _, err := redistest.Cmd(srv.Addr, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"); err != nil {
		t.Fatal(err)
	}
	degraded := 0
	if do().Degraded { // the killed connection's call, at most
		degraded++
	}
	for i := range 4 {
		if d := do(); d.Degraded {
			t.Fatalf("call %d after the kill: %+v; the broken connection was kept", i+2, d)
		}
	}
	// Seven calls in all, the degraded one not counted by Redis.
	if d, want := do(), int64(100-7+degraded); d.Remaining != want {
		t.Fatalf("remaining %d, want %d: every call Redis answered counts", d.Remaining, want)
	}
	if degraded != 1 {
		t.Logf("the killed connection's call was not degraded (rueidis noticed first)")
	}
}

// openStore opens a store on srv, closed when the test ends.
func openStore(t *testing.T, srv *redistest.Server, opts redisstore.Options) *redisstore.Store {
	t.Helper()
	s, err := redisstore.New("redis://"+srv.Addr, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// batchCommand returns a store on a redis-server of the test's own, a
// policy of 5 an hour named name, a time, two decisions under it (a: 1,
// b: 2) and the command that makes them together.
func batchCommand(t *testing.T, name string) (*redisstore.Store, *floodgate.Policy, int64, []floodgate.Op, []string) {
	t.Helper()
	s := openStore(t, redistest.Standalone(t), redisstore.Options{ClientTime: true, Timeout: 5 * time.Second})
	p := floodgate.MustPolicy(name, floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 5, Period: time.Hour})
	now := time.Date(2026, 5, 1, 0, 10, 0, 0, time.UTC).UnixMicro()
	ops := []floodgate.Op{p.Op(floodgate.OpAllow, "a", 1, 0), p.Op(floodgate.OpAllow, "b", 2, 0)}
	cmd, err := s.BatchFunctionCommand(context.Background(), now, ops)
	if err != nil {
		t.Fatal(err)
	}
	return s, p, now, ops, cmd
}

// BatchFunctionCommand is the call releases before PackedFunction sent for decisions made
// together: run by hand, it decides them, as tools replaying it expect.
func TestBatchFunctionCommand(t *testing.T) {
	s, p, now, ops, cmd := batchCommand(t, "bc")
	ctx := context.Background()
	if cmd[0] != "FCALL" || cmd[1] != redisstore.BatchFunction || cmd[2] != "2" {
		t.Fatalf("command %q", cmd[:3])
	}
	c := s.Client()
	for run := 1; run <= 2; run++ {
		replies, err := c.Do(ctx, c.B().Arbitrary(cmd[0]).Args(cmd[1:]...).Build()).ToArray()
		if err != nil || len(replies) != 2 {
			t.Fatalf("run %d: %v %v", run, replies, err)
		}
		for i, r := range replies {
			b, err := r.ToString()
			if err != nil || len(b) != 52 {
				t.Fatalf("run %d decision %d: %q %v", run, i, b, err)
			}
			remaining := int64(binary.BigEndian.Uint64([]byte(b[12:20])))
			if want := 5 - int64(run)*ops[i].Cost; b[0] != 1 || remaining != want {
				t.Fatalf("run %d decision %d: allowed %d remaining %d, want 1 and %d", run, i, b[0], remaining, want)
			}
		}
	}
	if d, _ := s.Do(ctx, now, p.Op(floodgate.OpPeek, "b", 0, 0)); d.Remaining != 1 {
		t.Fatalf("b remaining %d after two runs of cost 2, want 1", d.Remaining)
	}
}

// The library keeps the batch function of releases before groups, whose
// decisions carry no group byte, for instances of those releases sharing
// the Redis during an upgrade.
func TestLegacyBatchFunction(t *testing.T) {
	s, _, _, ops, cmd := batchCommand(t, "legacy")
	ctx := context.Background()
	// FCALL fn 2 key key 1 1 name sig packed packed: the old layout has
	// no group byte after the policy index.
	cmd[1] = "floodgate_v1_batch"
	for i := len(cmd) - 2; i < len(cmd); i++ {
		if len(cmd[i]) != 2+1+5*8 || cmd[i][2] != 0 {
			t.Fatalf("packed decision %q", cmd[i])
		}
		cmd[i] = cmd[i][:2] + cmd[i][3:]
	}
	c := s.Client()
	replies, err := c.Do(ctx, c.B().Arbitrary(cmd[0]).Args(cmd[1:]...).Build()).ToArray()
	if err != nil || len(replies) != 2 {
		t.Fatalf("%v %v", replies, err)
	}
	for i, r := range replies {
		b, err := r.ToString()
		if err != nil || len(b) != 52 || b[0] != 1 || int64(binary.BigEndian.Uint64([]byte(b[12:20]))) != 5-ops[i].Cost {
			t.Fatalf("decision %d: %q %v", i, b, err)
		}
	}
}

// A batch carries at most MaxBatch decisions: ten callers queued behind
// one call in flight go in batches of three.
func TestCoalescerMaxBatch(t *testing.T) {
	srv := redistest.Standalone(t)
	s := openStore(t, srv, redisstore.Options{Timeout: 10 * time.Second, Batches: 1, MaxBatch: 3})
	p := floodgate.MustPolicy("mb", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 5, Period: time.Hour})
	ctx := context.Background()
	if _, err := s.Do(ctx, 0, p.Op(floodgate.OpAllow, "warm", 1, 0)); err != nil { // loads the library
		t.Fatal(err)
	}
	before := fcalls(t, srv.Addr)
	srv.Pause()
	var wg sync.WaitGroup
	do := func(key string) {
		wg.Go(func() {
			if d, err := s.Do(ctx, 0, p.Op(floodgate.OpAllow, key, 1, 0)); err != nil || !d.Allowed || d.Degraded || d.Remaining != 4 {
				t.Errorf("%s: %+v %v", key, d, err)
			}
		})
	}
	do("first")
	waitUntil(t, "the first call in flight", func() bool { in, _ := redisstore.CoalescerState(s); return in == 1 })
	for i := range 9 {
		do(fmt.Sprint("queued", i))
	}
	waitUntil(t, "nine callers queued", func() bool { _, q := redisstore.CoalescerState(s); return q == 9 })
	srv.Resume()
	wg.Wait()
	if calls := fcalls(t, srv.Addr) - before; calls != 4 {
		t.Fatalf("%d calls, want 4: the first alone, then three batches of three", calls)
	}
}

// The batch function keeps its list of policies between calls (no table
// built per call): a decision naming a policy its own call lacks must
// fail, never be decided under a policy an earlier call left there, nor
// charge its key.
func TestBatchStalePolicyIndex(t *testing.T) {
	s := openStore(t, redistest.Standalone(t), redisstore.Options{ClientTime: true, Timeout: 5 * time.Second})
	p1 := floodgate.MustPolicy("stale1", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 5, Period: time.Hour})
	p2 := floodgate.MustPolicy("stale2", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 9, Period: time.Hour})
	now := time.Date(2026, 5, 1, 0, 10, 0, 0, time.UTC).UnixMicro()
	ctx := context.Background()
	// two policies: the function's list holds both after this call
	two, err := s.BatchFunctionCommand(ctx, now, []floodgate.Op{p1.Op(floodgate.OpAllow, "x", 1, 0), p2.Op(floodgate.OpAllow, "y", 1, 0)})
	if err != nil {
		t.Fatal(err)
	}
	c := s.Client()
	if _, err := c.Do(ctx, c.B().Arbitrary(two[0]).Args(two[1:]...).Build()).ToArray(); err != nil {
		t.Fatal(err)
	}
	// one policy, its decision pointing at policy 2
	one, err := s.BatchFunctionCommand(ctx, now, []floodgate.Op{p1.Op(floodgate.OpAllow, "z", 1, 0)})
	if err != nil {
		t.Fatal(err)
	}
	if one[3+1] != "1" { // FCALL fn 1 key, then the policy count
		t.Fatalf("policy count %q, want 1", one[4])
	}
	last := len(one) - 1
	if one[last][:2] != "\x00\x01" {
		t.Fatalf("packed decision %q: policy index not 1", one[last])
	}
	one[last] = "\x00\x02" + one[last][2:]
	replies, err := c.Do(ctx, c.B().Arbitrary(one[0]).Args(one[1:]...).Build()).ToArray()
	if err == nil {
		b, serr := replies[0].ToString()
		if serr == nil {
			t.Fatalf("a decision under a policy its call lacks was decided: %q", b)
		}
	}
	if d, err := s.Do(ctx, now, p1.Op(floodgate.OpPeek, "z", 0, 0)); err != nil || d.Remaining != 5 {
		t.Fatalf("z: %+v %v, want 5 remaining: the failed decision charged it", d, err)
	}
}

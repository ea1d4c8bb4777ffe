package redisstore_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/redistest"
	"github.com/floodgate/floodgate/redisstore"
)

// stopSelf starves this process for d, for real and deterministically: a
// child stops it (SIGSTOP) and resumes it (SIGCONT) d later. It returns
// once the process runs again. What a load average of 15 on 2 cores does
// to a process in bursts, every goroutine at once, while Redis (another
// process) answers as usual.
func stopSelf(t *testing.T, d time.Duration) {
	t.Helper()
	pid := os.Getpid()
	cmd := exec.Command("sh", "-c", fmt.Sprintf("kill -STOP %d; sleep %.3f; kill -CONT %d", pid, d.Seconds(), pid))
	if err := cmd.Run(); err != nil {
		t.Fatalf("stopping this process for %v: %v", d, err)
	}
}

// callers keeps n goroutines deciding on s until the returned function is
// called, which waits for them.
func callers(t *testing.T, s *redisstore.Store, p *floodgate.Policy, n int) func() {
	var stop atomic.Bool
	var wg sync.WaitGroup
	for g := range n {
		wg.Go(func() {
			for i := 0; !stop.Load(); i++ {
				if _, err := s.Do(context.Background(), time.Now().UnixMicro(), floodgate.Op{Policy: p, Key: fmt.Sprint("k", g, i%10), Cost: 1}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	return func() { stop.Store(true); wg.Wait() }
}

// A healthy Redis with this process starved does not open the breaker:
// the calls in flight while the process was stopped find their deadlines
// passed when it runs again, and are degraded (their callers' time is
// gone), but none is counted against Redis, which answered all along.
// Before, each stop opened the breaker (the queued callers' timeouts were
// failures in a row), and with it every decision went to the failure
// modes for the cooldown (here a minute, so that an opening stays seen).
func TestStarvedProcessKeepsBreakerClosed(t *testing.T) {
	redistest.Require(t)
	srv := redistest.Standalone(t)
	s, err := redisstore.New("redis://"+srv.Addr, redisstore.Options{Timeout: 50 * time.Millisecond, BreakerCooldown: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	p := floodgate.MustPolicy("starved", floodgate.Rule{Name: "r", Algorithm: floodgate.FixedWindow, Limit: 1 << 40, Period: time.Hour})
	if d, err := s.Do(context.Background(), time.Now().UnixMicro(), floodgate.Op{Policy: p, Key: "warm", Cost: 1}); err != nil || d.Degraded {
		t.Fatalf("healthy: %+v %v", d, err)
	}
	done := callers(t, s, p, 32)
	before := s.Stats()
	for range 5 {
		time.Sleep(100 * time.Millisecond) // calls in flight and queued
		stopSelf(t, 300*time.Millisecond)  // six timeouts long
		time.Sleep(100 * time.Millisecond) // the late calls are noticed
	}
	done()
	st := s.Stats()
	t.Logf("stats: %+v", st)
	if st.Timeouts == before.Timeouts {
		t.Fatal("no call timed out while the process was stopped: the test starved nothing")
	}
	// A decision the breaker sent to the failure modes is degraded without
	// a call: every degraded decision must be a call that timed out.
	timeouts, degraded := st.Timeouts-before.Timeouts, st.Degraded-before.Degraded
	if st.Breaker || degraded != timeouts {
		t.Fatalf("the breaker opened on a healthy Redis while this process was starved: %d timeouts, %d decisions degraded (breaker open at the end: %v)",
			timeouts, degraded, st.Breaker)
	}
	// and Redis decides again at once
	if d, err := s.Do(context.Background(), time.Now().UnixMicro(), floodgate.Op{Policy: p, Key: "after", Cost: 1}); err != nil || d.Degraded {
		t.Fatalf("after the stops: %+v %v", d, err)
	}
}

// timedCall is one decision on a Redis that does not answer: how long it
// took and whether its failure was excused as this process's starvation
// (Stats.Starved) rather than held against Redis.
type timedCall struct {
	at, took time.Duration // since the pause; the call's
	excused  bool
}

// decideTimed makes one decision and reports it (at: since t0).
func decideTimed(t *testing.T, s *redisstore.Store, p *floodgate.Policy, t0 time.Time) timedCall {
	t.Helper()
	before := s.Stats().Starved
	start := time.Now()
	d, err := s.Do(context.Background(), start.UnixMicro(), floodgate.Op{Policy: p, Key: "k", Cost: 1})
	if err != nil || !d.Degraded {
		t.Fatalf("a decision on a silent Redis: %+v %v; want degraded", d, err)
	}
	return timedCall{at: start.Sub(t0), took: time.Since(start), excused: s.Stats().Starved > before}
}

// silentStore returns a store with a 20ms timeout and a breaker that never
// opens (every call asks Redis) on a Redis that has answered it once and
// is now paused.
func silentStore(t *testing.T) (*redisstore.Store, *floodgate.Policy) {
	t.Helper()
	srv := redistest.Standalone(t)
	s, err := redisstore.New("redis://"+srv.Addr, redisstore.Options{Timeout: 20 * time.Millisecond, BreakerThreshold: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	p := floodgate.MustPolicy("lag", floodgate.Rule{Name: "r", Algorithm: floodgate.FixedWindow, Limit: 1 << 40, Period: time.Hour})
	// answered once (the first call loads the library: it may take longer
	// than 20ms on a busy machine)
	for i := 0; ; i++ {
		d, err := s.Do(context.Background(), time.Now().UnixMicro(), floodgate.Op{Policy: p, Key: "k", Cost: 1})
		if err == nil && !d.Degraded {
			break
		}
		if i == 100 {
			t.Fatalf("Redis never answered in 20ms: %+v %v", d, err)
		}
	}
	srv.Pause()
	t.Cleanup(srv.Resume)
	return s, p
}

// The store's side, with the lag told (a test's): a timeout during which
// this process lost a quarter of the call's time or more is not held
// against Redis, and one during which it lost less is. Redis is paused,
// so every call runs its 20ms out for real. (A call that fails at once,
// as some do while rueidis finds its connection gone, is not a timeout
// of this process's making, and counts whatever the lag.)
func TestStarvedTimeoutNotHeldAgainstRedis(t *testing.T) {
	s, p := silentStore(t)
	t0 := time.Now()
	const timeout = 20 * time.Millisecond
	check := func(lost func(span time.Duration) time.Duration, want bool) {
		t.Helper()
		redisstore.SetLag(s, func(from, to int64) time.Duration { return lost(time.Duration(to-from) * time.Microsecond) })
		timedOut := 0
		for range 20 {
			c := decideTimed(t, s, p, t0)
			if c.took < timeout {
				continue
			}
			timedOut++
			if c.excused != want {
				t.Errorf("a call that ran its %v out in %v: excused %v, want %v", timeout, c.took, c.excused, want)
			}
		}
		if timedOut < 10 {
			t.Fatalf("%d of 20 calls ran their timeout out: the test checked too few", timedOut)
		}
	}
	// (the excuse lasts while this process has run under 500ms since
	// Redis's last answer: 3/4 of the time lost leaves 2s for the test)
	check(func(span time.Duration) time.Duration { return span * 3 / 4 }, true) // most of its time lost
	check(func(span time.Duration) time.Duration { return span }, true)         // all of it
	check(func(time.Duration) time.Duration { return 4 * time.Millisecond }, false)
	check(func(time.Duration) time.Duration { return 0 }, false)
	t.Logf("%+v", s.Stats())
}

// The excuse is bounded: on a host where this process loses half of every
// span of time, a Redis that answers nothing has its timeouts held against
// it once this process has run max(500ms, 2 × the timeout) without an
// answer, lag excluded: here 1 s after the pause, so that the breaker
// still opens on a dead Redis on a busy host.
func TestStarvedExcuseEndsWithoutAnswers(t *testing.T) {
	s, p := silentStore(t)
	redisstore.SetLag(s, func(from, to int64) time.Duration { return time.Duration(to-from) * time.Microsecond / 2 })
	t0 := time.Now()
	var early, late int
	for time.Since(t0) < 1600*time.Millisecond {
		c := decideTimed(t, s, p, t0)
		switch {
		case c.took < 20*time.Millisecond:
		case c.at+c.took < 700*time.Millisecond:
			early++
			if !c.excused {
				t.Errorf("a timeout %v after the last answer (%v of this process's running time) was held against Redis", c.at+c.took, (c.at+c.took)/2)
			}
		case c.at > 1300*time.Millisecond:
			late++
			if c.excused {
				t.Errorf("a timeout %v after the last answer (%v of this process's running time) was excused", c.at, c.at/2)
			}
		}
	}
	if early < 5 || late < 5 {
		t.Fatalf("%d timeouts in the first 700ms, %d after 1.3s: too few to check", early, late)
	}
}

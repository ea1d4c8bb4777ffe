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

// answeredOnce decides until Redis answers one decision in time: the first
// call loads the library and makes a connection, which may take longer
// than the store's timeout on a busy machine, and a new connection after a
// timeout as well.
func answeredOnce(t *testing.T, s *redisstore.Store, p *floodgate.Policy) {
	t.Helper()
	for start := time.Now(); ; time.Sleep(10 * time.Millisecond) {
		d, err := s.Do(context.Background(), time.Now().UnixMicro(), floodgate.Op{Policy: p, Key: "warm", Cost: 1})
		if err == nil && !d.Degraded {
			return
		}
		if time.Since(start) > 20*time.Second {
			t.Fatalf("Redis never answered in time in 20s: %+v %v", d, err)
		}
	}
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
	answeredOnce(t, s, p)
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
	// a call: every degraded decision must be a call that failed. (Before,
	// this failed on every run, the breaker sending thousands to the
	// failure modes.)
	failed, degraded := st.Errors-before.Errors, st.Degraded-before.Degraded
	if st.BreakerOpens != 0 || degraded != failed {
		t.Fatalf("the breaker opened %d times on a healthy Redis while this process was starved: %d calls failed (%d timeouts, %d excused), %d decisions degraded",
			st.BreakerOpens, failed, st.Timeouts-before.Timeouts, st.Starved-before.Starved, degraded)
	}
	// and Redis decides again
	answeredOnce(t, s, p)
}

// timedCall is one decision on a Redis that does not answer: when it
// started, how long it took as the store saw it (from its start to its
// failure; 0 for a failure that was not a timeout), and whether its
// failure was excused as this process's starvation (Stats.Starved) rather
// than held against Redis.
type timedCall struct {
	at, took time.Duration
	excused  bool
}

// toldLag is a test's lag for a store (SetLag): lost(span) of every span
// of time the store asks about; it remembers the first span asked about
// since reset, the timed-out call's own.
type toldLag struct {
	lost  func(span time.Duration) time.Duration
	mu    sync.Mutex
	first time.Duration
	asked bool
}

func (l *toldLag) starved(from, to int64) time.Duration {
	span := time.Duration(to-from) * time.Microsecond
	l.mu.Lock()
	if !l.asked {
		l.first, l.asked = span, true
	}
	l.mu.Unlock()
	return l.lost(span)
}

// decideTimed makes one decision and reports it (at: since t0).
func decideTimed(t *testing.T, s *redisstore.Store, p *floodgate.Policy, t0 time.Time, lag *toldLag) timedCall {
	t.Helper()
	before := s.Stats().Starved
	lag.mu.Lock()
	lag.asked, lag.first = false, 0
	lag.mu.Unlock()
	start := time.Now()
	d, err := s.Do(context.Background(), start.UnixMicro(), floodgate.Op{Policy: p, Key: "k", Cost: 1})
	if err != nil || !d.Degraded {
		t.Fatalf("a decision on a silent Redis: %+v %v; want degraded", d, err)
	}
	lag.mu.Lock()
	defer lag.mu.Unlock()
	return timedCall{at: start.Sub(t0), took: lag.first, excused: s.Stats().Starved > before}
}

// silentStore returns a store with a 20ms timeout and a breaker that never
// opens (every call asks Redis), and its Redis, which has answered it and
// is now paused; resume answers once more and pauses again.
func silentStore(t *testing.T) (s *redisstore.Store, p *floodgate.Policy, resume func()) {
	t.Helper()
	srv := redistest.Standalone(t)
	s, err := redisstore.New("redis://"+srv.Addr, redisstore.Options{Timeout: 20 * time.Millisecond, BreakerThreshold: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	p = floodgate.MustPolicy("lag", floodgate.Rule{Name: "r", Algorithm: floodgate.FixedWindow, Limit: 1 << 40, Period: time.Hour})
	answeredOnce(t, s, p)
	srv.Pause()
	t.Cleanup(srv.Resume)
	return s, p, func() {
		srv.Resume()
		answeredOnce(t, s, p)
		srv.Pause()
	}
}

// The store's side, with the lag told (a test's): a timeout during which
// this process lost a quarter of the call's time or more is not held
// against Redis, and one during which it lost less is. Redis is paused,
// so every call runs its 20ms out for real, shortly after Redis last
// answered. (A call that fails at once, as some do while rueidis finds its
// connection gone, is not a timeout of this process's making, and counts
// whatever the lag.)
func TestStarvedTimeoutNotHeldAgainstRedis(t *testing.T) {
	s, p, answer := silentStore(t)
	const timeout = 20 * time.Millisecond
	check := func(lost func(span time.Duration) time.Duration, want bool) {
		t.Helper()
		answer()
		lag := &toldLag{lost: lost}
		redisstore.SetLag(s, lag.starved)
		timedOut := 0
		for i := 0; timedOut < 4; i++ {
			if i == 100 {
				t.Fatalf("%d of 100 calls ran their timeout out: too few to check", timedOut)
			}
			c := decideTimed(t, s, p, time.Now(), lag)
			if c.took < timeout {
				continue
			}
			timedOut++
			if c.excused != want {
				t.Errorf("a call that ran its %v out in %v: excused %v, want %v", timeout, c.took, c.excused, want)
			}
		}
	}
	check(func(span time.Duration) time.Duration { return span }, true)         // all of its time lost
	check(func(span time.Duration) time.Duration { return span * 3 / 4 }, true) // most of it
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
	s, p, _ := silentStore(t)
	lag := &toldLag{lost: func(span time.Duration) time.Duration { return span / 2 }}
	redisstore.SetLag(s, lag.starved)
	t0 := time.Now()
	var early, late int
	for time.Since(t0) < 1300*time.Millisecond || late < 4 {
		if time.Since(t0) > 20*time.Second {
			t.Fatalf("%d timeouts after 1.3s in 20s: too few to check", late)
		}
		c := decideTimed(t, s, p, t0, lag)
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
	if early == 0 {
		t.Fatal("no timeout in the first 700ms: nothing checked there")
	}
}

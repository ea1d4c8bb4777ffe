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

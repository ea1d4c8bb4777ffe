package clock

import (
	"sync"
	"testing"
	"time"
)

// A reader that comes while another reader is (re)starting the coarse
// clock must not get the time the clock held before the start: 0 (1970)
// on a clock never read, or the stale time the loop left when it stopped
// after an idle second. Either, on a key's first decision, backdates its
// state, and the key's next decision refills what that one took: a
// token bucket of 5 per hour admitted 6 (TestProxyLimitsAndReloads).
//
// Here the restarting reader is held inside start (as a preemption
// there would hold it) by the test holding c.mu.
func TestCoarseReadDuringStart(t *testing.T) {
	for _, tc := range []struct {
		name string
		held int64 // c.now before the start
	}{
		{"never read", 0},
		{"stopped after idle", time.Now().Add(-10 * time.Minute).UnixMicro()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &coarse{}
			c.now.Store(tc.held)
			before := time.Now().UnixMicro()
			c.mu.Lock() // the starter is held in start
			first := make(chan int64, 1)
			go func() { first <- c.NowMicro() }()
			// Let the first reader get as far as it can (into start,
			// or past marking the clock used).
			for deadline := time.Now().Add(50 * time.Millisecond); !c.used.Load() && time.Now().Before(deadline); {
				time.Sleep(100 * time.Microsecond)
			}
			second := make(chan int64, 1)
			go func() { second <- c.NowMicro() }()
			select {
			case got := <-second:
				t.Errorf("a read during the clock's start returned %d (%v), before the start ended; the start was at %v",
					got, time.UnixMicro(got).UTC(), time.UnixMicro(before).UTC())
				second <- got
			case <-time.After(20 * time.Millisecond): // it waits for the start: right
			}
			c.mu.Unlock()
			for _, ch := range []chan int64{first, second} {
				select {
				case got := <-ch:
					if got < before {
						t.Errorf("a read returned %d (%v), older than the start", got, time.UnixMicro(got).UTC())
					}
				case <-time.After(5 * time.Second):
					t.Fatal("a read did not return")
				}
			}
		})
	}
}

// Concurrent first reads of a fresh clock all get the time (no test
// hook: the race as it happens).
func TestCoarseConcurrentFirstReads(t *testing.T) {
	for round := 0; round < 500; round++ {
		c := &coarse{}
		before := time.Now().UnixMicro()
		var wg sync.WaitGroup
		got := make([]int64, 8)
		gate := make(chan struct{})
		for i := range got {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-gate
				got[i] = c.NowMicro()
			}()
		}
		close(gate)
		wg.Wait()
		for i, g := range got {
			if g < before-int64(Resolution/time.Microsecond) {
				t.Fatalf("round %d: reader %d got %d (%v)", round, i, g, time.UnixMicro(g).UTC())
			}
		}
	}
}

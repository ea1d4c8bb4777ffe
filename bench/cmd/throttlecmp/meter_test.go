package main

import (
	"runtime"
	"testing"
	"time"
)

// TestMeterParkCost measures what the per-request accounting books for
// a wait as such: a metered request's goroutine is locked to its
// thread, so its parking and waking put the thread to sleep and wake it
// (futex calls, the locked thread's hand-offs) where an unlocked
// goroutine just switches. It is the thread CPU a locked goroutine uses
// across one wait on a channel another goroutine closes, with the two
// clock reads alone subtracted. A figure to read (docs/BENCHMARKS.md),
// not a pass/fail check:
//
//	go test -run TestMeterParkCost -v ./cmd/throttlecmp
func TestMeterParkCost(t *testing.T) {
	const n = 2000
	measure := func(park bool) time.Duration {
		var booked int64
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		for range n {
			ch := make(chan struct{})
			go func() { time.Sleep(50 * time.Microsecond); close(ch) }()
			if !park {
				<-ch // outside the reads
			}
			t0 := threadCPUNs()
			if park {
				<-ch
			}
			booked += threadCPUNs() - t0
		}
		return time.Duration(booked / n)
	}
	measure(true) // warm up
	reads, wait := measure(false), measure(true)
	t.Logf("a wait on a locked thread books %v of its CPU (the two clock reads alone: %v)", wait-reads, reads)
}

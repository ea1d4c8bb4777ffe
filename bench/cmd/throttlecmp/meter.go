package main

import (
	"fmt"
	"net/http"
	"runtime"
	"runtime/metrics"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// Per-request CPU accounting on the server.
//
// A request the client marks (header meterHeader: one in meterEvery,
// chosen by its index, so the same requests of the same mix are metered
// for every peer) runs from the server's handler entry to its return
// with its goroutine locked to its OS thread, and the thread's CPU clock
// (CLOCK_THREAD_CPUTIME_ID, ns) is read at both ends. A locked thread
// runs no other goroutine, and a thread blocked (a request waiting in a
// queue) uses no CPU, so the difference is exactly the CPU this request's
// goroutine used in between: the peer's decision, the handler if it ran,
// the 503 or 200 written into the response buffer, and for a request
// that waited, its parking and waking on its own thread. Not in it: what
// net/http does for every request before the handler (reading and
// parsing it) and after (flushing the answer to the socket), the same
// for every peer, and work other goroutines do on the request's behalf
// (the completion that wakes a queued request runs on the completer's
// thread). It is kept per outcome as the handler wrote it: 200, 503.
const (
	meterHeader = "X-Bench-Meter"
	meterEvery  = 8
)

// meterSums are the metered requests' counts and CPU, by outcome.
type meterSums struct {
	okN, okNs, okUnits atomic.Int64
	shedN, shedNs      atomic.Int64 // 503s answered within waitedAfter
	waitN, waitNs      atomic.Int64 // 503s answered later (they waited in a queue)
	otherN, otherNs    atomic.Int64
}

// waitedAfter: a 503 answered later than this after the handler's entry
// waited in a queue first (Floodgate's; the peers refuse at once).
const waitedAfter = 5 * time.Millisecond

var meter meterSums

// clockThreadCPU is CLOCK_THREAD_CPUTIME_ID (linux/time.h).
const clockThreadCPU = 3

// threadCPUNs returns the calling thread's CPU time in ns, or -1.
func threadCPUNs() int64 {
	var ts syscall.Timespec
	if _, _, e := syscall.RawSyscall(syscall.SYS_CLOCK_GETTIME, clockThreadCPU, uintptr(unsafe.Pointer(&ts)), 0); e != 0 {
		return -1
	}
	return ts.Nano()
}

// statusWriter records the status a handler answered.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// metered serves r through h on a locked thread and books its CPU by
// outcome; units is the work the handler reports in unitsHeader.
func metered(h http.Handler, w http.ResponseWriter, r *http.Request) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	sw := &statusWriter{ResponseWriter: w}
	w0 := time.Now()
	t0 := threadCPUNs()
	h.ServeHTTP(sw, r)
	t1 := threadCPUNs()
	wall := time.Since(w0)
	if t0 < 0 || t1 < t0 || !marked.Load() {
		return
	}
	d := t1 - t0
	switch sw.status {
	case http.StatusOK:
		meter.okN.Add(1)
		meter.okNs.Add(d)
		var u int64
		fmt.Sscan(w.Header().Get(unitsHeader), &u) //nolint:errcheck
		meter.okUnits.Add(u)
	case http.StatusServiceUnavailable:
		if wall > waitedAfter {
			meter.waitN.Add(1)
			meter.waitNs.Add(d)
		} else {
			meter.shedN.Add(1)
			meter.shedNs.Add(d)
		}
	default:
		meter.otherN.Add(1)
		meter.otherNs.Add(d)
	}
}

// meterLine is the /meter answer: the sums, space-separated.
func meterLine() string {
	m := &meter
	return fmt.Sprintf("%d %d %d %d %d %d %d %d %d", m.okN.Load(), m.okNs.Load(), m.okUnits.Load(),
		m.shedN.Load(), m.shedNs.Load(), m.waitN.Load(), m.waitNs.Load(), m.otherN.Load(), m.otherNs.Load())
}

// idleSamples reads the Go runtime's estimate of its processors' idle
// time and their total time (GOMAXPROCS × wall), in seconds.
var idleSamples = []metrics.Sample{{Name: "/cpu/classes/idle:cpu-seconds"}, {Name: "/cpu/classes/total:cpu-seconds"}}

var idleAtMark, idleAtEnd [2]float64

func readIdle() [2]float64 {
	metrics.Read(idleSamples)
	var v [2]float64
	for i, s := range idleSamples {
		if s.Value.Kind() == metrics.KindFloat64 {
			v[i] = s.Value.Float64()
		}
	}
	return v
}

// idleLine is the share of the processors' time (GOMAXPROCS × wall)
// idle from the mark to the end of the offered load (/endmark), in per
// mille: a limit too low to keep them busy shows here.
func idleLine() string {
	v := idleAtEnd
	total := v[1] - idleAtMark[1]
	if total <= 0 {
		return "0"
	}
	return fmt.Sprintf("%.0f", 1000*(v[0]-idleAtMark[0])/total)
}

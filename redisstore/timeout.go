package redisstore

import (
	"math/bits"
	"sync/atomic"
	"time"
)

// The adaptive timeout. A fixed timeout is wrong on a busy host: calls
// that take 2 ms on an idle machine take tens of milliseconds when the
// machine's CPUs are oversubscribed, and a 50 ms timeout then cuts a
// healthy Redis's answers off, degrading decisions (a fail-open quota
// admits them) for no fault of Redis's. So, with Options.MaxTimeout above
// Options.Timeout, each call gets
//
//	clamp(adaptFactor × p99, Options.Timeout, Options.MaxTimeout)
//
// where p99 is the 99th percentile of the latencies of the calls that
// Redis answered over the last adaptWindows × adaptWindow (5 s), measured
// from the moment the store took the call (before the coalescer's queue)
// to its answer, to a bucket's width (about 12%). The floor is what an
// idle machine needs and what a dead Redis costs a call before the breaker
// opens; the ceiling bounds what a caller can wait. The samples are the
// calls Redis answered, and the timeouts excused as this process's
// starvation (starve.go), at the time they took (less than their latency,
// which is not known): a Redis that is silent gives no samples, so it
// cannot push the timeout up (and after 5 s without any it falls back to
// the floor), while a starved process's calls raise it even when none
// comes back in time. A Redis that is slow for every call, on a host that
// is not busy, is not adapted to: set Options.Timeout above its latency.
// The caller's deadline still rules (storeContext's fifth).
const (
	adaptFactor  = 3
	adaptWindow  = 500 * time.Millisecond
	adaptWindows = 10
	// latencies are kept in µs in log-linear buckets: 0..7 exactly, then
	// four buckets per power of two, up to 2^35 µs (9.5 hours)
	adaptMaxExp  = 35
	adaptBuckets = 8 + (adaptMaxExp-2)*4
)

// adaptive is the adaptive timeout: a histogram of latencies for each of
// the last adaptWindows windows, and the timeout they give.
type adaptive struct {
	floor, ceil time.Duration
	cur         atomic.Int64 // the timeout, in ns
	win         atomic.Int32 // the window observations go to
	hist        [adaptWindows][adaptBuckets]atomic.Uint32
}

func newAdaptive(floor, ceil time.Duration) *adaptive {
	a := &adaptive{floor: floor, ceil: ceil}
	a.cur.Store(int64(floor))
	return a
}

// timeout returns the timeout a call gets now.
func (a *adaptive) timeout() time.Duration { return time.Duration(a.cur.Load()) }

// observe records the latency of a call Redis answered, in µs.
func (a *adaptive) observe(us int64) {
	a.hist[a.win.Load()][latBucket(us)].Add(1)
}

// refresh sets the timeout from the windows' latencies, then starts a new
// window in place of the oldest.
func (a *adaptive) refresh() {
	var sum [adaptBuckets]uint64
	var n uint64
	for w := range a.hist {
		for b := range a.hist[w] {
			c := uint64(a.hist[w][b].Load())
			sum[b] += c
			n += c
		}
	}
	t := a.floor
	if n > 0 {
		rank := n - n/100 // the p99's rank, 1-based, counting up
		var seen uint64
		for b, c := range sum {
			if seen += c; seen >= rank {
				t = max(a.floor, min(a.ceil, adaptFactor*time.Duration(latUpper(b))*time.Microsecond))
				break
			}
		}
	}
	a.cur.Store(int64(t))
	next := (a.win.Load() + 1) % adaptWindows
	for b := range a.hist[next] {
		a.hist[next][b].Store(0)
	}
	a.win.Store(next)
}

// latBucket is the bucket of a latency of us µs.
func latBucket(us int64) int {
	if us < 8 {
		return int(max(us, 0))
	}
	e := bits.Len64(uint64(us)) - 1 // 3 and up
	if e > adaptMaxExp {
		return adaptBuckets - 1
	}
	return 8 + (e-3)*4 + int(us>>(e-2))&3
}

// latUpper is the least latency, in µs, above bucket b's.
func latUpper(b int) int64 {
	if b < 8 {
		return int64(b) + 1
	}
	e, sub := (b-8)/4+3, int64((b-8)%4)
	return (5 + sub) << (e - 2)
}

package loadgen

import (
	"math/bits"
	"sync/atomic"
	"time"
)

// Histogram is a log-linear (HDR-style) latency histogram of nanosecond
// values, safe for concurrent Record calls from any number of goroutines.
//
// Values below 2^subBits ns (1024 ns) are counted exactly; above that, each
// power-of-two range [2^k, 2^(k+1)) is split into 512 equal sub-buckets, so a
// reported value is never more than 1/512 (0.2%) above the true one — the
// precision of an HdrHistogram with about 2.7 significant digits. Values
// above maxTrackable (2^43 ns, about 2.4 h) are clamped to it; the exact
// maximum is kept separately.
//
// The whole histogram is a fixed array of 17,920 counters (140 KiB), with
// no allocation per Record: one atomic add on the bucket, one on the count,
// one on the sum and a compare-and-swap only when the max or min moves.
type Histogram struct {
	counts [numBuckets]atomic.Uint64
	total  atomic.Uint64
	sum    atomic.Uint64 // ns; wraps only after ~584 years of latency
	max    atomic.Int64
	min    atomic.Int64 // stored as value+1 so that zero means "none yet"
}

const (
	subBits      = 10
	subCount     = 1 << subBits // values below this are exact
	halfCount    = subCount / 2 // sub-buckets per power of two above it
	maxBits      = 43
	maxTrackable = int64(1)<<maxBits - 1
	numBuckets   = (maxBits - subBits + 2) * halfCount
)

// bucketOf maps a value to its bucket index.
func bucketOf(v int64) int {
	if v < 0 {
		v = 0
	}
	if v > maxTrackable {
		v = maxTrackable
	}
	u := uint64(v)
	shift := bits.Len64(u) - subBits
	if shift < 0 {
		shift = 0
	}
	return shift*halfCount + int(u>>uint(shift))
}

// bucketHigh is the largest value that maps to bucket i.
func bucketHigh(i int) int64 {
	if i < subCount {
		return int64(i)
	}
	shift := i/halfCount - 1
	sub := int64(i%halfCount + halfCount)
	return (sub+1)<<uint(shift) - 1
}

// bucketLow is the smallest value that maps to bucket i.
func bucketLow(i int) int64 {
	if i < subCount {
		return int64(i)
	}
	shift := i/halfCount - 1
	sub := int64(i%halfCount + halfCount)
	return sub << uint(shift)
}

// NewHistogram returns an empty histogram.
func NewHistogram() *Histogram { return new(Histogram) }

// Record adds one value.
func (h *Histogram) Record(d time.Duration) {
	v := int64(d)
	if v < 0 {
		v = 0
	}
	h.counts[bucketOf(v)].Add(1)
	h.total.Add(1)
	h.sum.Add(uint64(v))
	for {
		m := h.max.Load()
		if v <= m || h.max.CompareAndSwap(m, v) {
			break
		}
	}
	for {
		m := h.min.Load()
		if (m != 0 && v+1 >= m) || h.min.CompareAndSwap(m, v+1) {
			break
		}
	}
}

// Count is the number of recorded values.
func (h *Histogram) Count() uint64 { return h.total.Load() }

// Max is the exact largest recorded value (0 if none).
func (h *Histogram) Max() time.Duration { return time.Duration(h.max.Load()) }

// Min is the exact smallest recorded value (0 if none).
func (h *Histogram) Min() time.Duration {
	m := h.min.Load()
	if m == 0 {
		return 0
	}
	return time.Duration(m - 1)
}

// Mean is the exact mean of the recorded values (0 if none).
func (h *Histogram) Mean() time.Duration {
	n := h.total.Load()
	if n == 0 {
		return 0
	}
	return time.Duration(h.sum.Load() / n)
}

// Merge adds the counts of o into h. Neither should be recorded into
// concurrently if an exact result is wanted.
func (h *Histogram) Merge(o *Histogram) {
	for i := range o.counts {
		if c := o.counts[i].Load(); c != 0 {
			h.counts[i].Add(c)
		}
	}
	h.total.Add(o.total.Load())
	h.sum.Add(o.sum.Load())
	if m := o.max.Load(); m > h.max.Load() {
		h.max.Store(m)
	}
	if m := o.min.Load(); m != 0 && (h.min.Load() == 0 || m < h.min.Load()) {
		h.min.Store(m)
	}
}

// Quantile returns the value at quantile q in [0, 1]: the smallest bucket
// upper bound at or below which at least q of the values lie (like
// HdrHistogram's ValueAtQuantile, the highest value equivalent to the
// sample), clamped to the exact min and max. Quantile(1) is the exact max.
func (h *Histogram) Quantile(q float64) time.Duration {
	n := h.total.Load()
	if n == 0 {
		return 0
	}
	if q >= 1 {
		return h.Max()
	}
	if q < 0 {
		q = 0
	}
	// rank of the sample (1-based) that the quantile falls on, rounded
	// as HdrHistogram does
	rank := uint64(q*float64(n) + 0.5)
	if rank < 1 {
		rank = 1
	}
	var seen uint64
	for i := range h.counts {
		seen += h.counts[i].Load()
		if seen >= rank {
			v := bucketHigh(i)
			if mx := h.max.Load(); v > mx {
				v = mx
			}
			if mn := int64(h.Min()); v < mn {
				v = mn
			}
			return time.Duration(v)
		}
	}
	return h.Max()
}

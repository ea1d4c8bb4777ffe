package loadgen

import (
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

func TestBuckets(t *testing.T) {
	check := func(v int64) {
		i := bucketOf(v)
		if i < 0 || i >= numBuckets {
			t.Fatalf("bucketOf(%d) = %d out of range", v, i)
		}
		lo, hi := bucketLow(i), bucketHigh(i)
		if v < lo || v > hi {
			t.Fatalf("%d in bucket %d = [%d, %d]", v, i, lo, hi)
		}
		if hi-lo > max(lo/halfCount, 0) {
			t.Fatalf("bucket %d = [%d, %d] wider than 1/%d", i, lo, hi, halfCount)
		}
		if i > 0 && bucketHigh(i-1) != lo-1 {
			t.Fatalf("buckets %d and %d not contiguous", i-1, i)
		}
	}
	for v := int64(0); v < 5000; v++ {
		check(v)
	}
	for range 100000 {
		check(rand.Int64N(maxTrackable + 1))
		check(rand.Int64N(int64(10 * time.Millisecond)))
	}
	check(maxTrackable)
	if bucketOf(maxTrackable) != numBuckets-1 {
		t.Fatalf("last bucket %d, want %d", bucketOf(maxTrackable), numBuckets-1)
	}
	if bucketOf(maxTrackable*4) != numBuckets-1 || bucketOf(-5) != 0 {
		t.Fatal("out-of-range values not clamped")
	}
}

func TestHistogramQuantiles(t *testing.T) {
	h := NewHistogram()
	if h.Quantile(0.5) != 0 || h.Max() != 0 || h.Min() != 0 || h.Mean() != 0 {
		t.Fatal("empty histogram not all zero")
	}
	// 1..100000 µs, each once, recorded from 8 goroutines
	const n = 100000
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for v := g + 1; v <= n; v += 8 {
				h.Record(time.Duration(v) * time.Microsecond)
			}
		}()
	}
	wg.Wait()
	if h.Count() != n {
		t.Fatalf("count %d, want %d", h.Count(), n)
	}
	if h.Min() != time.Microsecond || h.Max() != n*time.Microsecond {
		t.Fatalf("min %v max %v", h.Min(), h.Max())
	}
	if want := time.Duration(n+1) * time.Microsecond / 2; h.Mean() != want {
		t.Fatalf("mean %v, want %v", h.Mean(), want)
	}
	for _, q := range []float64{0.001, 0.1, 0.5, 0.9, 0.99, 0.999, 0.9999} {
		want := time.Duration(q*n) * time.Microsecond
		got := h.Quantile(q)
		if got < want || float64(got-want) > float64(want)/halfCount+1 {
			t.Errorf("q%v = %v, want %v (+0.2%%)", q, got, want)
		}
	}
	if h.Quantile(1) != h.Max() || h.Quantile(0) != h.Min() {
		t.Errorf("q0 %v q1 %v", h.Quantile(0), h.Quantile(1))
	}

	// one huge outlier: p99.99 and below unaffected, max exact
	h2 := NewHistogram()
	for range 9999 {
		h2.Record(100 * time.Microsecond)
	}
	h2.Record(3 * time.Second)
	if q := h2.Quantile(0.999); q < 100*time.Microsecond || q > 101*time.Microsecond {
		t.Errorf("p99.9 %v", q)
	}
	if h2.Max() != 3*time.Second {
		t.Errorf("max %v", h2.Max())
	}

	var m Histogram
	m.Merge(h)
	m.Merge(h2)
	if m.Count() != n+10000 || m.Max() != 3*time.Second || m.Min() != time.Microsecond {
		t.Errorf("merge: count %d max %v min %v", m.Count(), m.Max(), m.Min())
	}
}

func TestParseProcStat(t *testing.T) {
	line := "4242 (my (odd) prog) S 1 4242 4242 0 -1 4194560 1234 0 0 0 250 75 0 0 20 0 9 0 100 0 0\n"
	d, err := parseProcStat([]byte(line), 100)
	if err != nil || d != 3250*time.Millisecond {
		t.Fatalf("got %v, %v; want 3.25s", d, err)
	}
	if _, err := parseProcStat([]byte("4242 (x) S 1 2"), 100); err == nil {
		t.Fatal("short line accepted")
	}
	if clockTicks() <= 0 {
		t.Fatal("no clock ticks")
	}
}

package recorder

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

type limit struct{ name string } // stands for a *rules.Limit: the key of For

func TestOutcomesPerSecond(t *testing.T) {
	r := New()
	l := &limit{"a"}
	c := r.For(l, ID{"d", "a"})
	r.Sample(1000)
	c.Record(true, false, false, false)
	c.Record(true, false, false, true)   // warned
	c.Record(false, false, false, false) // refused
	c.Record(false, true, false, false)  // shadow
	c.Record(false, false, true, false)  // refused, degraded
	r.Sample(1001)
	c.Record(true, false, true, false) // allowed, degraded
	r.Sample(1003)                     // 1002 skipped: empty
	series, lat, last := r.Since(0)
	if last != 1003 || len(series) != 1 {
		t.Fatalf("last %d, %d series", last, len(series))
	}
	s := series[0]
	want := [][NumOutcomes]uint32{{0, 0, 0, 0, 0}, {2, 2, 1, 1, 1}, {0, 0, 0, 0, 0}, {1, 0, 0, 1, 0}}
	if s.Domain != "d" || s.Rule != "a" || s.Start != 1000 || fmt.Sprint(s.Counts) != fmt.Sprint(want) {
		t.Errorf("series %+v, want from 1000 %v", s, want)
	}
	if s.Total != [NumOutcomes]uint64{3, 2, 1, 2, 1} {
		t.Errorf("total %v", s.Total)
	}
	if lat.Start != 1000 || len(lat.P50) != 4 {
		t.Errorf("latency %+v", lat)
	}
	// the seconds after 1001 only
	series, _, _ = r.Since(1001)
	if len(series) != 1 || series[0].Start != 1002 || len(series[0].Counts) != 2 {
		t.Errorf("Since(1001): %+v", series)
	}
	// nothing new: a rule without decisions in them is left out
	r.Sample(1004)
	if series, _, last := r.Since(1003); len(series) != 0 || last != 1004 {
		t.Errorf("Since(1003) without decisions: %+v, last %d", series, last)
	}
}

// TestWindowWraps: after more than Window seconds only the last Window
// are returned, the old ones overwritten, not mixed in.
func TestWindowWraps(t *testing.T) {
	r := New()
	c := r.For(&limit{}, ID{"d", "a"})
	for s := int64(1); s <= Window+100; s++ {
		c.Record(s%2 == 0, false, false, false)
		r.Sample(s)
	}
	series, _, last := r.Since(0)
	if last != Window+100 || len(series) != 1 || len(series[0].Counts) != Window || series[0].Start != 101 {
		t.Fatalf("last %d series %d", last, len(series))
	}
	for i, row := range series[0].Counts {
		sec := int64(101 + i)
		want := [NumOutcomes]uint32{}
		if sec%2 == 0 {
			want[Allowed] = 1
		} else {
			want[Refused] = 1
		}
		if row != want {
			t.Fatalf("second %d: %v, want %v", sec, row, want)
		}
	}
	// a gap longer than the window clears everything before it
	r.Sample(3 * Window)
	series, _, _ = r.Since(0)
	if len(series) != 0 {
		t.Errorf("after a gap of more than the window: %+v", series[0].Counts[:3])
	}
}

// TestRulesBounded: however many rules decide, at most MaxRules are kept;
// the rest count under OtherRule, so no decision is lost.
func TestRulesBounded(t *testing.T) {
	r := New()
	r.Sample(1)
	for i := range MaxRules + 50 {
		r.For(&limit{}, ID{"d", fmt.Sprint("r", i)}).Record(false, false, false, false)
	}
	r.Sample(2)
	series, _, _ := r.Since(0)
	if len(series) != MaxRules {
		t.Fatalf("%d rules, want %d", len(series), MaxRules)
	}
	var total uint64
	var other bool
	for _, s := range series {
		total += s.Total[Refused]
		other = other || s.Rule == OtherRule
	}
	if !other || total != MaxRules+50 {
		t.Errorf("other rule kept: %v; %d refusals counted, want %d", other, total, MaxRules+50)
	}
	// rules idle for a whole window make room again
	first := &limit{}
	old := r.For(first, ID{"d", "r0"})
	r.Sample(2 + Window + 1)
	r.For(&limit{}, ID{"d", "new"}).Record(true, false, false, false)
	if !old.Dropped() {
		t.Error("an idle rule dropped for room: its counters do not say so")
	}
	if c := r.For(first, ID{"d", "r0"}); c == old || c.Dropped() {
		t.Error("For returns a dropped rule's counters")
	}
	r.Sample(2 + Window + 2)
	series, _, _ = r.Since(0)
	if len(series) != 1 || series[0].Rule != "new" { // r0 found again, but without a decision
		t.Errorf("after the idle rules went: %+v", series)
	}
}

// TestRecordNoAlloc: recording a decision allocates nothing.
func TestRecordNoAlloc(t *testing.T) {
	r := New()
	l := &limit{}
	r.For(l, ID{"d", "a"})
	if a := testing.AllocsPerRun(1000, func() {
		r.For(l, ID{"d", "a"}).Record(true, false, false, false)
		r.ObserveLatency(300 * time.Microsecond)
	}); a != 0 {
		t.Errorf("%v allocations a decision", a)
	}
}

// TestConcurrentRecordAndSample: decisions recorded while sampling are
// all counted, in one second or the next (run with -race).
func TestConcurrentRecordAndSample(t *testing.T) {
	r := New()
	l := &limit{}
	const workers, each = 4, 5000
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range each {
				r.For(l, ID{"d", "a"}).Record(true, false, false, false)
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	// seconds repeat (a sample at the last second adds to it) and stay
	// within the window
	i := int64(0)
	for loop := true; loop; i++ {
		select {
		case <-done:
			loop = false
		default:
		}
		r.Sample(min(1+i/50, Window-1))
	}
	r.Sample(Window)
	series, _, _ := r.Since(0)
	var sum uint64
	for _, row := range series[0].Counts {
		sum += uint64(row[Allowed])
	}
	if sum != workers*each || series[0].Total[Allowed] != workers*each {
		t.Errorf("counted %d (total %d), want %d", sum, series[0].Total[Allowed], workers*each)
	}
}

func TestLatencyQuantiles(t *testing.T) {
	r := New()
	r.Sample(1)
	for range 98 {
		r.ObserveLatency(100 * time.Microsecond) // bucket < 128 µs
	}
	r.ObserveLatency(5 * time.Millisecond) // < 8192 µs
	r.ObserveLatency(5 * time.Millisecond)
	r.Sample(2)
	_, lat, _ := r.Since(1)
	if len(lat.P50) != 1 || lat.P50[0] != 128 || lat.P99[0] != 8192 {
		t.Errorf("latency %+v, want p50 128 p99 8192", lat)
	}
}

func BenchmarkRecord(b *testing.B) {
	r := New()
	l := &limit{}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			r.For(l, ID{"d", "a"}).Record(true, false, false, false)
		}
	})
}

// BenchmarkRecordKept is what the service pays a decision: its counters
// are kept with the limit's metrics series (no lookup), so a check that
// they were not dropped, the count, and the latency.
func BenchmarkRecordKept(b *testing.B) {
	r := New()
	c := r.For(&limit{}, ID{"d", "a"})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if !c.Dropped() {
				c.Record(true, false, false, false)
			}
			r.ObserveLatency(300 * time.Microsecond)
		}
	})
}

package recorder

import (
	"fmt"
	"sync/atomic"
	"testing"
)

// TestTrackPerSecond: a track keeps what its counters gained each second,
// not what they held before Track, an empty second for a skipped one, and
// no second past the upto a snapshot's rules covered.
func TestTrackPerSecond(t *testing.T) {
	r := New()
	var a, b atomic.Uint64
	a.Store(100) // before Track: never counted
	r.Track("tiers", []string{"a", "b"}, func(dst []uint64) { dst[0], dst[1] = a.Load(), b.Load() })
	r.Sample(1000)
	a.Add(3)
	b.Add(1)
	r.Sample(1001)
	a.Add(2)
	r.Sample(1003) // 1002 skipped
	ts := r.Tracks(0, 1003)
	if len(ts) != 1 {
		t.Fatalf("%d tracks", len(ts))
	}
	want := [][]uint32{{0, 0}, {3, 1}, {0, 0}, {2, 0}}
	if s := ts[0]; s.Name != "tiers" || s.Start != 1000 || fmt.Sprint(s.Counts) != fmt.Sprint(want) || fmt.Sprint(s.Total) != "[5 1]" {
		t.Errorf("track %+v, want from 1000 %v, total [5 1]", s, want)
	}
	if ts := r.Tracks(1001, 1003); ts[0].Start != 1002 || len(ts[0].Counts) != 2 {
		t.Errorf("Tracks(1001): %+v", ts[0])
	}
	if ts := r.Tracks(1000, 1001); len(ts[0].Counts) != 1 || fmt.Sprint(ts[0].Counts) != "[[3 1]]" {
		t.Errorf("Tracks(1000, 1001): %+v: want only 1001", ts[0])
	}
	// a counter that goes back (a store reopened) counts nothing, never 2^64-n
	a.Store(1)
	r.Sample(1004)
	if ts := r.Tracks(1003, 1004); fmt.Sprint(ts[0].Counts) != "[[0 0]]" {
		t.Errorf("after a counter went back: %v", ts[0].Counts)
	}
	// the returned counts are copies: a later sample of the same second
	// does not change them
	got := r.Tracks(1003, 1004)
	a.Add(7)
	r.Sample(1004)
	if fmt.Sprint(got[0].Counts) != "[[0 0]]" || fmt.Sprint(r.Tracks(1003, 1004)[0].Counts) != "[[7 0]]" {
		t.Errorf("same second again: old %v, new %v", got[0].Counts, r.Tracks(1003, 1004)[0].Counts)
	}
}

// TestTrackWindowWraps: after more than Window seconds only the last
// Window are returned, and a gap longer than Window leaves no old counts.
func TestTrackWindowWraps(t *testing.T) {
	r := New()
	var a atomic.Uint64
	r.Track("x", []string{"a"}, func(dst []uint64) { dst[0] = a.Load() })
	for s := int64(1); s <= Window+10; s++ {
		a.Add(uint64(s))
		r.Sample(s)
	}
	ts := r.Tracks(0, Window+10)[0]
	if ts.Start != 11 || len(ts.Counts) != Window || ts.Counts[0][0] != 11 || ts.Counts[Window-1][0] != Window+10 {
		t.Fatalf("start %d, %d seconds, first %v, last %v", ts.Start, len(ts.Counts), ts.Counts[0], ts.Counts[len(ts.Counts)-1])
	}
	r.Sample(3 * Window) // a long gap: every second empty but the last
	ts = r.Tracks(0, 3*Window)[0]
	for i, c := range ts.Counts {
		if c[0] != 0 {
			t.Fatalf("second %d after a gap: %v", ts.Start+int64(i), c)
		}
	}
}

package lease

import (
	"errors"
	"testing"
	"time"
)

// TestTableWatermark: before granting a lease that ends after the
// watermark, the table saves a new one, now + 2 × the longest lease
// length: once per lease length, not per grant; a lease is never granted
// past a watermark not saved (a failing save grants 0).
func TestTableWatermark(t *testing.T) {
	tb, clk := newTable(t, oneResource(FairShare, 100, ""), Options{}) // 60s leases
	var saves []time.Time
	var fail error
	tb.SetWatermark(time.Time{}, func(u time.Time) error {
		if fail != nil {
			return fail
		}
		saves = append(saves, u)
		return nil
	})
	var l Lease
	for i := range 300 { // 300 s: a grant a second
		l = get(t, tb, "a", "r", 0, 50, l)
		if l.Capacity != 50 {
			t.Fatalf("grant %d: %v", i, l.Capacity)
		}
		if n := len(saves); n == 0 || l.Expiry.After(saves[n-1]) {
			t.Fatalf("grant %d ends at %v, after the watermark saved (%v)", i, l.Expiry, saves)
		}
		clk.Advance(time.Second)
	}
	if n := len(saves); n < 4 || n > 6 {
		t.Fatalf("%d saves in 300s of 60s leases, want about one per lease length: %v", n, saves)
	}
	if !saves[0].Equal(t0.Add(120 * time.Second)) {
		t.Fatalf("first watermark %v, want now + 2 × 60s", saves[0])
	}
	fail = errors.New("disk full")
	clk.Advance(2 * time.Minute) // past the watermark
	if l = get(t, tb, "a", "r", 0, 50, l); l.Capacity != 0 {
		t.Fatalf("granted %v with the watermark unsaved", l.Capacity)
	}
	fail = nil
	if l = get(t, tb, "a", "r", 0, 50, l); l.Capacity != 50 {
		t.Fatalf("granted %v once saved again", l.Capacity)
	}
}

// TestTableStartLearningUntil: a restarted table learns until the saved
// watermark (whatever the learning_mode), trusting what clients report and
// giving newcomers 0; after it, it grants at once; an end already passed
// changes nothing.
func TestTableStartLearningUntil(t *testing.T) {
	tb, clk := newTable(t, oneResource(FairShare, 100, ""), Options{})
	tb.StartLearningUntil(t0.Add(-time.Second))
	if l := get(t, tb, "x", "r", 0, 10, Lease{}); l.Capacity != 10 {
		t.Fatalf("a passed watermark: learning (got %v)", l.Capacity)
	}
	tb, clk = newTable(t, oneResource(FairShare, 100, ""), Options{})
	tb.StartLearningUntil(t0.Add(90 * time.Second))
	held := Lease{Capacity: 40, Expiry: t0.Add(30 * time.Second)}
	if l := get(t, tb, "a", "r", 0, 100, held); l.Capacity != 40 {
		t.Fatalf("learning: a reporting 40 got %v", l.Capacity)
	}
	clk.Advance(80 * time.Second) // past learning_mode (60s), before the watermark
	if l := get(t, tb, "b", "r", 0, 100, Lease{}); l.Capacity != 0 {
		t.Fatalf("a newcomer got %v before the watermark", l.Capacity)
	}
	if st := tb.Stats(); !st[0].Learning {
		t.Fatal("not learning before the watermark")
	}
	clk.Advance(11 * time.Second)
	if l := get(t, tb, "b", "r", 0, 100, Lease{}); l.Capacity == 0 {
		t.Fatal("still learning after the watermark")
	}
}

// Horizon is the end of the last lease a client may still hold: zero with
// none, the newest lease's expiry, an older lease's when a lost response
// may have left it out, the learning end after a restart, and zero again
// once all have expired or been released.
func TestTableHorizon(t *testing.T) {
	tb, clk := newTable(t, oneResource(FairShare, 100, ""), Options{})
	if h := tb.Horizon(); !h.IsZero() {
		t.Fatalf("empty table: horizon %v, want zero", h)
	}
	l := get(t, tb, "a", "r", 0, 100, Lease{})
	if h := tb.Horizon(); !h.Equal(l.Expiry) {
		t.Fatalf("horizon %v, want the lease's expiry %v", h, l.Expiry)
	}
	clk.Advance(10 * time.Second)
	l2 := get(t, tb, "b", "r", 0, 100, Lease{}) // a later lease
	if h := tb.Horizon(); !h.Equal(l2.Expiry) {
		t.Fatalf("horizon %v, want the latest expiry %v", h, l2.Expiry)
	}
	tb.Release("b", []string{"r"})
	if h := tb.Horizon(); !h.Equal(l.Expiry) {
		t.Fatalf("after b's release: horizon %v, want a's expiry %v", h, l.Expiry)
	}
	clk.Set(l.Expiry)
	if h := tb.Horizon(); !h.IsZero() {
		t.Fatalf("every lease expired: horizon %v, want zero", h)
	}
	end := l.Expiry.Add(time.Hour)
	tb.StartLearningUntil(end)
	if h := tb.Horizon(); !h.Equal(end) {
		t.Fatalf("learning until %v: horizon %v", end, h)
	}
}

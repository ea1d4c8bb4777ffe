package algo

import "testing"

// BenchmarkApplyTwoRules is one allow under a policy of two rules (a
// sliding window and a token bucket), the multi-rule path of ApplyTo.
func BenchmarkApplyTwoRules(b *testing.B) {
	ps := []Params{
		{Kind: SlidingCounter, Limit: 1 << 30, Period: 60_000_000},
		{Kind: TokenBucket, Limit: 1 << 30, Period: 1_000_000},
	}
	off := 0
	for i := range ps {
		if msg := ps[i].Prepare(); msg != "" {
			b.Fatal(msg)
		}
		ps[i].Off = off
		off += ps[i].Width
	}
	st := make([]int64, off)
	var r Result
	now := int64(1_800_000_000_000_000)
	for b.Loop() {
		now++
		ApplyTo(ps, st, now, OpAllow, 1, 0, 0, &r)
		if !r.Allowed {
			b.Fatal("denied")
		}
	}
}

// BenchmarkApplyOneRule is one allow under a single sliding-window rule,
// ApplyTo's one-rule path.
func BenchmarkApplyOneRule(b *testing.B) {
	ps := []Params{{Kind: SlidingCounter, Limit: 1 << 30, Period: 60_000_000}}
	if msg := ps[0].Prepare(); msg != "" {
		b.Fatal(msg)
	}
	st := make([]int64, ps[0].Width)
	var r Result
	now := int64(1_800_000_000_000_000)
	for b.Loop() {
		now++
		ApplyTo(ps, st, now, OpAllow, 1, 0, 0, &r)
		if !r.Allowed {
			b.Fatal("denied")
		}
	}
}

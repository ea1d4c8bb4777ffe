package redisstore

import (
	"testing"
	"time"

	"github.com/floodgate/floodgate"
)

// BenchmarkExactTierLookups is what a decision of an exact policy pays
// for the tiers (issue 19): the write-back and local-share lookups Do and
// DoBatch make before they ask Redis (BenchmarkExactTierDoBreakerOpen: a
// whole Do without the network).
//
//	go test -run '^$' -bench 'ExactTier' -benchmem -count 5 ./redisstore/
func BenchmarkExactTierLookups(b *testing.B) {
	pol := floodgate.MustPolicy("exact", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 100, Period: time.Second})
	s := &Store{}
	s.wb = &writeBack{s: s}
	op := pol.Op(floodgate.OpAllow, "k", 1, 0)
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		if s.wb.policy(op.Policy).ok || sharePlanOf(op.Policy).ok {
			n++
		}
	}
	if n != 0 {
		b.Fatal("an exact policy is tiered")
	}
}

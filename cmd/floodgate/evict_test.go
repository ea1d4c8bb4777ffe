package main

import (
	"context"
	"strconv"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

const quotaRules = `domain: quota
descriptors:
  - key: user
    rate_limit:
      unit: day
      requests_per_unit: 1000
`

// The reproduction (#17, item 2), as an operator saw it: serve
// --max-memory 64KiB; five keys spend a 1000/day quota; then 40,000 new
// keys each spend theirs whole (hits_addend 1000). The memory store
// evicted the spent keys at its cap as readily as the flood's, and all
// five read 1000 remaining afterwards.
func TestServeFloodAtMemoryCapForgivesNoSpentKey(t *testing.T) {
	dir := t.TempDir()
	writeRules(t, dir, "quota.yaml", quotaRules)
	s := startServer(t, "--rules", dir, "--data", t.TempDir(), "--max-memory", "64KiB")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ask := func(hits uint32, ds ...*rlcommon.RateLimitDescriptor) *rlsv3.RateLimitResponse {
		t.Helper()
		resp, err := s.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "quota", HitsAddend: hits, Descriptors: ds})
		if err != nil {
			t.Fatalf("ShouldRateLimit: %v", err)
		}
		return resp
	}
	for v := range 5 {
		if r := ask(1000, desc("user", "victim"+strconv.Itoa(v))); r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != 0 {
			t.Fatalf("victim %d spends its quota: %v", v, r)
		}
	}
	const flood, perCall = 40_000, 64
	for i := 0; i < flood; i += perCall {
		ds := make([]*rlcommon.RateLimitDescriptor, 0, perCall)
		for k := i; k < min(i+perCall, flood); k++ {
			ds = append(ds, desc("user", "flood"+strconv.Itoa(k)))
		}
		ask(1000, ds...)
	}
	for v := range 5 {
		d := desc("user", "victim"+strconv.Itoa(v))
		d.HitsAddend = wrapperspb.UInt64(0) // check, consume nothing
		if r := ask(1, d); r.Statuses[0].LimitRemaining != 0 {
			t.Errorf("victim %d after the flood: %d remaining, want 0 (still spent)", v, r.Statuses[0].LimitRemaining)
		}
	}
}

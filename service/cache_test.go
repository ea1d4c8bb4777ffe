package service

import (
	"errors"
	"fmt"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/floodgate/floodgate"
)

// The policy cache drops one policy at random when full, not all of them:
// clearing it whole made every request rebuild its policy while more
// override number sets than it holds were in use.
func TestPolicyCacheEvictsOne(t *testing.T) {
	s := &Service{policies: map[string]*floodgate.Policy{}}
	p := floodgate.MustPolicy("p", floodgate.Rule{Name: "r", Limit: 1, Period: time.Second})
	for i := range maxPolicies + 100 {
		if _, err := s.cachedPolicy(fmt.Sprint("sig", i), func() (*floodgate.Policy, error) { return p, nil }); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(s.policies); n != maxPolicies {
		t.Fatalf("%d policies cached after %d built, want %d", n, maxPolicies+100, maxPolicies)
	}
	if _, ok := s.policies[fmt.Sprint("sig", maxPolicies+99)]; !ok {
		t.Fatal("the newest policy is not cached")
	}
}

// Callers choose their own limits' numbers: past maxOwnLimits distinct
// ones, a new one is ignored (the rules decide) instead of costing another
// policy and memory-store table for good.
func TestOwnLimitsAreBounded(t *testing.T) {
	s := &Service{policies: map[string]*floodgate.Policy{}, ownLimits: map[string]struct{}{}}
	for n := range maxOwnLimits {
		if _, err := s.requestPolicy(&rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: uint32(n + 1), Unit: typev3.RateLimitUnit_SECOND}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.requestPolicy(&rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: maxOwnLimits + 1, Unit: typev3.RateLimitUnit_SECOND}); !errors.Is(err, errTooManyOwnLimits) {
		t.Fatalf("one own limit past the bound: %v", err)
	}
	if _, err := s.requestPolicy(&rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 7, Unit: typev3.RateLimitUnit_SECOND}); err != nil {
		t.Fatalf("an own limit already in use: %v", err)
	}
}

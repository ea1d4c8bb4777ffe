package decide

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
)

// The policy cache drops one policy at random when full, not all of them:
// clearing it whole made every request rebuild its policy while more
// override number sets than it holds were in use.
func TestPolicyCacheEvictsOne(t *testing.T) {
	d := New(Options{})
	p := floodgate.MustPolicy("p", floodgate.Rule{Name: "r", Limit: 1, Period: time.Second})
	for i := range maxPolicies + 100 {
		if _, err := d.cachedPolicy(fmt.Sprint("sig", i), func() (*floodgate.Policy, error) { return p, nil }); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(d.policies); n != maxPolicies {
		t.Fatalf("%d policies cached after %d built, want %d", n, maxPolicies+100, maxPolicies)
	}
	if _, ok := d.policies[fmt.Sprint("sig", maxPolicies+99)]; !ok {
		t.Fatal("the newest policy is not cached")
	}
}

// Callers choose their own limits' numbers: past maxOwnLimits distinct
// ones, a new one is ignored (the rules decide) instead of costing another
// policy and memory-store table for good.
func TestOwnLimitsAreBounded(t *testing.T) {
	d := New(Options{})
	for n := range maxOwnLimits {
		if _, err := d.ownPolicy(&OwnLimit{RequestsPerUnit: uint32(n + 1), Unit: time.Second}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := d.ownPolicy(&OwnLimit{RequestsPerUnit: maxOwnLimits + 1, Unit: time.Second}); !errors.Is(err, errTooManyOwnLimits) {
		t.Fatalf("one own limit past the bound: %v", err)
	}
	if _, err := d.ownPolicy(&OwnLimit{RequestsPerUnit: 7, Unit: time.Second}); err != nil {
		t.Fatalf("an own limit already in use: %v", err)
	}
}

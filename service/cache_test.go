package service

import (
	"fmt"
	"testing"
	"time"

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

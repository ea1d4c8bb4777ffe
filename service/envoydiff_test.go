package service_test

import (
	"math"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/floodgate/floodgate/service"
)

// The tests of this file pin answers where bench/cmd/envoydiff found
// Floodgate answering otherwise than envoyproxy/ratelimit.

const diffRules = `domain: t
descriptors:
  - key: user
    rate_limit:
      unit: minute
      requests_per_unit: 5
  - key: blocked
    rate_limit:
      unit: minute
      requests_per_unit: 0
  - key: free
    rate_limit:
      unlimited: true
  - key: free_named
    rate_limit:
      name: free_named
      unlimited: true
  - key: replacer
    rate_limit:
      unit: minute
      requests_per_unit: 5
      replaces:
        - name: free_named
`

func one(domain string, hits uint32, dd *rlcommon.RateLimitDescriptor) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: domain, HitsAddend: hits, Descriptors: []*rlcommon.RateLimitDescriptor{dd}}
}

// An unlimited descriptor says limit_remaining MaxUint32, as
// envoyproxy/ratelimit does (even when its limit is replaced), not 0.
func TestEnvoyDiffUnlimitedRemainingIsMax(t *testing.T) {
	e := newEnv(t, service.Options{}, diffRules)
	r := e.ask(t, one("t", 0, d("free", "x")))
	if st := r.Statuses[0]; st.Code != rlsv3.RateLimitResponse_OK || st.LimitRemaining != math.MaxUint32 || st.CurrentLimit != nil {
		t.Fatalf("unlimited: %v", st)
	}
	r = e.ask(t, &rlsv3.RateLimitRequest{Domain: "t", Descriptors: []*rlcommon.RateLimitDescriptor{d("free_named", "x"), d("replacer", "x")}})
	if st := r.Statuses[0]; st.LimitRemaining != math.MaxUint32 {
		t.Fatalf("replaced unlimited: %v", st)
	}
	// a descriptor matching nothing stays at 0
	if st := e.ask(t, one("t", 0, d("nothing", "x"))).Statuses[0]; st.LimitRemaining != 0 || st.DurationUntilReset != nil {
		t.Fatalf("no limit: %v", st)
	}
}

// duration_until_reset of a fixed window (a rule with a unit) is the time
// to the window's end, as envoyproxy/ratelimit says it, also when nothing
// is counted yet (a check with hits_addend 0 on a fresh key) and when the
// request is denied because its hits exceed the whole limit (no wait helps:
// it said 0).
func TestEnvoyDiffFixedWindowResetIsWindowEnd(t *testing.T) {
	e := newEnv(t, service.Options{}, diffRules)
	e.clk.Advance(10 * time.Second) // 50 s before the minute's end
	peek := d("user", "fresh")
	peek.HitsAddend = wrapperspb.UInt64(0)
	if st := e.ask(t, one("t", 0, peek)).Statuses[0]; st.Code != rlsv3.RateLimitResponse_OK || st.LimitRemaining != 5 || st.DurationUntilReset.AsDuration() != 50*time.Second {
		t.Fatalf("check on a fresh key: %v, want OK, 5 remaining, reset in 50s", st)
	}
	st := e.ask(t, one("t", 6, d("user", "big"))).Statuses[0]
	if st.Code != rlsv3.RateLimitResponse_OVER_LIMIT || st.DurationUntilReset.AsDuration() != 50*time.Second {
		t.Fatalf("hits over the whole limit: %v, want OVER_LIMIT, reset in 50s", st)
	}
	if st := e.ask(t, one("t", 0, d("user", "counted"))).Statuses[0]; st.DurationUntilReset.AsDuration() != 50*time.Second {
		t.Fatalf("a counted key: %v, want reset in 50s", st)
	}
}

// requests_per_unit 0: OVER_LIMIT with the window's reset; a check
// (hits_addend 0) is not over it (0 hits do not exceed 0), as
// envoyproxy/ratelimit answers.
func TestEnvoyDiffBlocked(t *testing.T) {
	e := newEnv(t, service.Options{}, diffRules)
	e.clk.Advance(15 * time.Second)
	st := e.ask(t, one("t", 0, d("blocked", "x"))).Statuses[0]
	if st.Code != rlsv3.RateLimitResponse_OVER_LIMIT || st.DurationUntilReset.AsDuration() != 45*time.Second || st.CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE {
		t.Fatalf("blocked: %v, want OVER_LIMIT, 0/MINUTE, reset in 45s", st)
	}
	peek := d("blocked", "x")
	peek.HitsAddend = wrapperspb.UInt64(0)
	r := e.ask(t, one("t", 0, peek))
	if st := r.Statuses[0]; r.OverallCode != rlsv3.RateLimitResponse_OK || st.Code != rlsv3.RateLimitResponse_OK || st.LimitRemaining != 0 || st.CurrentLimit.GetRequestsPerUnit() != 0 {
		t.Fatalf("a check on a blocked limit: %v, want OK, 0 remaining", r)
	}
}

// With --allow-request-limits, a descriptor's own limit of 0 blocks (it
// was a bad request), and own limits apply only in domains the rules know.
func TestEnvoyDiffRequestLimits(t *testing.T) {
	e := newEnv(t, service.Options{AllowRequestLimits: true}, diffRules)
	e.clk.Advance(20 * time.Second)
	zero := d("user", "z")
	zero.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 0, Unit: typev3.RateLimitUnit_MINUTE}
	r := e.ask(t, one("t", 0, zero))
	if st := r.Statuses[0]; r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || st.CurrentLimit.GetRequestsPerUnit() != 0 ||
		st.CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE || st.DurationUntilReset.AsDuration() != 40*time.Second {
		t.Fatalf("own limit 0/minute: %v, want OVER_LIMIT, 0/MINUTE, reset in 40s", r)
	}
	month := d("user", "m")
	month.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 3, Unit: typev3.RateLimitUnit_MONTH}
	if cl := e.ask(t, one("t", 0, month)).Statuses[0].CurrentLimit; cl.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MONTH || cl.UnitMultiplier != nil || cl.RequestsPerUnit != 3 {
		t.Fatalf("own limit 3/month: current_limit %v, want 3/MONTH (it said 30 × DAY)", cl)
	}
	own := d("user", "u")
	own.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_HOUR}
	for i := 0; i < 2; i++ {
		r := e.ask(t, one("elsewhere", 0, own))
		if st := r.Statuses[0]; r.OverallCode != rlsv3.RateLimitResponse_OK || st.CurrentLimit != nil {
			t.Fatalf("own limit in an unknown domain, request %d: %v, want OK without a limit", i+1, r)
		}
	}
}

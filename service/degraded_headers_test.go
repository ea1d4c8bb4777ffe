package service_test

import (
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/floodgate/floodgate/internal/redistest"
	"github.com/floodgate/floodgate/redisstore"
	"github.com/floodgate/floodgate/service"
)

// While Redis does not answer, a failure mode's decision counted nothing:
// the response states the policy and (refusing) Retry-After, but no
// RateLimit remaining, as the middleware does.
func TestDegradedDecisionsClaimNoRemaining(t *testing.T) {
	rs := redistest.Standalone(t)
	// the timeout is not the subject: generous, so that the decision with
	// Redis up is Redis's on a starved CI host too
	st, err := redisstore.New("redis://"+rs.Addr, redisstore.Options{ClientTime: true, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	e := newEnv(t, service.Options{Store: st, XRateLimitHeaders: true}, `domain: f
descriptors:
  - key: open
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: closed
    rate_limit: {unit: minute, requests_per_unit: 5, failure_mode: closed}
`)
	ask := func(key string) *rlsv3.RateLimitResponse {
		return e.ask(t, &rlsv3.RateLimitRequest{Domain: "f", Descriptors: []*rlcommon.RateLimitDescriptor{d(key, "x")}})
	}
	if r := ask("open"); header(r, "RateLimit") == "" || header(r, "X-RateLimit-Remaining") == "" {
		t.Fatalf("with Redis up: %v", r.ResponseHeadersToAdd)
	}
	rs.Pause()
	defer rs.Resume()
	r := ask("open")
	if r.OverallCode != rlsv3.RateLimitResponse_OK || header(r, "RateLimit-Policy") == "" || header(r, "RateLimit") != "" || header(r, "X-RateLimit-Remaining") != "" {
		t.Errorf("failing open with Redis silent: %v %v", r.OverallCode, r.ResponseHeadersToAdd)
	}
	r = ask("closed")
	if r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || header(r, "Retry-After") == "" || header(r, "RateLimit") != "" {
		t.Errorf("failing closed with Redis silent: %v %v", r.OverallCode, r.ResponseHeadersToAdd)
	}
}

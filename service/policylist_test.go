package service_test

import (
	"fmt"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/floodgate/floodgate/service"
)

const policyListRules = `domain: p
descriptors:
  - key: blocked
    rate_limit: {unit: hour, requests_per_unit: 0}
  - key: two
    rate_limits:
      - {name: per-minute, unit: minute, requests_per_unit: 10}
      - {name: per-hour, unit: hour, requests_per_unit: 100}
  - key: n
    rate_limit: {unit: minute, requests_per_unit: 50}
`

// manyLimits is policyListRules with ten limits more, keys k0 to k9.
func manyLimits() string {
	s := policyListRules
	for i := range 10 {
		s += fmt.Sprintf("  - key: k%d\n    rate_limit: {unit: minute, requests_per_unit: %d}\n", i, 10+i)
	}
	return s
}

// A blocked hourly limit states w=3600 and the hour's end; RateLimit-Policy
// lists each rule of a multi-rule limit beside the other limits, at most 8
// items.
func TestPolicyListsEveryRuleBounded(t *testing.T) {
	e := newEnv(t, service.Options{}, manyLimits())
	e.clk.Advance(20 * time.Minute)
	r := e.ask(t, reqOf("p", d("blocked", "x")))
	if p, rl, ra := header(r, "RateLimit-Policy"), header(r, "RateLimit"), header(r, "Retry-After"); p != `"p.blocked";q=0;w=3600` || rl != `"p.blocked";r=0;t=2400` || ra != "2400" {
		t.Errorf("blocked: RateLimit-Policy %q, RateLimit %q, Retry-After %q", p, rl, ra)
	}
	r = e.ask(t, reqOf("p", d("n", "a"), d("two", "x")))
	if p := header(r, "RateLimit-Policy"); p != `"p.n";q=50;w=60, "per-minute";q=10;w=60, "per-hour";q=100;w=3600` {
		t.Errorf("a limit and a two-rule one: RateLimit-Policy %q", p)
	}
	// Ten descriptors of one limit are one policy, listed once.
	var ds []*rlcommon.RateLimitDescriptor
	for i := range 10 {
		ds = append(ds, d("n", fmt.Sprint(i)))
	}
	if p := header(e.ask(t, reqOf("p", ds...)), "RateLimit-Policy"); p != `"p.n";q=50;w=60` {
		t.Errorf("ten descriptors of one limit: RateLimit-Policy %q", p)
	}
	// A two-rule limit and ten others: the first 8 items.
	ds = []*rlcommon.RateLimitDescriptor{d("two", "y")}
	for i := range 10 {
		ds = append(ds, d(fmt.Sprintf("k%d", i), "v"))
	}
	want := `"per-minute";q=10;w=60, "per-hour";q=100;w=3600`
	for i := range 6 {
		want += fmt.Sprintf(`, "p.k%d";q=%d;w=60`, i, 10+i)
	}
	if p := header(e.ask(t, reqOf("p", ds...)), "RateLimit-Policy"); p != want {
		t.Errorf("twelve items: RateLimit-Policy\n%s, want\n%s", p, want)
	}
}

package service_test

// The tests of this file take envoyproxy/ratelimit's own tests and source
// (pinned at v1.4.1-0.20260122083618-3fb702589d36, as bench/envoydiff.sh
// pins it) as the oracle, and ask `floodgate serve`'s gRPC API, on a free
// loopback port, what they assert there. Each names the oracle's file and
// line. Where Floodgate differs by design (docs/SERVICE.md, docs/RULES.md)
// the test pins Floodgate's documented answer and says so.

import (
	"context"
	"math"
	"strconv"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/floodgate/floodgate/service"
)

// oracleEnv is a service served over gRPC on a loopback port, on a
// manual clock (newEnv's), and a client of it.
type oracleEnv struct {
	*env
	client rlsv3.RateLimitServiceClient
}

func newOracleEnv(t *testing.T, opts service.Options, files ...string) *oracleEnv {
	t.Helper()
	e := newEnv(t, opts, files...)
	conn := dialGRPC(t, e.serveGRPC(t))
	return &oracleEnv{env: e, client: rlsv3.NewRateLimitServiceClient(conn)}
}

func (o *oracleEnv) call(t *testing.T, req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := o.client.ShouldRateLimit(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// withLimit is dd with a descriptor's own limit (Envoy's `limit`).
func withLimit(dd *rlcommon.RateLimitDescriptor, rpu uint32, unit typev3.RateLimitUnit) *rlcommon.RateLimitDescriptor {
	dd.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: unit}
	return dd
}

func wantStatus(t *testing.T, what string, st *rlsv3.RateLimitResponse_DescriptorStatus, code rlsv3.RateLimitResponse_Code, rpu uint32, unit rlsv3.RateLimitResponse_RateLimit_Unit, name string, remaining uint32) {
	t.Helper()
	if st.Code != code {
		t.Errorf("%s: code %v, want %v", what, st.Code, code)
	}
	if st.CurrentLimit == nil {
		t.Errorf("%s: no current_limit, want %d/%v %q", what, rpu, unit, name)
	} else if cl := st.CurrentLimit; cl.RequestsPerUnit != rpu || cl.Unit != unit || cl.Name != name {
		t.Errorf("%s: current_limit %d/%v %q, want %d/%v %q", what, cl.RequestsPerUnit, cl.Unit, cl.Name, rpu, unit, name)
	}
	if st.LimitRemaining != remaining {
		t.Errorf("%s: limit_remaining %d, want %d", what, st.LimitRemaining, remaining)
	}
}

const oracleRules = `domain: o
descriptors:
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: named
    rate_limit: {name: key4_rate_limit, unit: minute, requests_per_unit: 20}
  - key: hourly
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: quota
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: both
    shadow_mode: true
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: narrow
    rate_limit: {name: narrow, unit: minute, requests_per_unit: 2}
  - key: replacer
    rate_limit:
      name: replacer
      unit: minute
      requests_per_unit: 50
      replaces: [{name: narrow}]
  - key: free
    rate_limit: {unlimited: true}
  - key: zero
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: bothzero
    shadow_mode: true
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: files
    value: "f*"
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: meta
    metadata: {team: a}
    rate_limit: {unit: minute, requests_per_unit: 100}
`

// current_limit.name is the name given in the file, and empty without one:
// test/config/config_test.go:155 ("No name provided in config") and :172
// (key4_rate_limit); the statuses of test/integration/integration_test.go:591
// and :635 carry no name either.
func TestOracleCurrentLimitName(t *testing.T) {
	o := newOracleEnv(t, service.Options{}, oracleRules)
	r := o.call(t, reqOf("o", d("plain", "a"), d("named", "a")))
	wantStatus(t, "unnamed", r.Statuses[0], rlsv3.RateLimitResponse_OK, 20, rlsv3.RateLimitResponse_RateLimit_MINUTE, "", 19)
	wantStatus(t, "named", r.Statuses[1], rlsv3.RateLimitResponse_OK, 20, rlsv3.RateLimitResponse_RateLimit_MINUTE, "key4_rate_limit", 19)
}

// test/integration/integration_test.go:612-640: 25 requests on a limit of
// 20 a minute: limit_remaining 19 down to 0, then OVER_LIMIT with 0
// remaining; and :683-711: two descriptors in one request are counted each
// on its own, the one under its limit still consuming when the other
// refuses the request; duration_until_reset is the time to the window's end
// (src/utils/utilities.go:41, CalculateReset).
func TestOracleCountingAndReset(t *testing.T) {
	o := newOracleEnv(t, service.Options{}, oracleRules)
	now := o.clk.Now().Unix()
	for i := range 25 {
		r := o.call(t, reqOf("o", d("plain", "k2")))
		code, rem := rlsv3.RateLimitResponse_OK, uint32(20-(i+1))
		if i >= 20 {
			code, rem = rlsv3.RateLimitResponse_OVER_LIMIT, 0
		}
		if r.OverallCode != code {
			t.Fatalf("request %d: overall %v, want %v", i+1, r.OverallCode, code)
		}
		wantStatus(t, "plain "+strconv.Itoa(i+1), r.Statuses[0], code, 20, rlsv3.RateLimitResponse_RateLimit_MINUTE, "", rem)
		if got, want := r.Statuses[0].DurationUntilReset.GetSeconds(), 60-now%60; got != want {
			t.Fatalf("request %d: duration_until_reset %ds, want %ds", i+1, got, want)
		}
	}
	for i := range 15 {
		r := o.call(t, reqOf("o", d("plain", "k3"), d("hourly", "k3")))
		code, rem1, rem2 := rlsv3.RateLimitResponse_OK, uint32(20-(i+1)), uint32(10-(i+1))
		if i >= 10 {
			code, rem2 = rlsv3.RateLimitResponse_OVER_LIMIT, 0
		}
		if r.OverallCode != code {
			t.Fatalf("pair %d: overall %v, want %v", i+1, r.OverallCode, code)
		}
		wantStatus(t, "pair minute", r.Statuses[0], rlsv3.RateLimitResponse_OK, 20, rlsv3.RateLimitResponse_RateLimit_MINUTE, "", rem1)
		wantStatus(t, "pair hour", r.Statuses[1], code, 10, rlsv3.RateLimitResponse_RateLimit_HOUR, "", rem2)
		if got, want := r.Statuses[1].DurationUntilReset.GetSeconds(), 3600-now%3600; got != want {
			t.Fatalf("pair %d: hour duration_until_reset %ds, want %ds", i+1, got, want)
		}
	}
}

// test/service/ratelimit_test.go:122-140 and :524-561: a descriptor that
// matches nothing is OK with no current_limit and 0 remaining; an
// unlimited one is OK with no current_limit and MaxUint32 remaining.
func TestOracleNoLimitAndUnlimited(t *testing.T) {
	o := newOracleEnv(t, service.Options{}, oracleRules)
	r := o.call(t, reqOf("o", d("plain", "u"), d("hello", "world"), d("free", "x")))
	if r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("overall %v", r.OverallCode)
	}
	wantStatus(t, "limited", r.Statuses[0], rlsv3.RateLimitResponse_OK, 20, rlsv3.RateLimitResponse_RateLimit_MINUTE, "", 19)
	for i, rem := range map[int]uint32{1: 0, 2: math.MaxUint32} {
		st := r.Statuses[i]
		if st.Code != rlsv3.RateLimitResponse_OK || st.CurrentLimit != nil || st.LimitRemaining != rem || st.DurationUntilReset != nil {
			t.Errorf("descriptor %d: %v, want OK, no limit, %d remaining, no duration", i, st, rem)
		}
	}
}

// test/service/ratelimit_test.go:460-482 (and src/service/ratelimit.go:188-189):
// an empty domain and an empty descriptor list are errors. The messages and
// gRPC codes differ (docs/SERVICE.md: InvalidArgument here, Unknown there).
func TestOracleEmptyDomainAndDescriptors(t *testing.T) {
	o := newOracleEnv(t, service.Options{}, oracleRules)
	for _, req := range []*rlsv3.RateLimitRequest{
		reqOf("", d("plain", "a")),
		reqOf("o"),
	} {
		_, err := o.client.ShouldRateLimit(context.Background(), req)
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("%v: %v, want InvalidArgument", req, err)
		}
	}
}

// test/service/ratelimit_test.go:274-346 (src/limiter/base_limiter.go:135):
// a shadow_mode limit over its limit says OK, with its current_limit and
// 0 remaining; beside it a limit over says OVER_LIMIT and decides.
func TestOracleRuleShadowMode(t *testing.T) {
	o := newOracleEnv(t, service.Options{}, oracleRules)
	for range 2 {
		o.call(t, reqOf("o", d("shadow", "s"), d("narrow", "s")))
	}
	r := o.call(t, reqOf("o", d("shadow", "s"), d("narrow", "s")))
	if r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("overall %v", r.OverallCode)
	}
	wantStatus(t, "shadow", r.Statuses[0], rlsv3.RateLimitResponse_OK, 2, rlsv3.RateLimitResponse_RateLimit_MINUTE, "", 0)
	wantStatus(t, "enforced", r.Statuses[1], rlsv3.RateLimitResponse_OVER_LIMIT, 2, rlsv3.RateLimitResponse_RateLimit_MINUTE, "narrow", 0)
	if r.Statuses[0].DurationUntilReset == nil {
		t.Errorf("shadow: no duration_until_reset (base_limiter.go:208 sets it)")
	}
}

// test/service/ratelimit_test.go:217-272 (src/service/ratelimit.go:258-262):
// SHADOW_MODE turns an OVER_LIMIT overall code into OK. There the
// descriptor's status still says OVER_LIMIT; here it says OK, as for a
// shadow_mode limit (a documented difference, docs/SERVICE.md).
func TestOracleGlobalShadowMode(t *testing.T) {
	o := newOracleEnv(t, service.Options{ShadowMode: true}, oracleRules)
	for range 2 {
		o.call(t, reqOf("o", d("narrow", "g")))
	}
	r := o.call(t, reqOf("o", d("narrow", "g"), d("hello", "world")))
	if r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("overall %v, want OK", r.OverallCode)
	}
	wantStatus(t, "over in global shadow mode", r.Statuses[0], rlsv3.RateLimitResponse_OK, 2, rlsv3.RateLimitResponse_RateLimit_MINUTE, "narrow", 0)
	if st := r.Statuses[1]; st.Code != rlsv3.RateLimitResponse_OK || st.CurrentLimit != nil {
		t.Errorf("no limit: %v", st)
	}
}

// test/service/ratelimit_test.go:779-876 (src/service/ratelimit.go:227-244):
// a quota_mode limit over its quota says OK with its current_limit and 0
// remaining, the response OK unless another limit refuses; its index is in
// quotaModeViolations (:722-777).
func TestOracleQuotaMode(t *testing.T) {
	o := newOracleEnv(t, service.Options{}, oracleRules)
	for range 2 {
		o.call(t, reqOf("o", d("quota", "q"), d("narrow", "q")))
	}
	r := o.call(t, reqOf("o", d("narrow", "q"), d("quota", "q")))
	if r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("overall %v", r.OverallCode)
	}
	wantStatus(t, "regular", r.Statuses[0], rlsv3.RateLimitResponse_OVER_LIMIT, 2, rlsv3.RateLimitResponse_RateLimit_MINUTE, "narrow", 0)
	wantStatus(t, "quota", r.Statuses[1], rlsv3.RateLimitResponse_OK, 2, rlsv3.RateLimitResponse_RateLimit_MINUTE, "", 0)
	if v := violations(r); len(v) != 1 || v[0] != 1 {
		t.Errorf("quotaModeViolations %v, want [1]", v)
	}
	if f := r.GetDynamicMetadata().GetFields()["quotaModeEnabled"]; !f.GetBoolValue() {
		t.Errorf("quotaModeEnabled %v", f)
	}

	// quota mode only: OK overall (ratelimit_test.go:830-876)
	r = o.call(t, reqOf("o", d("quota", "q")))
	if r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("quota alone: overall %v", r.OverallCode)
	}
}

func violations(r *rlsv3.RateLimitResponse) []int {
	var out []int
	for _, v := range r.GetDynamicMetadata().GetFields()["quotaModeViolations"].GetListValue().GetValues() {
		out = append(out, int(v.GetNumberValue()))
	}
	return out
}

// A limit in both shadow_mode and quota_mode: its limiter turns the
// over-limit answer into OK before the service sees it
// (src/limiter/base_limiter.go:135-140), so the service's quota handling
// (src/service/ratelimit.go:227) never counts it as a quota violation:
// OK, and no quotaModeViolations.
func TestOracleShadowAndQuotaMode(t *testing.T) {
	o := newOracleEnv(t, service.Options{}, oracleRules)
	o.call(t, reqOf("o", d("both", "b")))
	r := o.call(t, reqOf("o", d("both", "b")))
	if r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("overall %v", r.OverallCode)
	}
	wantStatus(t, "shadow and quota", r.Statuses[0], rlsv3.RateLimitResponse_OK, 1, rlsv3.RateLimitResponse_RateLimit_MINUTE, "", 0)
	if v := violations(r); len(v) != 0 {
		t.Errorf("quotaModeViolations %v, want none: the shadow_mode limit is OK before quota mode sees it", v)
	}
	// requests_per_unit 0 alike
	r = o.call(t, reqOf("o", d("bothzero", "b")))
	if r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].Code != rlsv3.RateLimitResponse_OK {
		t.Fatalf("blocked in shadow and quota mode: %v", r)
	}
	if v := violations(r); len(v) != 0 {
		t.Errorf("blocked: quotaModeViolations %v, want none", v)
	}
}

// src/config/config_impl.go:332-348: a descriptor's own limit (Envoy's
// `limit`) is a limit of its own, "we don't want to enable shadow_mode":
// not the matched rule's shadow_mode nor quota_mode, and it replaces
// nothing (Replaces: []string{}), nor can it be replaced (no name). With
// --allow-request-limits Floodgate must answer the same.
func TestOracleOwnLimitIsNotTheRules(t *testing.T) {
	for name, mk := range bothStores {
		t.Run(name, func(t *testing.T) {
			o := newOracleEnv(t, service.Options{AllowRequestLimits: true, Store: mk(t)}, oracleRules)
			minute := typev3.RateLimitUnit_MINUTE
			// shadow_mode on the matched rule: the own limit of 1 refuses
			o.call(t, reqOf("o", withLimit(d("shadow", "own"), 1, minute)))
			r := o.call(t, reqOf("o", withLimit(d("shadow", "own"), 1, minute)))
			if r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
				t.Errorf("own limit under a shadow_mode rule: overall %v, want OVER_LIMIT", r.OverallCode)
			}
			wantStatus(t, "own limit under shadow_mode", r.Statuses[0], rlsv3.RateLimitResponse_OVER_LIMIT, 1, rlsv3.RateLimitResponse_RateLimit_MINUTE, "", 0)

			// quota_mode on the matched rule: refused too, and no violation
			o.call(t, reqOf("o", withLimit(d("quota", "own"), 1, minute)))
			r = o.call(t, reqOf("o", withLimit(d("quota", "own"), 1, minute)))
			if r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || len(violations(r)) != 0 {
				t.Errorf("own limit under a quota_mode rule: overall %v, violations %v; want OVER_LIMIT, none", r.OverallCode, violations(r))
			}

			// the matched rule replaces "narrow": the own limit does not
			for range 2 {
				o.call(t, reqOf("o", d("narrow", "own")))
			}
			r = o.call(t, reqOf("o", withLimit(d("replacer", "own"), 10, minute), d("narrow", "own")))
			if r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
				t.Errorf("own limit under a replacing rule: overall %v, want OVER_LIMIT (narrow not replaced)", r.OverallCode)
			}
			wantStatus(t, "own limit beside narrow", r.Statuses[0], rlsv3.RateLimitResponse_OK, 10, rlsv3.RateLimitResponse_RateLimit_MINUTE, "", 9)
			wantStatus(t, "narrow beside an own limit", r.Statuses[1], rlsv3.RateLimitResponse_OVER_LIMIT, 2, rlsv3.RateLimitResponse_RateLimit_MINUTE, "narrow", 0)

			// and a named rule's descriptor with an own limit is not replaced
			r = o.call(t, reqOf("o", withLimit(d("narrow", "own2"), 3, minute), d("replacer", "own2")))
			wantStatus(t, "own limit on a replaced rule", r.Statuses[0], rlsv3.RateLimitResponse_OK, 3, rlsv3.RateLimitResponse_RateLimit_MINUTE, "", 2)

			// share_threshold is the rule's: each value has its own limit
			// (src/limiter/cache_key.go: the own limit has no
			// ShareThresholdKeyPattern)
			for _, v := range []string{"fa", "fb"} {
				r = o.call(t, reqOf("o", withLimit(d("files", v), 1, minute)))
				wantStatus(t, "own limit under share_threshold, "+v, r.Statuses[0], rlsv3.RateLimitResponse_OK, 1, rlsv3.RateLimitResponse_RateLimit_MINUTE, "", 0)
			}
			// and so is metadata
			r = o.call(t, reqOf("o", withLimit(d("meta", "m"), 5, minute)))
			if r.DynamicMetadata != nil {
				t.Errorf("own limit under a rule with metadata: dynamic_metadata %v, want none", r.DynamicMetadata)
			}
		})
	}
}

// src/service/ratelimit.go:204-256 with LIMIT_RESPONSE_HEADERS_ENABLED
// (test/service/ratelimit_test.go:348-458): the headers speak of the
// descriptor with the fewest remaining among those with a limit, or of the
// one over the limit: its requests_per_unit, its remaining and the seconds
// to its window's end. Floodgate names them X-RateLimit-* (docs/SERVICE.md;
// the oracle's default names are RateLimit-Limit, -Remaining and -Reset).
func TestOracleXRateLimitHeaders(t *testing.T) {
	o := newOracleEnv(t, service.Options{XRateLimitHeaders: true, NoRateLimitHeaders: true}, oracleRules)
	now := o.clk.Now().Unix()
	hdrs := func(r *rlsv3.RateLimitResponse) [3]string {
		return [3]string{header(r, "X-RateLimit-Limit"), header(r, "X-RateLimit-Remaining"), header(r, "X-RateLimit-Reset")}
	}
	// OK: the fewest remaining (the hourly 9 of 10, not the 19 of 20)
	r := o.call(t, reqOf("o", d("plain", "h"), d("hourly", "h"), d("hello", "world")))
	if got, want := hdrs(r), [3]string{"10", "9", strconv.FormatInt(3600-now%3600, 10)}; got != want {
		t.Errorf("OK: headers %v, want %v", got, want)
	}
	if len(r.ResponseHeadersToAdd) != 3 {
		t.Errorf("OK: %d headers, want 3: %v", len(r.ResponseHeadersToAdd), r.ResponseHeadersToAdd)
	}
	// no descriptor with a limit (unknown, unlimited): no headers
	r = o.call(t, reqOf("o", d("hello", "world"), d("free", "x")))
	if len(r.ResponseHeadersToAdd) != 0 {
		t.Errorf("no limit: headers %v, want none", r.ResponseHeadersToAdd)
	}
	// over: the refusing descriptor, 0 remaining
	for range 2 {
		o.call(t, reqOf("o", d("narrow", "h")))
	}
	r = o.call(t, reqOf("o", d("plain", "h2"), d("narrow", "h")))
	if got, want := hdrs(r), [3]string{"2", "0", strconv.FormatInt(60-now%60, 10)}; got != want {
		t.Errorf("over: headers %v, want %v", got, want)
	}
	// requests_per_unit 0: limit 0, 0 remaining
	r = o.call(t, reqOf("o", d("zero", "z")))
	if got, want := hdrs(r), [3]string{"0", "0", strconv.FormatInt(60-now%60, 10)}; got != want {
		t.Errorf("blocked: headers %v, want %v", got, want)
	}
}

// src/config/config_impl.go:319-348 (test/config/config_test.go:256-334):
// a descriptor's own limit applies in a known domain whatever the
// descriptor matches, said as given: requests_per_unit and unit, no name.
func TestOracleOwnLimitAsGiven(t *testing.T) {
	o := newOracleEnv(t, service.Options{AllowRequestLimits: true}, oracleRules)
	r := o.call(t, reqOf("o", withLimit(d("key1", "value1", "subkey1", "something"), 10, typev3.RateLimitUnit_DAY)))
	wantStatus(t, "own limit", r.Statuses[0], rlsv3.RateLimitResponse_OK, 10, rlsv3.RateLimitResponse_RateLimit_DAY, "", 9)
	r = o.call(t, reqOf("foo_domain", withLimit(d("key1", "value1"), 10, typev3.RateLimitUnit_DAY)))
	if st := r.Statuses[0]; st.CurrentLimit != nil {
		t.Errorf("own limit in an unknown domain: %v, want no limit", st)
	}
}

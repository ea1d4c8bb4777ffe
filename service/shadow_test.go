package service_test

import (
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/floodgate/floodgate/service"
)

// The service's shadow mode (envoyproxy/ratelimit's SHADOW_MODE) acts as
// shadow_mode: true on every limit: decisions are made and counted, the
// metrics say shadow_over_limit, and nothing is refused, not even by a
// requests_per_unit: 0 limit or an all_or_nothing group; the headers,
// which speak of enforced limits only, are left out.
func TestServiceShadowMode(t *testing.T) {
	const file = `domain: s
all_or_nothing: true
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: banned
    rate_limit: {unit: minute, requests_per_unit: 0}
`
	m := service.NewMetrics()
	e := newEnv(t, service.Options{ShadowMode: true, Metrics: m}, file)
	for i := range 4 {
		r := e.ask(t, reqOf("s", d("user", "u"), d("ip", "i"), d("banned", "b")))
		if r.OverallCode != rlsv3.RateLimitResponse_OK || len(r.ResponseHeadersToAdd) != 0 {
			t.Fatalf("request %d in shadow mode: %v, headers %v", i+1, r.OverallCode, r.ResponseHeadersToAdd)
		}
		for j, st := range r.Statuses {
			if st.Code != rlsv3.RateLimitResponse_OK {
				t.Fatalf("request %d, descriptor %d: %v", i+1, j, st.Code)
			}
		}
		// counted: the user's 2 are used up by the second request
		if want := uint32(max(2-(i+1), 0)); r.Statuses[0].LimitRemaining != want {
			t.Fatalf("request %d: user has %d left, want %d", i+1, r.Statuses[0].LimitRemaining, want)
		}
		if want := uint32(5 - (i + 1)); r.Statuses[1].LimitRemaining != want {
			t.Fatalf("request %d: ip has %d left, want %d (each descriptor counted on its own)", i+1, r.Statuses[1].LimitRemaining, want)
		}
	}
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	shadowOver, over := 0.0, 0.0
	for _, mf := range mfs {
		if mf.GetName() != "floodgate_decisions_total" {
			continue
		}
		for _, mt := range mf.GetMetric() {
			for _, l := range mt.GetLabel() {
				if l.GetName() != "outcome" {
					continue
				}
				switch l.GetValue() {
				case "shadow_over_limit":
					shadowOver += mt.GetCounter().GetValue()
				case "over_limit":
					over += mt.GetCounter().GetValue()
				}
			}
		}
	}
	// the user over twice, the banned descriptor four times
	if shadowOver != 6 || over != 0 {
		t.Fatalf("metrics: %v shadow_over_limit and %v over_limit, want 6 and 0", shadowOver, over)
	}

	// without it, the same rules refuse
	e = newEnv(t, service.Options{}, file)
	if r := e.ask(t, reqOf("s", d("user", "u"), d("ip", "i"), d("banned", "b"))); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("without shadow mode: %v", r.OverallCode)
	}
}

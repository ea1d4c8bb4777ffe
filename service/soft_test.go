package service_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/floodgate/floodgate/service"
)

// soft: 10 a minute, 20% more admitted with a warning (a ceiling of 12);
// hard: 10 a minute, never warned; shadowsoft: soft, in shadow mode.
const softRules = `domain: soft
all_or_nothing: false
descriptors:
  - key: user
    rate_limit:
      unit: minute
      requests_per_unit: 10
      mode: soft
      soft_percent: 20
  - key: hard
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: shadowsoft
    shadow_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 10
      mode: soft
      soft_percent: 20
`

func softReq(kv ...string) *rlsv3.RateLimitRequest {
	req := &rlsv3.RateLimitRequest{Domain: "soft"}
	for i := 0; i+1 < len(kv); i += 2 {
		req.Descriptors = append(req.Descriptors, d(kv[i], kv[i+1]))
	}
	return req
}

// Through a real gRPC client, with Envoy's types, on both stores: below
// the soft line, OK and no warning; past it and below the ceiling, OK
// with Floodgate-Warning among response_headers_to_add (beside the
// RateLimit headers); past the ceiling, OVER_LIMIT and no warning. The
// metrics count each crossing, per rule, and count the crossings among
// the ok decisions.
func TestSoftLimitWarnsThroughGRPC(t *testing.T) {
	for name, store := range bothStores {
		t.Run(name, func(t *testing.T) {
			m := service.NewMetrics()
			e := newEnv(t, service.Options{Store: store(t), Metrics: m}, softRules)
			client := rlsv3.NewRateLimitServiceClient(dialGRPC(t, e.serveGRPC(t)))
			for i := 1; i <= 13; i++ {
				resp, err := client.ShouldRateLimit(context.Background(), softReq("user", "alice"))
				if err != nil {
					t.Fatal(err)
				}
				warning := header(resp, service.HeaderWarning)
				switch {
				case i <= 10:
					if resp.OverallCode != rlsv3.RateLimitResponse_OK || warning != "" {
						t.Fatalf("request %d, below the soft line: %v, warning %q", i, resp.OverallCode, warning)
					}
				case i <= 12:
					if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].Code != rlsv3.RateLimitResponse_OK || warning != "soft limit exceeded" {
						t.Fatalf("request %d, past the soft line: %v (%v), warning %q", i, resp.OverallCode, resp.Statuses[0].Code, warning)
					}
					if header(resp, "RateLimit") == "" || header(resp, "Retry-After") != "" {
						t.Fatalf("request %d: the RateLimit headers: %v", i, resp.ResponseHeadersToAdd)
					}
				default:
					if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || warning != "" {
						t.Fatalf("request %d, past the ceiling: %v, warning %q", i, resp.OverallCode, warning)
					}
				}
			}
			soft := gatherSeries(t, m, "floodgate_soft_limit_crossings_total")
			if len(soft) != 1 || soft["domain=soft,rule=soft.user"] != 2 {
				t.Fatalf("soft crossings: %v; want 2 for soft.user", soft)
			}
			dec := gatherSeries(t, m, "floodgate_decisions_total")
			if dec["domain=soft,outcome=ok,rule=soft.user"] != 12 || dec["domain=soft,outcome=over_limit,rule=soft.user"] != 1 {
				t.Fatalf("decisions: %v", dec)
			}
		})
	}
}

// A limit crossed softly leaves the overall code OK whatever else the
// request carries that is within its limits; a hard limit never warns,
// even refused; a soft limit in shadow mode is counted but never warns
// (its client is told nothing of a limit not enforced); the warning does
// not depend on the RateLimit headers being sent.
func TestSoftLimitWarningOnly(t *testing.T) {
	m := service.NewMetrics()
	e := newEnv(t, service.Options{Metrics: m, NoRateLimitHeaders: true}, softRules)
	for i := 1; i <= 11; i++ {
		resp := e.ask(t, softReq("user", "bob", "hard", "bob", "shadowsoft", "bob"))
		// hard refuses the 11th: that is the only OVER_LIMIT
		wantCode := rlsv3.RateLimitResponse_OK
		if i == 11 {
			wantCode = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if resp.OverallCode != wantCode {
			t.Fatalf("request %d: %v, want %v", i, resp.OverallCode, wantCode)
		}
		if n := len(resp.ResponseHeadersToAdd); i <= 10 && n != 0 {
			t.Fatalf("request %d: headers %v, want none (no RateLimit headers, no soft crossing)", i, resp.ResponseHeadersToAdd)
		}
		if i == 11 && (len(resp.ResponseHeadersToAdd) != 1 || header(resp, service.HeaderWarning) != service.WarningValue) {
			t.Fatalf("request 11: headers %v, want the warning alone (user crossed softly)", resp.ResponseHeadersToAdd)
		}
	}
	// the shadow rule alone crossing softly: counted, not warned
	e2 := newEnv(t, service.Options{Metrics: m}, softRules)
	for i := 1; i <= 12; i++ {
		resp := e2.ask(t, softReq("shadowsoft", "carol"))
		if resp.OverallCode != rlsv3.RateLimitResponse_OK || header(resp, service.HeaderWarning) != "" {
			t.Fatalf("shadow request %d: %v, warning %q", i, resp.OverallCode, header(resp, service.HeaderWarning))
		}
	}
	// and a hard limit alone, refused: no warning
	for i := 1; i <= 11; i++ {
		if resp := e2.ask(t, softReq("hard", "dave")); header(resp, service.HeaderWarning) != "" {
			t.Fatalf("hard request %d warned", i)
		}
	}
	soft := gatherSeries(t, m, "floodgate_soft_limit_crossings_total")
	if soft["domain=soft,rule=soft.user"] != 1 || soft["domain=soft,rule=soft.shadowsoft"] != 3 || soft["domain=soft,rule=soft.hard"] != 0 {
		t.Fatalf("soft crossings: %v", soft)
	}
}

// POST /json mirrors response_headers_to_add as HTTP headers: the warning
// is one, on a 200; past the ceiling, 429 without it.
func TestSoftLimitWarnsOverJSON(t *testing.T) {
	e := newEnv(t, service.Options{}, softRules)
	srv := httptest.NewServer(e.svc.HTTPHandler(nil, nil))
	t.Cleanup(srv.Close)
	body := `{"domain":"soft","descriptors":[{"entries":[{"key":"user","value":"erin"}]}]}`
	for i := 1; i <= 13; i++ {
		resp, err := http.Post(srv.URL+"/json", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		got := fmt.Sprintf("%d %q", resp.StatusCode, resp.Header.Get("Floodgate-Warning"))
		want := `200 ""`
		switch {
		case i == 11 || i == 12:
			want = `200 "soft limit exceeded"`
		case i == 13:
			want = `429 ""`
		}
		if got != want {
			t.Fatalf("request %d: %s, want %s (%s)", i, got, want, b)
		}
		if i == 11 && !strings.Contains(string(b), `"Floodgate-Warning"`) {
			t.Fatalf("the JSON response does not carry the header: %s", b)
		}
	}
}

package service_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/floodgate/floodgate/internal/redistest"
	"github.com/floodgate/floodgate/overrides"
	"github.com/floodgate/floodgate/redisstore"
	"github.com/floodgate/floodgate/rules"
	"github.com/floodgate/floodgate/service"
)

const dayRules = `domain: day
descriptors:
  - key: day
    rate_limit:
      unit: day
      requests_per_unit: 100
`

// adminCall sends one admin request and returns its status and body.
func adminCall(t *testing.T, url, method, path, body string) (int, string) {
	t.Helper()
	return adminCallAuth(t, url, "", method, path, body)
}

// adminCallAuth is adminCall with a bearer token (none when empty).
func adminCallAuth(t *testing.T, url, token, method, path, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, url+path, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req) // a hung call fails, not hangs
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// Two override changes of one key at once still carry its count: each
// starts from what the other left. Without the admin lock both carried
// from the rule's own numbers, and the later move overwrote the count with
// a fresh quota (an audit saw 200 or 300 left of 60 used).
func TestConcurrentOverrideChangesKeepTheCount(t *testing.T) {
	for name, newStore := range bothStores {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, service.Options{Store: newStore(t), Overrides: overrideCache(t)}, dayRules)
			srv := httptest.NewServer(e.svc.AdminHandler(""))
			t.Cleanup(srv.Close)
			for round := range 12 {
				value := fmt.Sprintf("race%d", round)
				key := e.svc.Rules().Match("day", []rules.Entry{{Key: "day", Value: value}}).Key
				spend := d("day", value)
				spend.HitsAddend = wrapperspb.UInt64(60)
				e.ask(t, reqOf("day", spend))
				var wg sync.WaitGroup
				for _, limit := range []int{200, 300} {
					wg.Go(func() {
						if code, body := adminCall(t, srv.URL, "PUT", "/v1/overrides/day/"+key, fmt.Sprintf(`{"limit":%d,"period":"24h"}`, limit)); code != 200 {
							t.Errorf("PUT %d: %d %s", limit, code, body)
						}
					})
				}
				wg.Wait()
				o, ok, err := e.ovr.Get(t.Context(), "day", key)
				if err != nil || !ok {
					t.Fatalf("override after the PUTs: %v %v", ok, err)
				}
				peek := d("day", value)
				peek.HitsAddend = wrapperspb.UInt64(0)
				got := e.ask(t, reqOf("day", peek)).Statuses[0].LimitRemaining
				if want := uint32(o.Limit - 60); got != want {
					t.Fatalf("round %d: %d left under the override of %d after 60 used, want %d", round, got, o.Limit, want)
				}
			}
		})
	}
}

// With its stores silent (Redis paused: it takes calls and never answers),
// every admin call answers 503 within Options.AdminTimeout instead of waiting as
// long as its client does, and a reset or inspect the store did not do is
// not reported as done.
func TestAdminAnswersWhenTheStoreIsSilent(t *testing.T) {
	rs := redistest.Standalone(t)
	// The store's timeout is not the subject (Options.AdminTimeout is): generous,
	// and the admin call's own deadline ends the calls to a silent Redis.
	st, err := redisstore.New("redis://"+rs.Addr, redisstore.Options{ClientTime: true, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	cache := overrides.NewCache(overrides.NewRedis(st.Client(), "ovr"), 1024, 0)
	t.Cleanup(func() { cache.Close() })
	// Redis up, the default timeout: a starved CI host can take longer than
	// the short one below
	up := newEnv(t, service.Options{Store: st, Overrides: cache}, dayRules)
	upSrv := httptest.NewServer(up.svc.AdminHandler(""))
	t.Cleanup(upSrv.Close)
	key := up.svc.Rules().Match("day", []rules.Entry{{Key: "day", Value: "u"}}).Key
	body := `{"domain":"day","entries":[{"key":"day","value":"u"}]}`
	if code, b := adminCall(t, upSrv.URL, "POST", "/v1/keys/inspect", body); code != 200 {
		t.Fatalf("inspect with Redis up: %d %s", code, b)
	}
	e := newEnv(t, service.Options{Store: st, Overrides: cache, AdminTimeout: 300 * time.Millisecond}, dayRules)
	srv := httptest.NewServer(e.svc.AdminHandler(""))
	t.Cleanup(srv.Close)
	rs.Pause()
	defer rs.Resume()
	for _, c := range []struct{ method, path, body string }{
		{"PUT", "/v1/overrides/day/" + key, `{"limit":5,"period":"1s"}`},
		{"GET", "/v1/overrides/day/" + key, ""},
		{"GET", "/v1/overrides/day", ""},
		{"DELETE", "/v1/overrides/day/" + key, ""},
		{"POST", "/v1/keys/reset", body},
		{"POST", "/v1/keys/inspect", body},
	} {
		start := time.Now()
		code, b := adminCall(t, srv.URL, c.method, c.path, c.body)
		if el := time.Since(start); code != http.StatusServiceUnavailable || el > 5*time.Second {
			t.Errorf("%s %s with Redis silent: %d after %s, want 503 within AdminTimeout: %s", c.method, c.path, code, el, b)
		}
		var out struct{ Error string }
		if json.Unmarshal([]byte(b), &out) != nil || out.Error == "" {
			t.Errorf("%s %s: body %q, want a JSON error", c.method, c.path, b)
		} else if strings.HasPrefix(c.path, "/v1/overrides") && !strings.Contains(out.Error, "within 300ms") {
			t.Errorf("%s %s: body %q, want an error naming Options.AdminTimeout", c.method, c.path, b)
		}
	}
}

// An override's limit and burst are bounded as a rule file's are: Envoy's
// requests_per_unit is 32 bits, and a larger limit would be reported as
// one number and enforced as another.
func TestOverrideLimitIsBounded(t *testing.T) {
	e := newEnv(t, service.Options{Overrides: overrideCache(t)}, dayRules)
	srv := httptest.NewServer(e.svc.AdminHandler(""))
	t.Cleanup(srv.Close)
	for body, want := range map[string]int{
		`{"limit":4294967295,"period":"1s"}`:           200,
		`{"limit":4294967296,"period":"1s"}`:           400,
		`{"limit":5,"period":"1s","burst":4294967296}`: 400,
		`{"limit":5,"period":"1s","burst":4294967295}`: 200,
		`{"limit":9223372036854775807,"period":"1s"}`:  400,
		`{"limit":-1,"period":"1s"}`:                   400,
	} {
		// a key no limit matches: only the override's own bounds apply
		code, b := adminCall(t, srv.URL, "PUT", "/v1/overrides/day/other=u", body)
		if code != want || (want == 400 && !strings.Contains(b, "override")) {
			t.Errorf("PUT %s: %d %s, want %d", body, code, b, want)
		}
		if strings.Count(b, "override") > 1 { // the error names the override once
			t.Errorf("PUT %s: %s: the override named twice", body, b)
		}
	}
}

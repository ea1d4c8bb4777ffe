package service_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/floodgate/floodgate/rules"
	"github.com/floodgate/floodgate/service"
)

const topRules = `domain: top
descriptors:
  - key: user
    rate_limit:
      unit: hour
      requests_per_unit: 2
  - key: ip
    rate_limit:
      name: per_ip
      unit: hour
      requests_per_unit: 1
`

type topAnswer struct {
	Rules []service.TopRule `json:"rules"`
}

// getTop calls GET /v1/top with the token and decodes a 200 answer.
func getTop(t *testing.T, url, token, query string) (int, topAnswer, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url+"/v1/top"+query, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var raw strings.Builder
	var buf [4096]byte
	for {
		n, err := resp.Body.Read(buf[:])
		raw.Write(buf[:n])
		if err != nil {
			break
		}
	}
	var a topAnswer
	if resp.StatusCode == 200 {
		if err := json.Unmarshal([]byte(raw.String()), &a); err != nil {
			t.Fatalf("GET /v1/top%s: %v: %s", query, err, raw.String())
		}
	}
	return resp.StatusCode, a, raw.String()
}

// TestTopLimitedKeys floods one key and many one-off keys through the
// service's gRPC API, and reads GET /v1/top from its admin handler over
// HTTP: the flooding key is first, with its exact count; keys never over
// their limit are never listed; the filters and n work; the rule is named
// as GET /v1/rules names it.
func TestTopLimitedKeys(t *testing.T) {
	e := newEnv(t, service.Options{}, topRules)
	client := rlsv3.NewRateLimitServiceClient(dialGRPC(t, e.serveGRPC(t)))
	ask := func(kv ...string) {
		t.Helper()
		if _, err := client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "top", Descriptors: []*rlcommon.RateLimitDescriptor{d(kv...)}}); err != nil {
			t.Fatal(err)
		}
	}
	for range 52 {
		ask("user", "flooder") // 2 allowed, 50 refused
	}
	for i := range 30 {
		ask("user", fmt.Sprint("light", i)) // one each: never over
	}
	for i := range 600 { // more one-off refused keys than a rule keeps
		ask("ip", fmt.Sprint("10.0.", i/256, ".", i%256))
		ask("ip", fmt.Sprint("10.0.", i/256, ".", i%256))
	}
	ask("ip", "10.9.9.9")
	for range 40 {
		ask("ip", "10.9.9.9")
	}
	srv := httptest.NewServer(e.svc.AdminHandler("s3cret"))
	t.Cleanup(srv.Close)

	code, a, body := getTop(t, srv.URL, "s3cret", "")
	if code != 200 || len(a.Rules) != 2 {
		t.Fatalf("GET /v1/top: %d %s", code, body)
	}
	// the rule's name, as GET /v1/rules shows it
	userRule := e.svc.Rules().Match("top", []rules.Entry{{Key: "user", Value: "x"}}).Limit.Name
	if !strings.Contains(rulesJSON(t, srv.URL, "s3cret"), `"name": "`+userRule+`"`) {
		t.Fatalf("rule %q not named so in GET /v1/rules", userRule)
	}
	byRule := map[string]service.TopRule{}
	for _, r := range a.Rules {
		if r.Domain != "top" {
			t.Errorf("rule of domain %q", r.Domain)
		}
		if len(r.Keys) > 10 {
			t.Errorf("rule %s: %d keys, want at most the default 10", r.Rule, len(r.Keys))
		}
		byRule[r.Rule] = r
	}
	u := byRule[userRule]
	if len(u.Keys) != 1 || u.Keys[0] != (service.TopKey{Key: "user=flooder", Count: 50, Error: 0}) {
		t.Errorf("rule %s: %+v, want only user=flooder with 50 refusals, exact", userRule, u.Keys)
	}
	ip := byRule["per_ip"]
	if len(ip.Keys) != 10 || ip.Keys[0].Key != "ip=10.9.9.9" || ip.Keys[0].Count < 40 {
		t.Errorf("per_ip: %+v, want 10 keys, ip=10.9.9.9 first with at least 40", ip.Keys)
	}
	for _, k := range ip.Keys {
		if k.Count < k.Error {
			t.Errorf("key %+v: error above its count", k)
		}
	}

	// filters and n
	if code, a, body := getTop(t, srv.URL, "s3cret", "?domain=top&rule=per_ip&n=100"); code != 200 || len(a.Rules) != 1 || a.Rules[0].Rule != "per_ip" || len(a.Rules[0].Keys) != 100 {
		t.Errorf("rule=per_ip&n=100: %d, %d rules %s", code, len(a.Rules), body[:min(len(body), 200)])
	}
	if code, a, _ := getTop(t, srv.URL, "s3cret", "?domain=other"); code != 200 || len(a.Rules) != 0 {
		t.Errorf("domain=other: %d %+v, want no rule", code, a)
	}
	if _, _, body := getTop(t, srv.URL, "s3cret", "?domain=other"); !strings.Contains(body, `"rules": []`) {
		t.Errorf("no rule answers rules: [], not null: %s", body)
	}
	for _, bad := range []string{"0", "101", "x", "-1"} {
		code, _, body := getTop(t, srv.URL, "s3cret", "?n="+bad)
		if code != 400 || !strings.Contains(body, `"n: `) {
			t.Errorf("n=%s: %d %s, want 400 naming n", bad, code, body)
		}
	}
	// the token guards it as the rest of the admin API
	for _, tok := range []string{"", "wrong"} {
		if code, _, _ := getTop(t, srv.URL, tok, ""); code != 401 {
			t.Errorf("token %q: %d, want 401", tok, code)
		}
	}
}

func rulesJSON(t *testing.T, url, token string) string {
	t.Helper()
	req, _ := http.NewRequest("GET", url+"/v1/rules", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	var buf [4096]byte
	for {
		n, err := resp.Body.Read(buf[:])
		b.Write(buf[:n])
		if err != nil {
			return b.String()
		}
	}
}

// TestTopLimitedBounds: however many rules refuse, at most LimitedRules
// are tracked; a reload drops the rules no longer live, which frees their
// place.
func TestTopLimitedBounds(t *testing.T) {
	var f strings.Builder
	f.WriteString("domain: many\ndescriptors:\n")
	const n = service.LimitedRules + 50
	for i := range n {
		fmt.Fprintf(&f, "  - key: k%d\n    rate_limit:\n      unit: hour\n      requests_per_unit: 0\n", i)
	}
	e := newEnv(t, service.Options{}, f.String(), topRules)
	for i := range n {
		e.ask(t, reqOf("many", d(fmt.Sprint("k", i), "v")))
	}
	if got := len(e.svc.TopLimited("", "", 10)); got != service.LimitedRules {
		t.Fatalf("%d rules tracked, want the bound %d", got, service.LimitedRules)
	}
	// a reload without domain many: its rules go, another rule comes in
	d0, err := rules.Parse("top.yaml", []byte(topRules))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := rules.NewConfig(d0)
	if err != nil {
		t.Fatal(err)
	}
	e.svc.SetRules(cfg)
	if got := e.svc.TopLimited("many", "", 10); len(got) != 0 {
		t.Errorf("after the reload, %d rules of a domain gone", len(got))
	}
	e.ask(t, reqOf("top", d("ip", "a")))
	e.ask(t, reqOf("top", d("ip", "a")))
	if got := e.svc.TopLimited("", "per_ip", 10); len(got) != 1 || got[0].Keys[0] != (service.TopKey{Key: "ip=a", Count: 1}) {
		t.Errorf("per_ip after the reload: %+v", got)
	}
}

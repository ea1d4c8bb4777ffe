package service_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/floodgate/floodgate/overrides"
	"github.com/floodgate/floodgate/rules"
	"github.com/floodgate/floodgate/service"
)

// A descriptor with several rules: 100 per second and 5 per hour.
const severalRules = `domain: multi
descriptors:
  - key: u
    rate_limits:
      - name: fast
        unit: second
        requests_per_unit: 100
      - name: slow
        unit: hour
        requests_per_unit: 5
`

func reqOf(domain string, ds ...*rlcommon.RateLimitDescriptor) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds}
}

// The status and the headers of a descriptor with several rules speak of
// the rule that decides, all of it: its name, its limit and its window;
// RateLimit-Policy lists every rule.
func TestSeveralRulesReportTheDecidingRule(t *testing.T) {
	e := newEnv(t, service.Options{}, severalRules)
	r := e.ask(t, reqOf("multi", d("u", "a")))
	cl := r.Statuses[0].CurrentLimit
	// admitted: the rule with the fewest requests left decides (4 of 5 per hour)
	if cl.GetName() != "slow" || cl.GetRequestsPerUnit() != 5 || cl.GetUnit() != rlsv3.RateLimitResponse_RateLimit_HOUR || r.Statuses[0].LimitRemaining != 4 {
		t.Fatalf("admitted: %v", r.Statuses[0])
	}
	if got := header(r, "RateLimit-Policy"); got != `"fast";q=100;w=1, "slow";q=5;w=3600` {
		t.Fatalf("RateLimit-Policy %q", got)
	}
	if got := header(r, "RateLimit"); !strings.HasPrefix(got, `"slow";r=4;`) {
		t.Fatalf("RateLimit %q", got)
	}
	for range 4 {
		e.ask(t, reqOf("multi", d("u", "a")))
	}
	e.clk.Advance(10 * time.Minute)
	over := e.ask(t, reqOf("multi", d("u", "a")))
	cl = over.Statuses[0].CurrentLimit
	if over.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || cl.GetName() != "slow" || cl.GetRequestsPerUnit() != 5 || cl.GetUnit() != rlsv3.RateLimitResponse_RateLimit_HOUR {
		t.Fatalf("denied by the hourly rule: %v", over)
	}
	if got := header(over, "Retry-After"); got != "3000" {
		t.Fatalf("Retry-After %q, want 3000 (the hour's window ends 50 minutes on)", got)
	}
	if got := header(over, "RateLimit"); !strings.HasPrefix(got, `"slow";r=0;t=3000`) {
		t.Fatalf("RateLimit %q", got)
	}
}

// An override on a descriptor with several rules replaces the rule of its
// period (or the first) and keeps the others.
func TestOverrideKeepsTheOtherRules(t *testing.T) {
	cache := overrideCache(t)
	e := newEnv(t, service.Options{Overrides: cache}, severalRules)
	key := func(v string) string {
		return e.svc.Rules().Match("multi", []rules.Entry{{Key: "u", Value: v}}).Key
	}
	ctx := context.Background()
	// 50 per second in place of 100: the 5 per hour still stops the sixth
	if err := cache.Put(ctx, overrides.Override{Domain: "multi", Key: key("vip"), Limit: 50, Period: time.Second}); err != nil {
		t.Fatal(err)
	}
	// 1000 per hour in place of 5: the hourly rule is the one replaced
	if err := cache.Put(ctx, overrides.Override{Domain: "multi", Key: key("bulk"), Limit: 1000, Period: time.Hour}); err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		r := e.ask(t, reqOf("multi", d("u", "vip")))
		if want := i < 5; (r.OverallCode == rlsv3.RateLimitResponse_OK) != want {
			t.Fatalf("vip request %d: %v", i, r)
		}
		if i == 5 && r.Statuses[0].CurrentLimit.GetName() != "slow" {
			t.Fatalf("vip denied by %q, want the hourly rule", r.Statuses[0].CurrentLimit.GetName())
		}
	}
	for i := range 20 {
		if r := e.ask(t, reqOf("multi", d("u", "bulk"))); r.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("bulk request %d under 1000 per hour: %v", i, r)
		}
	}
}

// quota_mode admits a request over its limit, reports the descriptor OK,
// and says so in the response's dynamic metadata, as envoyproxy/ratelimit
// names it; a limit's metadata comes back there too.
func TestQuotaModeAndMetadata(t *testing.T) {
	metrics := service.NewMetrics()
	e := newEnv(t, service.Options{Metrics: metrics}, `domain: q
descriptors:
  - key: quota
    quota_mode: true
    rate_limit:
      unit: hour
      requests_per_unit: 1
  - key: tagged
    metadata:
      team: payments
      tier: 2
    rate_limit:
      unit: hour
      requests_per_unit: 10
  - key: plain
    rate_limit:
      unit: hour
      requests_per_unit: 10
`)
	if r := e.ask(t, reqOf("q", d("plain", "x"))); r.DynamicMetadata != nil {
		t.Fatalf("metadata without quota_mode or metadata: %v", r.DynamicMetadata)
	}
	first := e.ask(t, reqOf("q", d("quota", "x")))
	if m := first.DynamicMetadata.AsMap(); m["quotaModeEnabled"] != true || m["quotaModeViolations"] != nil {
		t.Fatalf("within the quota: %v", m)
	}
	r := e.ask(t, reqOf("q", d("tagged", "x"), d("quota", "x")))
	if r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[1].Code != rlsv3.RateLimitResponse_OK || r.Statuses[1].LimitRemaining != 0 {
		t.Fatalf("over the quota in quota mode must be admitted: %v", r)
	}
	m := r.DynamicMetadata.AsMap()
	got, _ := json.Marshal(m)
	want := `{"metadata":[{"team":"payments","tier":2},null],"quotaModeEnabled":true,"quotaModeViolations":[1]}`
	if string(got) != want {
		t.Fatalf("dynamic metadata\n got %s\nwant %s", got, want)
	}
	if header(r, "Retry-After") != "" {
		t.Fatalf("Retry-After on an admitted request: %v", r.ResponseHeadersToAdd)
	}
	if n := decisions(t, metrics, "quota_over_limit"); n != 1 {
		t.Fatalf("quota_over_limit decisions %v, want 1", n)
	}
}

// decisions sums floodgate_decisions_total{outcome=outcome}.
func decisions(t *testing.T, m *service.Metrics, outcome string) float64 {
	t.Helper()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != "floodgate_decisions_total" {
			continue
		}
		for _, mm := range mf.GetMetric() {
			for _, lp := range mm.GetLabel() {
				if lp.GetName() == "outcome" && lp.GetValue() == outcome {
					sum += mm.GetCounter().GetValue()
				}
			}
		}
	}
	return sum
}

// Under all_or_nothing a blocked descriptor (requests_per_unit: 0) denies
// the request, and what the others took is given back.
func TestAllOrNothingWithABlockedDescriptor(t *testing.T) {
	e := newEnv(t, service.Options{}, `domain: aonb
all_or_nothing: true
descriptors:
  - key: blocked
    rate_limit:
      unit: second
      requests_per_unit: 0
  - key: n
    rate_limit:
      unit: hour
      requests_per_unit: 3
`)
	for range 3 {
		if r := e.ask(t, reqOf("aonb", d("blocked", "x"), d("n", "a"))); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("a blocked descriptor must deny: %v", r)
		}
	}
	peek := d("n", "a")
	peek.HitsAddend = wrapperspb.UInt64(0)
	if r := e.ask(t, reqOf("aonb", peek)); r.Statuses[0].LimitRemaining != 3 {
		t.Fatalf("n=a remaining %d after three denied requests, want 3", r.Statuses[0].LimitRemaining)
	}
}

// The admin API's inspect and reset work on the state that decides: the
// key's override's when it has one.
func TestAdminKeysFollowOverrides(t *testing.T) {
	cache := overrideCache(t)
	e := newEnv(t, service.Options{Overrides: cache}, testRules)
	k := e.svc.Rules().Match("t", []rules.Entry{{Key: "user", Value: "k1"}}).Key
	if err := cache.Put(context.Background(), overrides.Override{Domain: "t", Key: k, Limit: 1, Period: time.Minute}); err != nil {
		t.Fatal(err)
	}
	req := reqOf("t", d("user", "k1"))
	e.ask(t, req)
	if r := e.ask(t, req); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("second request under a 1/minute override: %v", r)
	}
	srv := httptest.NewServer(e.svc.AdminHandler(""))
	t.Cleanup(srv.Close)
	admin := func(path string) map[string]any {
		t.Helper()
		resp, err := http.Post(srv.URL+path, "application/json", strings.NewReader(`{"domain":"t","entries":[{"key":"user","value":"k1"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s: %d %v", path, resp.StatusCode, err)
		}
		return out
	}
	if got := admin("/v1/keys/inspect"); got["override"] != true || got["remaining"] != 0.0 {
		t.Fatalf("inspect: %v, want the override's state (none left)", got)
	}
	admin("/v1/keys/reset")
	if r := e.ask(t, req); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("after a reset: %v", r)
	}
}

// gatedOverrides is an override store whose Get waits until want lookups
// are in flight together (or the caller gives up), and records the most
// seen at once.
type gatedOverrides struct {
	overrides.Store
	want    int
	mu      sync.Mutex
	cur     int
	most    int
	arrived chan struct{} // closed when want are in flight
}

func (g *gatedOverrides) Get(ctx context.Context, domain, key string) (overrides.Override, bool, error) {
	g.mu.Lock()
	g.cur++
	g.most = max(g.most, g.cur)
	if g.cur == g.want {
		close(g.arrived)
	}
	g.mu.Unlock()
	defer func() { g.mu.Lock(); g.cur--; g.mu.Unlock() }()
	select {
	case <-g.arrived:
		return g.Store.Get(ctx, domain, key)
	case <-ctx.Done():
		return overrides.Override{}, false, ctx.Err()
	}
}

// The override lookups of a request's descriptors run together: a request
// waits for one lookup's latency, not one per descriptor.
func TestOverrideLookupsRunTogether(t *testing.T) {
	b, err := overrides.OpenBolt(t.TempDir() + "/o.db")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	g := &gatedOverrides{Store: b, want: 3, arrived: make(chan struct{})}
	e := newEnv(t, service.Options{Overrides: g, OverrideTimeout: 5 * time.Second}, testRules)
	r := e.ask(t, reqOf("t", d("user", "1"), d("user", "2"), d("user", "3")))
	if r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatal(r)
	}
	if g.most != 3 {
		t.Fatalf("at most %d lookups in flight at once, want all 3", g.most)
	}
}

// A calendar rule deciding among several has no Envoy unit (the headers
// carry its window), as a calendar limit of its own has none.
func TestSeveralRulesCalendarHasNoUnit(t *testing.T) {
	e := newEnv(t, service.Options{}, `domain: cal
descriptors:
  - key: u
    rate_limits:
      - name: burst
        unit: second
        requests_per_unit: 100
      - name: daily
        calendar: day
        time_zone: Europe/Paris
        requests_per_unit: 2
`)
	r := e.ask(t, reqOf("cal", d("u", "a")))
	cl := r.Statuses[0].CurrentLimit
	if cl.GetName() != "daily" || cl.GetRequestsPerUnit() != 2 || cl.GetUnit() != rlsv3.RateLimitResponse_RateLimit_UNKNOWN || cl.UnitMultiplier != nil {
		t.Fatalf("deciding calendar rule: %v", cl)
	}
	if got := header(r, "RateLimit-Policy"); !strings.Contains(got, `"daily";q=2;w=86400`) {
		t.Fatalf("RateLimit-Policy %q", got)
	}
}

// The admin API acts on the keys decisions use, also for a value whose
// store key is over MaxKeyBytes (stored bounded); refuses an override that
// could never apply to its key's limit, or that has an unknown field or
// trailing data; lists no overrides as []; takes the bearer scheme in any
// case.
func TestAdminOverridesAndLongKeys(t *testing.T) {
	cache := overrideCache(t)
	e := newEnv(t, service.Options{Overrides: cache}, testRules)
	srv := httptest.NewServer(e.svc.AdminHandler("s3cret"))
	t.Cleanup(srv.Close)
	call := func(method, path, body, auth string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		req.Header.Set("Authorization", auth)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	const auth = "bearer s3cret"
	if code, body := call("GET", "/v1/overrides/t", "", auth); code != 200 || strings.TrimSpace(body) != "[]" {
		t.Fatalf("empty list: %d %s", code, body)
	}
	for _, q := range []string{"abc", "-1", "0", "1001"} {
		if code, _ := call("GET", "/v1/overrides/t?limit="+q, "", auth); code != 400 {
			t.Errorf("list with limit=%s: %d, want 400", q, code)
		}
	}
	if code, _ := call("GET", "/v1/overrides/t", "", "Bearer wrong"); code != 401 {
		t.Fatalf("a wrong token: %d", code)
	}
	for _, body := range []string{
		`{"limit":1,"period":"1m","burst":3}`,  // a burst on a fixed window
		`{"limit":1,"period":"1m","brust":3}`,  // unknown field
		`{"limit":5,"period":"1s"} trailing`,   // trailing data
		`{"limit":5,"period":"1s"}{"limit":6}`, // two objects
	} {
		if code, out := call("PUT", "/v1/overrides/t/user=u1", body, auth); code != 400 {
			t.Errorf("PUT %s: %d %s, want 400", body, code, out)
		}
	}

	long := strings.Repeat("z", 2000)
	req := reqOf("t", d("user", long))
	for range 3 {
		e.ask(t, req)
	}
	inspect := func() map[string]any {
		t.Helper()
		code, body := call("POST", "/v1/keys/inspect", `{"domain":"t","entries":[{"key":"user","value":"`+long+`"}]}`, auth)
		var out map[string]any
		if err := json.Unmarshal([]byte(body), &out); err != nil || code != 200 {
			t.Fatalf("inspect: %d %s", code, body)
		}
		return out
	}
	if got := inspect(); got["remaining"] != 2.0 {
		t.Fatalf("inspect after 3 of 5: %v", got)
	}
	if code, body := call("POST", "/v1/keys/reset", `{"domain":"t","entries":[{"key":"user","value":"`+long+`"}]}`, auth); code != 200 {
		t.Fatalf("reset: %d %s", code, body)
	}
	if r := e.ask(t, req); r.Statuses[0].LimitRemaining != 4 {
		t.Fatalf("after a reset: %v", r)
	}
	// An override PUT under the full key applies to the decisions.
	if code, body := call("PUT", "/v1/overrides/t/user="+long, `{"limit":100,"period":"1m"}`, auth); code != 200 {
		t.Fatalf("PUT a long key: %d %s", code, body)
	}
	if r := e.ask(t, req); r.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 100 {
		t.Fatalf("the override on a long key does not apply: %v", r)
	}
	if code, _ := call("GET", "/v1/overrides/t/user="+long, "", auth); code != 200 {
		t.Fatalf("GET a long key: %d", code)
	}
}

// A requests_per_unit 0 descriptor over its limit gets the headers any
// limit does (quota 0, 0 remaining, Retry-After at the window's end), and
// a limit two descriptors share is listed once in RateLimit-Policy.
func TestBlockedHeadersAndPolicyOnce(t *testing.T) {
	e := newEnv(t, service.Options{}, testRules)
	headers := func(r *rlsv3.RateLimitResponse) map[string]string {
		h := map[string]string{}
		for _, v := range r.ResponseHeadersToAdd {
			h[v.Key] = v.Value
		}
		return h
	}
	r := e.ask(t, reqOf("t", d("blocked", "x")))
	h := headers(r)
	if r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || h["RateLimit-Policy"] != `"t.blocked";q=0;w=1` ||
		!strings.HasPrefix(h["RateLimit"], `"t.blocked";r=0;t=`) || h["Retry-After"] != "1" {
		t.Fatalf("blocked: %v %v", r.OverallCode, h)
	}
	h = headers(e.ask(t, reqOf("t", d("user", "a"), d("user", "b"))))
	if h["RateLimit-Policy"] != `"t.user";q=5;w=60` {
		t.Fatalf("two descriptors of one limit: RateLimit-Policy %q", h["RateLimit-Policy"])
	}
}

// The headers speak of enforced limits with the status's own wait; a
// shadow-mode limit, never enforced, shows in none of them.
// duration_until_reset is whole seconds, rounded up, as envoyproxy/ratelimit
// sends it. A bucket with a burst says its capacity and the time to refill
// it, so r never exceeds q; a window that is no whole number of seconds is
// said rounded up.
func TestHeadersMatchWhatIsEnforced(t *testing.T) {
	file := `domain: h
descriptors:
  - key: normal
    rate_limit: {unit: minute, requests_per_unit: 100, name: normal}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1, name: shadow}
  - key: three
    rate_limit: {unit: minute, requests_per_unit: 3, name: three}
  - key: tb
    rate_limit: {unit: second, requests_per_unit: 2, algorithm: token_bucket, burst: 4, name: tb}
  - key: odd
    rate_limit: {window: 1500ms, requests_per_unit: 2, name: odd}
`
	e := newEnv(t, service.Options{}, file)
	e.clk.Set(time.Date(2026, 1, 1, 0, 0, 20, 300_000_000, time.UTC)) // 39.7 s left in the minute
	hdrs := func(r *rlsv3.RateLimitResponse) map[string]string {
		h := map[string]string{}
		for _, v := range r.ResponseHeadersToAdd {
			h[v.Key] = v.Value
		}
		return h
	}
	var r *rlsv3.RateLimitResponse
	for range 3 {
		r = e.ask(t, reqOf("h", d("normal", "n"), d("shadow", "s")))
	}
	h := hdrs(r)
	if r.OverallCode != rlsv3.RateLimitResponse_OK || h["RateLimit-Policy"] != `"normal";q=100;w=60` || h["RateLimit"] != `"normal";r=97;t=40` {
		t.Errorf("with a shadow limit over: %v %v", r.OverallCode, h)
	}
	if got := r.Statuses[0].DurationUntilReset.AsDuration(); got != 40*time.Second {
		t.Errorf("duration_until_reset %v, want 40s (39.7 s rounded up)", got)
	}

	// hits beyond the whole limit: the headers say the window's end, as the status does
	big := d("three", "x")
	big.HitsAddend = wrapperspb.UInt64(5)
	r = e.ask(t, reqOf("h", big))
	h = hdrs(r)
	if r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || h["RateLimit"] != `"three";r=3;t=40` || h["Retry-After"] != "40" ||
		r.Statuses[0].DurationUntilReset.AsDuration() != 40*time.Second {
		t.Errorf("hits over the whole limit: %v %v", h, r.Statuses[0].DurationUntilReset)
	}

	r = e.ask(t, reqOf("h", d("tb", "x")))
	if h = hdrs(r); h["RateLimit-Policy"] != `"tb";q=4;w=2` || h["RateLimit"] != `"tb";r=3;t=1` {
		t.Errorf("a bucket with a burst: %v", h)
	}
	if h = hdrs(e.ask(t, reqOf("h", d("odd", "x")))); h["RateLimit-Policy"] != `"odd";q=2;w=2` {
		t.Errorf("a 1.5 s window: %v", h)
	}

	quiet := newEnv(t, service.Options{NoRateLimitHeaders: true}, file)
	if r := quiet.ask(t, reqOf("h", d("three", "x"))); len(r.ResponseHeadersToAdd) != 0 {
		t.Errorf("NoRateLimitHeaders: %v", r.ResponseHeadersToAdd)
	}
}

// An override set, changed or removed through the admin API keeps what the
// key has used, on the memory store and on Redis: a key with 2 of 10 used
// has 3 of 5 left under an override of 5, and raising it to 20 after 4
// leaves 16, not a fresh 20.
func TestOverrideChangesKeepTheCount(t *testing.T) {
	const carryRules = `domain: carry
descriptors:
  - key: user
    rate_limit:
      unit: hour
      requests_per_unit: 10
`
	for name, newStore := range bothStores {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, service.Options{Store: newStore(t), Overrides: overrideCache(t)}, carryRules)
			srv := httptest.NewServer(e.svc.AdminHandler(""))
			t.Cleanup(srv.Close)
			key := e.svc.Rules().Match("carry", []rules.Entry{{Key: "user", Value: "u"}}).Key
			send := func(method, body string, want int) {
				t.Helper()
				req, _ := http.NewRequest(method, srv.URL+"/v1/overrides/carry/"+key, strings.NewReader(body))
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != want {
					t.Fatalf("%s override: %d, want %d", method, resp.StatusCode, want)
				}
			}
			req := reqOf("carry", d("user", "u"))
			left := func(want uint32, what string) {
				t.Helper()
				peek := d("user", "u")
				peek.HitsAddend = wrapperspb.UInt64(0)
				if got := e.ask(t, reqOf("carry", peek)).Statuses[0].LimitRemaining; got != want {
					t.Fatalf("%s: %d left, want %d", what, got, want)
				}
			}
			e.ask(t, req)
			e.ask(t, req)
			left(8, "two of the rule's 10")
			send("PUT", `{"limit":5,"period":"1h"}`, 200)
			left(3, "under an override of 5")
			e.ask(t, req)
			e.ask(t, req)
			left(1, "two more")
			send("PUT", `{"limit":20,"period":"1h"}`, 200)
			left(16, "the override raised to 20")
			send("DELETE", "", 204)
			left(6, "back to the rule's 10")
		})
	}
}

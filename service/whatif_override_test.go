package service_test

import (
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/floodgate/floodgate/overrides"
	"github.com/floodgate/floodgate/service"
)

// whatIfOverrideJSON is the part of a what-if's answer about overrides.
type whatIfOverrideJSON struct {
	OverridesApplied bool     `json:"overrides_applied"`
	LookupFailures   int      `json:"override_lookup_failures"`
	Notes            []string `json:"notes"`
	Candidate        struct {
		UnderOverride int `json:"requests_under_override"`
		Rules         []struct {
			Name       string `json:"name"`
			Overridden int64  `json:"overridden"`
		} `json:"rules"`
	} `json:"candidate"`
	Current struct {
		UnderOverride int `json:"requests_under_override"`
	} `json:"current"`
}

// A what-if decides each recorded request under the override live for
// its key, as serve does: over a recorded flood where "vip" has an
// override lifting its limit to 50 a minute and "bad" one holding it to 1
// an hour, both replays' counts equal a replay by hand that applies the
// same numbers to those keys, and differ from one that does not; the
// answer says overrides were applied and how many requests they decided.
// A what-if never writes an override, nor reads one it has no use for.
func TestWhatIfAppliesOverrides(t *testing.T) {
	const token = "whatif-test-token-0123456789abcdef"
	cache := overrideCache(t)
	e := newEnv(t, service.Options{Record: service.RecordOptions{Window: 5 * time.Minute}, Overrides: cache}, whatIfLive)
	ctx := context.Background()
	for _, o := range []overrides.Override{
		{Domain: "wi", Key: "user=vip", Limit: 50, Period: time.Minute},
		{Domain: "wi", Key: "user=bad", Limit: 1, Period: time.Hour},
		{Domain: "other", Key: "user=u0", Limit: 1, Period: time.Hour}, // another domain's: not this what-if's
	} {
		if err := cache.Put(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	client := rlsv3.NewRateLimitServiceClient(dialGRPC(t, e.serveGRPC(t)))
	admin := httptest.NewServer(e.svc.AdminHandler(token))
	t.Cleanup(admin.Close)

	// a flood: vip and bad send most requests
	rng := rand.New(rand.NewPCG(22, 11))
	values := []string{"u0", "u1", "vip", "vip", "vip", "bad", "bad"}
	var sent []sentReq
	start := e.clk.Now()
	for e.clk.Now().Sub(start) < 4*time.Minute {
		e.clk.Advance(time.Duration(rng.IntN(600)+100) * time.Millisecond)
		v := values[rng.IntN(len(values))]
		req := &rlsv3.RateLimitRequest{Domain: "wi", Descriptors: []*rlcommon.RateLimitDescriptor{d("user", v)}}
		if _, err := client.ShouldRateLimit(ctx, req); err != nil {
			t.Fatal(err)
		}
		sent = append(sent, sentReq{e.clk.Now(), v, 1})
	}
	// the numbers each key is decided by, with its override or without
	window := func(v string) time.Duration {
		if v == "bad" {
			return time.Hour
		}
		return time.Minute
	}
	limits := func(rule int64) func(string) (string, int64, bool) {
		return func(v string) (string, int64, bool) {
			switch v {
			case "vip":
				return "wi.user", 50, false
			case "bad":
				return "wi.user", 1, false
			}
			return "wi.user", rule, false
		}
	}
	const cand = `domain: wi
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 4}
`
	candM, curM := newFixedModel(limits(4)), newFixedModel(limits(10))
	candM.window, curM.window = window, window
	plainM := newFixedModel(func(string) (string, int64, bool) { return "wi.user", 4, false })
	under := 0
	for _, r := range sent {
		candM.add(r.at, r.value, r.hits)
		curM.add(r.at, r.value, r.hits)
		plainM.add(r.at, r.value, r.hits)
		if r.value == "vip" || r.value == "bad" {
			under++
		}
	}
	if plainM.refReq == candM.refReq || *plainM.rules["wi.user"] == *candM.rules["wi.user"] {
		t.Fatalf("the traffic does not tell the overrides apart: %+v vs %+v", *plainM.rules["wi.user"], *candM.rules["wi.user"])
	}

	code, body := postWhatIf(t, admin.URL, token, "", cand)
	if code != 200 {
		t.Fatalf("what-if: %d %s", code, body)
	}
	var got whatIfJSON
	var ovr whatIfOverrideJSON
	if err := json.Unmarshal([]byte(body), &got); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(body), &ovr); err != nil {
		t.Fatal(err)
	}
	if got.Window.Requests != len(sent) || !got.Window.Complete {
		t.Fatalf("window: %+v, want %d requests", got.Window, len(sent))
	}
	for _, c := range []struct {
		what string
		run  whatIfRunJSON
		m    *fixedModel
	}{{"candidate", got.Candidate, candM}, {"current", got.Current, curM}} {
		if len(c.run.Rules) != 1 {
			t.Fatalf("%s: rules %+v", c.what, c.run.Rules)
		}
		r := c.run.Rules[0]
		if gotC := (whatIfCounts{r.Matched, r.Allowed, r.Refused, r.ShadowRefused}); gotC != *c.m.rules["wi.user"] {
			t.Errorf("%s: %+v, want (by hand, with the overrides) %+v", c.what, gotC, *c.m.rules["wi.user"])
		}
		if c.run.RequestsRefused != c.m.refReq {
			t.Errorf("%s: %d requests refused, want %d", c.what, c.run.RequestsRefused, c.m.refReq)
		}
	}
	if !ovr.OverridesApplied || ovr.LookupFailures != 0 {
		t.Errorf("overrides_applied %v, lookup failures %d", ovr.OverridesApplied, ovr.LookupFailures)
	}
	if ovr.Candidate.UnderOverride != under || ovr.Current.UnderOverride != under || ovr.Candidate.Rules[0].Overridden != int64(under) {
		t.Errorf("under override: candidate %d (rule %d), current %d, want %d", ovr.Candidate.UnderOverride, ovr.Candidate.Rules[0].Overridden, ovr.Current.UnderOverride, under)
	}
	if !strings.Contains(strings.Join(ovr.Notes, "\n"), "overrides applied") {
		t.Errorf("notes %q do not say the overrides were applied", ovr.Notes)
	}
	// nothing written: the overrides are as they were
	list, err := cache.List(ctx, "wi", "", 100)
	if err != nil || len(list) != 2 {
		t.Fatalf("overrides after the what-if: %v %v", list, err)
	}
}

// Without an overrides store a what-if says it applied none.
func TestWhatIfWithoutOverridesSaysSo(t *testing.T) {
	const token = "whatif-test-token-0123456789abcdef"
	e := newEnv(t, service.Options{Record: service.RecordOptions{Window: 5 * time.Minute}}, whatIfLive)
	if _, err := e.svc.Decide(context.Background(), reqOf("wi", d("user", "u0"))); err != nil {
		t.Fatal(err)
	}
	admin := httptest.NewServer(e.svc.AdminHandler(token))
	t.Cleanup(admin.Close)
	code, body := postWhatIf(t, admin.URL, token, "", whatIfLive)
	var ovr whatIfOverrideJSON
	if err := json.Unmarshal([]byte(body), &ovr); code != 200 || err != nil {
		t.Fatalf("what-if: %d %s %v", code, body, err)
	}
	if ovr.OverridesApplied || ovr.Candidate.UnderOverride != 0 {
		t.Errorf("no overrides store, yet %s", body)
	}
}

// failingGets is an overrides store whose Get fails for one key, and
// which counts the Gets of each key.
type failingGets struct {
	overrides.Store
	fail string
	mu   sync.Mutex
	gets map[string]int
}

func (f *failingGets) Get(ctx context.Context, domain, key string) (overrides.Override, bool, error) {
	f.mu.Lock()
	f.gets[key]++
	f.mu.Unlock()
	if key == f.fail {
		return overrides.Override{}, false, errors.New("the overrides store is down")
	}
	return f.Store.Get(ctx, domain, key)
}

// A what-if asks the overrides store once a distinct key for both
// replays, never once a request; a key whose lookup fails is decided by
// its rules (as serve would), and the answer counts it and says so.
func TestWhatIfOverrideLookupsOnceAKey(t *testing.T) {
	const token = "whatif-test-token-0123456789abcdef"
	cache := overrideCache(t)
	ctx := context.Background()
	for _, o := range []overrides.Override{
		{Domain: "wi", Key: "user=vip", Limit: 50, Period: time.Minute},
		{Domain: "wi", Key: "user=bad", Limit: 1, Period: time.Hour},
	} {
		if err := cache.Put(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	st := &failingGets{Store: cache, fail: "user=bad", gets: map[string]int{}}
	rec := newEnv(t, service.Options{Record: service.RecordOptions{Window: 5 * time.Minute}, Overrides: st}, whatIfLive)
	vip := 0
	for i := range 60 {
		rec.clk.Advance(200 * time.Millisecond)
		v := []string{"vip", "bad", "u0"}[i%3]
		if _, err := rec.svc.Decide(ctx, reqOf("wi", d("user", v))); err != nil {
			t.Fatal(err)
		}
		if v == "vip" {
			vip++
		}
	}
	st.mu.Lock()
	clear(st.gets) // the live decisions' lookups
	st.mu.Unlock()
	admin := httptest.NewServer(rec.svc.AdminHandler(token))
	t.Cleanup(admin.Close)
	code, body := postWhatIf(t, admin.URL, token, "", whatIfLive)
	var ovr whatIfOverrideJSON
	if err := json.Unmarshal([]byte(body), &ovr); code != 200 || err != nil {
		t.Fatalf("what-if: %d %s %v", code, body, err)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	for k, n := range st.gets {
		if n != 1 {
			t.Errorf("the what-if asked for %q's override %d times, want once", k, n)
		}
	}
	if len(st.gets) != 3 {
		t.Errorf("keys asked for: %v, want user=vip, user=bad, user=u0", st.gets)
	}
	if ovr.LookupFailures != 1 || !strings.Contains(strings.Join(ovr.Notes, "\n"), "could not be read") {
		t.Errorf("lookup failures %d, notes %q: want 1, said", ovr.LookupFailures, ovr.Notes)
	}
	// bad's lookup failed: its rules decided it
	if ovr.Candidate.UnderOverride != vip || ovr.Current.UnderOverride != vip {
		t.Errorf("under override: %d and %d, want %d (vip alone; bad's lookup failed)", ovr.Candidate.UnderOverride, ovr.Current.UnderOverride, vip)
	}
}

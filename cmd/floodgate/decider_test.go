package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/floodgate/floodgate/internal/redistest"
)

// parityRules is the rules file every front door's parity test uses.
var parityRules = func() string {
	b, err := os.ReadFile("../../internal/decide/testdata/parity.yaml")
	if err != nil {
		panic(err)
	}
	return string(b)
}()

// serveAndProxy starts floodgate serve and floodgate proxy on one Redis,
// with parityRules.
func serveAndProxy(t *testing.T) (s, p *server) {
	t.Helper()
	redistest.Require(t)
	srv := redistest.Standalone(t)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(up.Close)
	dir := t.TempDir()
	writeRules(t, dir, "edge.yaml", parityRules)
	// the store's timeout is not the subject: generous, or a starved host
	// times calls out and the rules' failure mode (open) admits them
	s = startServer(t, "--rules", dir, "--data", t.TempDir(), "--store", "redis://"+srv.Addr, "--store-timeout", "10s")
	p = startProxy(t, up.URL, dir, "--store", "redis://"+srv.Addr, "--store-timeout", "10s")
	return s, p
}

// serve and proxy on one Redis count a rules-file limit's value under one
// key, whatever its length: requests through either door spend one quota
// of 3. (The proxy bounded each value past 239 bytes and serve the whole
// key past 959, so values of 300 and 5,000 bytes had two counters.)
func TestServeAndProxyShareCounters(t *testing.T) {
	s, p := serveAndProxy(t)
	base := "http://" + p.addrs["proxy"]
	for _, n := range []int{10, 300, 5000} {
		v := fmt.Sprintf("%d-", n)
		v += strings.Repeat("v", n-len(v))
		steps := []struct {
			proxy bool
			ok    bool
		}{{true, true}, {false, true}, {true, true}, {false, false}, {true, false}}
		for i, st := range steps {
			var ok bool
			if st.proxy {
				code, _, _ := proxyGet(t, base+"/keyed/", "X-API-Key", v)
				ok = code == 200
			} else {
				ok = s.ask(t, "edge", desc("api_key", v)).OverallCode == rlsv3.RateLimitResponse_OK
			}
			if ok != st.ok {
				t.Fatalf("value of %d bytes, request %d (proxy %v): admitted %v, want %v", n, i+1, st.proxy, ok, st.ok)
			}
		}
	}
}

// quota_mode, replaces and overrides give the proxy serve's answers for
// one rules file (the proxy ignored all three).
func TestProxyAnswersAsServe(t *testing.T) {
	s, p := serveAndProxy(t)
	base := "http://" + p.addrs["proxy"]
	viaServe := func(ds ...*rlcommon.RateLimitDescriptor) bool {
		return s.ask(t, "edge", ds...).OverallCode == rlsv3.RateLimitResponse_OK
	}
	viaProxy := func(path string, hdr ...string) bool {
		code, _, _ := proxyGet(t, base+path, hdr...)
		return code == 200
	}
	check := func(what string, want []bool, ask func() bool) {
		t.Helper()
		for i, w := range want {
			if got := ask(); got != w {
				t.Fatalf("%s, request %d: admitted %v, want %v", what, i+1, got, w)
			}
		}
	}

	// quota_mode: over its quota of 1, still admitted
	check("quota_mode via serve", []bool{true, true, true}, func() bool { return viaServe(desc("quota", "alice")) })
	check("quota_mode via proxy", []bool{true, true, true}, func() bool { return viaProxy("/quota/", "X-User", "bob") })

	// replaces: vip's 3 replace per-user's 1
	check("replaces via serve", []bool{true, true, true, false}, func() bool { return viaServe(desc("user", "carol"), desc("vip", "carol")) })
	check("replaces via proxy", []bool{true, true, true, false}, func() bool { return viaProxy("/vip/", "X-User", "dave") })

	// an override set through serve's admin API (on Redis, where both
	// keep them) gives a key 5 in place of 3, through either door
	for _, key := range []string{"erin", "frank"} {
		req, _ := http.NewRequest("PUT", "http://"+s.addrs["admin"]+"/v1/overrides/edge/api_key="+key, strings.NewReader(`{"limit": 5, "period": "1h"}`))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			t.Fatalf("PUT override: %s", resp.Status)
		}
		// the proxy's own admin API inspects through its overrides
		// cache, which its gate shares: once it sees the override, so
		// does the gate
		waitFor(t, "the proxy sees the override of "+key, func() bool {
			resp, err := http.Post("http://"+p.addrs["admin"]+"/v1/keys/inspect", "application/json",
				strings.NewReader(`{"domain":"edge","entries":[{"key":"api_key","value":"`+key+`"}]}`))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var out struct{ Override bool }
			json.NewDecoder(resp.Body).Decode(&out)
			return out.Override
		})
	}
	check("override via serve", []bool{true, true, true, true, true, false}, func() bool { return viaServe(desc("api_key", "erin")) })
	check("override via proxy", []bool{true, true, true, true, true, false}, func() bool { return viaProxy("/keyed/", "X-API-Key", "frank") })
}

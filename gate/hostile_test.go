package gate

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
)

// A route on an IPv6 host, written as rules files want it ("[::1]", in
// brackets: rules.normHost), applies to requests for that host, in any
// spelling of the address and with any port, through the route index
// too. An audit found such a route never applied: the request's host
// lost its brackets (hostOnly) while the route's kept them, so a client
// of http://[::1]:8000/ passed a limit of 2 as often as it liked.
func TestHostileIPv6HostRouteApplies(t *testing.T) {
	for _, fillers := range []int{0, indexMin} { // tried one by one, and through the index
		yaml := "domain: d\nhttp:\n  - name: v6\n    match: {host: \"[2001:db8::1]\"}\n    key: [remote_address]\n    rate_limit: {unit: minute, requests_per_unit: 2}\n"
		for i := range fillers {
			yaml += fmt.Sprintf("  - name: f%d\n    match: {host: f%d.example, path_prefix: /f/}\n    key: [remote_address]\n    rate_limit: {unit: minute, requests_per_unit: 2}\n", i, i)
		}
		cfg := configOf(t, "v6.yaml", yaml)
		limits, err := FromRules(cfg)
		if err != nil {
			t.Fatal(err)
		}
		g, _ := memGate(t, Config{Limits: limits, Rules: cfg})
		for _, host := range []string{"[2001:db8::1]", "[2001:db8::1]:8080", "[2001:DB8:0:0::1]:80", "[2001:0db8::0001]"} {
			r := httpReq("192.0.2.1:1", "/")
			r.HTTP.Host = host
			if v := check(g, r); len(v.Outcomes) != 1 {
				t.Errorf("%d fillers: Host %s: %d limits applied, want the v6 route", fillers, host, len(v.Outcomes))
			}
			raw := &Request{Peer: "192.0.2.2:1", Raw: &RawHTTP{Method: "GET", Host: host, Path: "/", Header: func(string) []string { return nil }}}
			if v := check(g, raw); len(v.Outcomes) != 1 {
				t.Errorf("%d fillers: raw Host %s: %d limits applied, want the v6 route", fillers, host, len(v.Outcomes))
			}
		}
		r := httpReq("192.0.2.3:1", "/")
		r.HTTP.Host = "[2001:db8::2]"
		if v := check(g, r); len(v.Outcomes) != 0 {
			t.Errorf("%d fillers: another address matched the v6 route", fillers)
		}
	}
	// The Host part keys every spelling alike.
	p := floodgate.MustPolicy("h", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 100, Period: time.Minute})
	g, _ := memGate(t, Config{Limits: []Limit{{Name: "h", Policy: p, Key: []Part{Host()}}}})
	for _, host := range []string{"[2001:db8::1]", "[2001:DB8:0::1]:443"} {
		r := httpReq("192.0.2.1:1", "/")
		r.HTTP.Host = host
		if v := check(g, r); v.Outcomes[0].Key != "2001:db8::1" {
			t.Errorf("Host %s: key %q, want 2001:db8::1", host, v.Outcomes[0].Key)
		}
	}
}

// Route falls back, without a pattern (the middleware wrapping a router,
// which sets the pattern only once it routes), to the path as Path gives
// it: cleaned. An audit found the fallback took the path raw, so that a
// client made "/login", "//login", "/./login" and "/x/../login" four
// routes of a limit keyed by route and address, four quotas for one
// endpoint of a server that cleans paths.
func TestHostileRouteFallbackIsCleaned(t *testing.T) {
	p := floodgate.MustPolicy("r", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 2, Period: time.Minute})
	g, _ := memGate(t, Config{Limits: []Limit{{Name: "r", Policy: p, Key: []Part{Route(), IP()}}}})
	allowed := 0
	for _, path := range []string{"/login", "//login", "/./login", "/x/../login", "/login/../login"} {
		r := httptest.NewRequest(http.MethodPost, "http://example.com/", nil)
		r.URL.Path = path
		v := check(g, &Request{HTTP: r, Peer: "192.0.2.1:1"})
		if v.Outcomes[0].Key != "/login|192.0.2.1" {
			t.Errorf("path %q: key %q, want /login|192.0.2.1", path, v.Outcomes[0].Key)
		}
		if v.Allowed {
			allowed++
		}
	}
	if allowed != 2 {
		t.Errorf("%d of 5 spellings of /login allowed, want 2", allowed)
	}
}

package rules

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
)

// httpTree is a file's first 10 lines: descriptors for routes to rely on,
// and the http key; routes start at line 11.
const httpTree = `domain: t
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: path
    descriptors:
      - key: remote_address
        rate_limit: {unit: minute, requests_per_unit: 5}
  - {key: user, exempt: true}
http:
`

// httpErrorTests are broken http sections and their errors: each line of
// the error must start with the want at its index. The fuzz test seeds its
// corpus with them too.
var httpErrorTests = []struct {
	name string
	src  string
	want []string
}{
	{"not a list", "domain: t\nhttp: {a: 1}\n", []string{`bad.yaml:2: http: want a list, got a mapping`}},
	{"root field", "domain: t\nhtp: []\n", []string{`bad.yaml:2: htp: unknown field "htp" (did you mean "http"?)`}},
	{"http in a descriptor", "domain: t\ndescriptors:\n  - key: k\n    http: []\n", []string{
		`bad.yaml:4: descriptors[0].http: unknown field "http" here (it is a top-level field)`}},
	{"not a route", httpTree + "  - per-ip\n", []string{`bad.yaml:11: http[0]: want a route (a mapping with a key), got "per-ip"`}},
	{"unknown fields", httpTree + `  - key: [remote_address]
    acton: deny
    path_prefix: /x
    threshold: 1
    shadow_mode: true
    unit: second
    descriptors: []
    action: deny
    action: ban
    method: GET
`, []string{
		`bad.yaml:12: http[0].acton: unknown field "acton" (did you mean "action"?)`,
		`bad.yaml:13: http[0].path_prefix: unknown field "path_prefix" here (it belongs in match)`,
		`bad.yaml:14: http[0].threshold: unknown field "threshold" here (it belongs in ban)`,
		`bad.yaml:15: http[0].shadow_mode: unknown field "shadow_mode" here (a route says action: shadow)`,
		`bad.yaml:16: http[0].unit: unknown field "unit" here (it belongs in rate_limit)`,
		`bad.yaml:17: http[0].descriptors: unknown field "descriptors" here (it is a descriptor field)`,
		`bad.yaml:19: http[0].action: given twice (first at line 18)`,
		`bad.yaml:20: http[0].method: unknown field "method" here (did you mean match.methods?)`,
	}},
	{"names", httpTree + `  - name: a
    key: [remote_address]
  - name: a
    key: [remote_address]
  - key: [remote_address]
  - name: http[2]
    key: [remote_address]
  - name: ""
    key: [remote_address]
  - name: [x]
    key: [remote_address]
  - name: "a\tb"
    key: [remote_address]
`, []string{
		`bad.yaml:13: http[1].name: route name "a" is already taken by http[0] (line 11)`,
		`bad.yaml:16: http[3].name: route name "http[2]" is already taken by http[2] (line 15)`,
		`bad.yaml:18: http[4].name: must not be empty`,
		`bad.yaml:20: http[5].name: want a string, got a list`,
		`bad.yaml:22: http[6].name: must not hold control characters`,
	}},
	{"match", httpTree + `  - key: [remote_address]
    match: [x]
  - key: [remote_address]
    match:
      methd: GET
      key: x
      host: ""
      path_prefix: api
      path: /a/**/b
`, []string{
		`bad.yaml:12: http[0].match: want a mapping, got a list`,
		`bad.yaml:15: http[1].match.methd: unknown field "methd" (did you mean "methods"?)`,
		`bad.yaml:16: http[1].match.key: unknown field "key" here (it is a route field)`,
		`bad.yaml:17: http[1].match.host: must not be empty`,
		`bad.yaml:18: http[1].match.path_prefix: "api" must start with "/"`,
		`bad.yaml:19: http[1].match.path: "/a/**/b": "**" may only end the pattern`,
	}},
	{"hosts", httpTree + `  - key: [remote_address]
    match:
      host:
        - "*"
        - example.com:8080
        - "2001:db8::1"
        - "a.*.example.com"
        - "exa mple.com"
        - "[::1"
        - Example.COM
        - example.com
        - {a: b}
        - "example.com."
  - key: [remote_address]
    match: {host: []}
`, []string{
		`bad.yaml:14: http[0].match.host[0]: "*" would match every host: leave match.host out instead`,
		`bad.yaml:15: http[0].match.host[1]: "example.com:8080" has a port`,
		`bad.yaml:16: http[0].match.host[2]: write an IPv6 address in brackets: "[2001:db8::1]"`,
		`bad.yaml:17: http[0].match.host[3]: "a.*.example.com": a wildcard host is "*." then a domain`,
		`bad.yaml:18: http[0].match.host[4]: "exa mple.com" is not a host name`,
		`bad.yaml:19: http[0].match.host[5]: "[::1" is not a host: an IPv6 address is written in brackets`,
		`bad.yaml:21: http[0].match.host[7]: "example.com" is listed twice (first as http[0].match.host[6])`,
		`bad.yaml:22: http[0].match.host[8]: want a string, got a mapping`,
		`bad.yaml:23: http[0].match.host[9]: "example.com." is not a host name`,
		`bad.yaml:25: http[1].match.host: an empty list matches nothing: leave match.host out to match every request`,
	}},
	{"paths and methods", httpTree + `  - key: [remote_address]
    match:
      path_prefix: /api/*
      path: /a*b
      methods: [GET, "GE T", get]
  - key: [remote_address]
    match: {path_prefix: "/a?b", path: "a/b", methods: []}
`, []string{
		`bad.yaml:13: http[0].match.path_prefix: a prefix has no wildcards (use path: "/api/*" for a pattern)`,
		`bad.yaml:14: http[0].match.path: "/a*b": "*" stands for a whole segment`,
		`bad.yaml:15: http[0].match.methods[1]: "GE T" is not a method name`,
		`bad.yaml:15: http[0].match.methods[2]: "get" is listed twice (first as http[0].match.methods[0])`,
		`bad.yaml:17: http[1].match.path_prefix: "/a?b" holds '?' or '#': a path_prefix matches the path alone, not the query`,
		`bad.yaml:17: http[1].match.path: "a/b" must start with "/"`,
		`bad.yaml:17: http[1].match.methods: an empty list matches nothing: leave match.methods out to match every request`,
	}},
	{"key", httpTree + `  - match: {path: /x}
  - key: []
  - key: [remote_adress, header, generic, {headr: x}, {path: x}, {header: a, cookie: b}, {}, [x]]
  - key:
      - {header: "X Y"}
      - {cookie: "a;b"}
      - {query: ""}
      - {generic: premium}
      - {generic: gold, entry: tier, missing: ip}
      - {header: X-A, missing: never}
      - {header: X-B, entry: ""}
      - {header: X-User, entry: remote_address}
      - remote_address
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: 7
`, []string{
		`bad.yaml:11: http[0].key: missing: a route needs a key: the descriptor entries its requests are counted by`,
		`bad.yaml:12: http[1].key: an empty list: give at least one entry, such as [remote_address]`,
		`bad.yaml:13: http[2].key[0]: unknown key part "remote_adress" (did you mean "remote_address"?)`,
		`bad.yaml:13: http[2].key[1]: header needs a name: write {header: NAME}`,
		`bad.yaml:13: http[2].key[2]: generic needs a value and an entry: write {generic: VALUE, entry: KEY}`,
		`bad.yaml:13: http[2].key[3].headr: unknown field "headr" (did you mean "header"?)`,
		`bad.yaml:13: http[2].key[4].path: path takes no name: write it as a bare string, path (its entry key is "path")`,
		`bad.yaml:13: http[2].key[5].cookie: a key part is one of header, cookie, query or generic, and header is given too`,
		`bad.yaml:13: http[2].key[6]: missing: a key part names one of header, cookie, query or generic`,
		`bad.yaml:13: http[2].key[7]: want a key part (remote_address, path, method, host, or a mapping such as {header: X-API-Key}), got a list`,
		`bad.yaml:15: http[3].key: 9 entries; a route's key has at most 8`,
		`bad.yaml:15: http[3].key[0].header: "X Y" is not a header name`,
		`bad.yaml:16: http[3].key[1].cookie: "a;b" is not a cookie name`,
		`bad.yaml:17: http[3].key[2].query: must not be empty`,
		`bad.yaml:18: http[3].key[3].entry: missing: generic needs the entry key its value goes under`,
		`bad.yaml:19: http[3].key[4].missing: a generic value is never missing`,
		`bad.yaml:20: http[3].key[5].missing: unknown missing "never" (want ip, shared or skip)`,
		`bad.yaml:21: http[3].key[6].entry: must not be empty`,
		`bad.yaml:23: http[3].key[8]: entry "remote_address" is already given by http[3].key[7]`,
		`bad.yaml:25: http[4].key: unknown key part "7"`,
	}},
	{"tree", httpTree + `  - key: [{generic: x, entry: user_id}]
  - key: [path, {generic: x, entry: user_id}]
  - key: [path]
  - key: [{header: X-User, entry: user}]
  - key: [{header: X-User, entry: remote_address}]
  - key: [{query: id}]
  - key: [path, remote_address, {cookie: u, entry: user}]
`, []string{
		`bad.yaml:11: http[0].key: no descriptor matches user_id: no top-level descriptor has key "user_id" (give the route its own rate_limit, or add descriptors for these entries)`,
		`bad.yaml:12: http[1].key: no descriptor matches path → user_id: no descriptor under path has key "user_id"`,
		`bad.yaml:13: http[2].key: no descriptor matches path: no descriptor at path has a rate_limit`,
		`bad.yaml:14: http[3].key: no descriptor matches user: no descriptor at user has a rate_limit`,
		`bad.yaml:16: http[5].key: no descriptor matches query.id: no top-level descriptor has key "query.id"`,
		`bad.yaml:17: http[6].key: no descriptor matches path → remote_address → user: no descriptor under path → remote_address has key "user"`,
	}},
	{"tree errors first", `domain: t
descriptors:
  - key: remote_address
    rate_limit: {unit: fortnight, requests_per_unit: 1}
http:
  - key: [remote_address]
`, []string{`bad.yaml:4: descriptors[0].rate_limit.unit: unknown unit "fortnight"`}},
	{"no descriptors", "domain: t\nhttp:\n  - key: [remote_address]\n", []string{
		`bad.yaml:3: http[0].key: no descriptor matches remote_address: no top-level descriptor has key "remote_address"`}},
	{"actions", httpTree + `  - key: [remote_address]
    action: block
    max_delay: 1s
  - key: [remote_address]
    action: redirect
    status: 503
  - key: [remote_address]
    action: delay
  - key: [remote_address]
    action: ban
  - key: [remote_address]
    max_delay: 1s
    redirect: /slow
    redirect_status: 307
    ban: {threshold: 1, interval: 1s, duration: 1s}
  - key: [remote_address]
    action: shadow
    status: 429
`, []string{
		`bad.yaml:12: http[0].action: unknown action "block" (want deny, ban, delay, redirect, shadow or defer)`,
		`bad.yaml:15: http[1].redirect: missing: action redirect needs redirect`,
		`bad.yaml:16: http[1].status: action redirect refuses no request, so it has no status`,
		`bad.yaml:18: http[2].max_delay: missing: action delay needs max_delay`,
		`bad.yaml:20: http[3].ban: missing: action ban needs ban: {threshold, interval, duration}`,
		`bad.yaml:22: http[4].max_delay: only action delay has max_delay (this route's action is deny)`,
		`bad.yaml:23: http[4].redirect: only action redirect has redirect (this route's action is deny)`,
		`bad.yaml:24: http[4].redirect_status: only action redirect has redirect_status (this route's action is deny)`,
		`bad.yaml:25: http[4].ban: only action ban has ban (this route's action is deny)`,
		`bad.yaml:28: http[5].status: action shadow refuses no request`,
	}},
	{"status, cost and delay", httpTree + `  - key: [remote_address]
    status: 600
    cost: 0
  - key: [remote_address]
    status: "429"
    cost: 1000000001
  - key: [remote_address]
    action: delay
    max_delay: 2m
  - key: [remote_address]
    action: delay
    max_delay: 0s
  - key: [remote_address]
    action: delay
    max_delay: soon
`, []string{
		`bad.yaml:12: http[0].status: 600 is out of range (400 to 599)`,
		`bad.yaml:13: http[0].cost: 0 is out of range (1 to 1000000000)`,
		`bad.yaml:15: http[1].status: want a whole number, got "429"`,
		`bad.yaml:16: http[1].cost: 1000000001 is out of range (1 to 1000000000)`,
		`bad.yaml:19: http[2].max_delay: 2m0s is too long (at most 1m0s)`,
		`bad.yaml:22: http[3].max_delay: want a positive duration such as "90s", "15m" or "36h", got "0s"`,
		`bad.yaml:25: http[4].max_delay: want a positive duration such as "90s", "15m" or "36h", got "soon"`,
	}},
	{"redirects", httpTree + `  - key: [remote_address]
    action: redirect
    redirect: ftp://example.com/
    redirect_status: 304
  - key: [remote_address]
    action: redirect
    redirect: //evil.example
    redirect_status: 200
  - key: [remote_address]
    action: redirect
    redirect: slow.html
  - key: [remote_address]
    action: redirect
    redirect: "/a b"
  - key: [remote_address]
    action: redirect
    redirect: "https://user:pw@example.com/"
  - key: [remote_address]
    action: redirect
    redirect: "/\\evil.example"
  - key: [remote_address]
    action: redirect
    redirect: "https:///nohost"
  - key: [remote_address]
    action: redirect
    redirect: "/%zz"
`, []string{
		`bad.yaml:13: http[0].redirect: "ftp://example.com/": want an absolute http(s) URL or a path starting with "/"`,
		`bad.yaml:14: http[0].redirect_status: 304 is not a redirect status (want 301, 302, 303, 307 or 308)`,
		`bad.yaml:17: http[1].redirect: "//evil.example" starts with "//", which browsers read as another host`,
		`bad.yaml:18: http[1].redirect_status: 200 is not a redirect status`,
		`bad.yaml:21: http[2].redirect: "slow.html": want an absolute http(s) URL`,
		`bad.yaml:24: http[3].redirect: "/a b" holds spaces, control characters or backslashes`,
		`bad.yaml:27: http[4].redirect: "https://user:pw@example.com/" holds user information`,
		`bad.yaml:30: http[5].redirect: "/\\evil.example" holds spaces, control characters or backslashes`,
		`bad.yaml:33: http[6].redirect: "https:///nohost": want an absolute http(s) URL`,
		`bad.yaml:36: http[7].redirect: "/%zz" is not a URL`,
	}},
	{"bans", httpTree + `  - key: [remote_address]
    action: ban
    ban: {threshold: 0, interval: 500ms, duration: 9000h, treshold: 1}
  - key: [remote_address]
    action: ban
    ban:
      threshold: 10
  - key: [remote_address]
    action: ban
    ban: 5
`, []string{
		`bad.yaml:13: http[0].ban.threshold: 0 is out of range (1 to 4294967295)`,
		`bad.yaml:13: http[0].ban.interval: 500ms is out of range (1s to 8760h0m0s)`,
		`bad.yaml:13: http[0].ban.duration: 9000h0m0s is out of range (1s to 8760h0m0s)`,
		`bad.yaml:13: http[0].ban.treshold: unknown field "treshold" (did you mean "threshold"?)`,
		`bad.yaml:17: http[1].ban.interval: missing: the window the threshold counts in`,
		`bad.yaml:17: http[1].ban.duration: missing: how long a ban lasts`,
		`bad.yaml:20: http[2].ban: want a mapping, got "5"`,
	}},
	{"exempt_cidrs", httpTree + `  - key: [remote_address]
    exempt_cidrs:
      - 10.0.0.1/8
      - not-an-ip
      - fe80::1%eth0
      - 192.0.2.7
      - 192.0.2.7/32
      - 10.0.0.0/33
  - key: [remote_address]
    exempt_cidrs: 10.0.0.0/8
`, []string{
		`bad.yaml:13: http[0].exempt_cidrs[0]: "10.0.0.1/8" has bits set beyond its /8: did you mean "10.0.0.0/8"?`,
		`bad.yaml:14: http[0].exempt_cidrs[1]: "not-an-ip" is not an IP address or a CIDR prefix`,
		`bad.yaml:15: http[0].exempt_cidrs[2]: "fe80::1%eth0" is not an IP address or a CIDR prefix`,
		`bad.yaml:17: http[0].exempt_cidrs[4]: "192.0.2.7/32" is listed twice (first as http[0].exempt_cidrs[3])`,
		`bad.yaml:18: http[0].exempt_cidrs[5]: "10.0.0.0/33" is not a CIDR prefix`,
		`bad.yaml:20: http[1].exempt_cidrs: want a list, got "10.0.0.0/8"`,
	}},
	{"criticality", httpTree + `  - key: [remote_address]
    criticality: URGENT
  - key: [remote_address]
    criticality: 3
  - key: [remote_address]
    criticality: [CRITICAL]
  - key: [remote_address]
    criticality: ""
`, []string{
		`bad.yaml:12: http[0].criticality: unknown criticality "URGENT" (want SHEDDABLE, SHEDDABLE_PLUS, CRITICAL, CRITICAL_PLUS)`,
		`bad.yaml:14: http[1].criticality: unknown criticality "3" (want SHEDDABLE, SHEDDABLE_PLUS, CRITICAL, CRITICAL_PLUS)`,
		`bad.yaml:16: http[2].criticality: want a string, got a list`,
		`bad.yaml:18: http[3].criticality: unknown criticality "" (want SHEDDABLE, SHEDDABLE_PLUS, CRITICAL, CRITICAL_PLUS)`,
	}},
	{"own rate limits", httpTree + `  - key: [remote_address]
    rate_limit: {unit: fortnight, requests_per_unit: 1}
  - key: [remote_address]
    rate_limit: {unit: second, requests_per_unit: 1}
    rate_limits: []
  - key: [remote_address]
    rate_limits: []
  - key: [remote_address]
    rate_limit: {requests_per_unit: 1}
  - key: [remote_address]
    rate_limit: {unit: second, requests_per_unit: 1, algorithm: token_bucket, granularity: 1s}
`, []string{
		`bad.yaml:12: http[0].rate_limit.unit: unknown unit "fortnight"`,
		`bad.yaml:15: http[1].rate_limits: give rate_limit or rate_limits, not both`,
		`bad.yaml:17: http[2].rate_limits: an empty list: give at least one rule`,
		`bad.yaml:19: http[3].rate_limit.unit: missing: a rate_limit needs a unit`,
		`bad.yaml:21: http[4].rate_limit.granularity: `,
	}},
}

func TestHTTPErrors(t *testing.T) {
	for _, tt := range httpErrorTests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := Parse("bad.yaml", []byte(tt.src))
			if err == nil {
				t.Fatalf("parsed, %d routes; want errors", len(d.HTTP()))
			}
			if d != nil {
				t.Errorf("a domain with errors")
			}
			got := strings.Split(err.Error(), "\n")
			fail := len(got) != len(tt.want)
			for i := 0; !fail && i < len(got); i++ {
				fail = !strings.HasPrefix(got[i], tt.want[i])
			}
			if fail {
				t.Errorf("errors:\n%s\nwant lines starting with:\n%s", err, strings.Join(tt.want, "\n"))
			}
			var list interface{ Unwrap() []error }
			if !errors.As(err, &list) {
				t.Fatalf("not a joined error: %T", err)
			}
			for _, e := range list.Unwrap() {
				var pe *Error
				if !errors.As(e, &pe) || pe.File != "bad.yaml" || pe.Line == 0 || pe.Field == "" {
					t.Errorf("%v is not a *rules.Error of bad.yaml with a line and a field", e)
				}
			}
		})
	}
}

func TestHTTPLimitsOnInput(t *testing.T) {
	var b strings.Builder
	b.WriteString(httpTree + "  - key:\n")
	for i := 0; i <= MaxRouteParts; i++ {
		fmt.Fprintf(&b, "      - {generic: v, entry: e%d}\n", i)
	}
	_, err := Parse("big.yaml", []byte(b.String()))
	if err == nil || err.Error() != "big.yaml:12: http[0].key: 9 entries; a route's key has at most 8" {
		t.Errorf("long key: %v", err)
	}

	// Routes count as descriptors.
	defer func(d int) { maxDescriptors = d }(maxDescriptors)
	maxDescriptors = 5 // httpTree has 4
	_, err = Parse("many.yaml", []byte(httpTree+"  - key: [remote_address]\n  - key: [remote_address]\n"))
	if err == nil || err.Error() != "many.yaml:12: http[1]: more than 5 descriptors (http routes included) in one file" {
		t.Errorf("many routes: %v", err)
	}
}

// parseRoute parses httpTree with one route and returns the route.
func parseRoute(t *testing.T, route string) *HTTPRoute {
	t.Helper()
	d := mustParse(t, httpTree+route)
	if len(d.HTTP()) != 1 {
		t.Fatalf("%d routes", len(d.HTTP()))
	}
	return d.HTTP()[0]
}

func TestHTTPFields(t *testing.T) {
	ra := []HTTPKeyPart{{Kind: "remote_address", Entry: "remote_address"}}
	// base is a route with every field at its default.
	base := func(f func(r *HTTPRoute)) HTTPRoute {
		r := HTTPRoute{Name: "http[0]", Key: ra, Action: "deny", Status: 429, Cost: 1}
		if f != nil {
			f(&r)
		}
		return r
	}
	const own = "    rate_limit: {unit: second, requests_per_unit: 1}\n"
	tests := []struct {
		name  string
		route string
		want  HTTPRoute
	}{
		{"defaults", "  - key: [remote_address]\n", base(nil)},
		{"null fields", "  - key: [remote_address]\n    name: ~\n    match: ~\n    action: ~\n    status:\n    cost: ~\n    ban: ~\n", base(nil)},
		{"empty match", "  - key: [remote_address]\n    match: {}\n", base(nil)},
		{"name", "  - name: per-ip\n    key: [remote_address]\n", base(func(r *HTTPRoute) { r.Name = "per-ip" })},
		{"a single key part", "  - key: remote_address\n", base(nil)},
		{"host string", "  - key: [remote_address]\n    match: {host: API.Example.COM}\n", base(func(r *HTTPRoute) { r.Hosts = []string{"api.example.com"} })},
		{"host list", "  - key: [remote_address]\n    match:\n      host: [\"*.Example.com\", \"[2001:DB8:0::1]\", 192.0.2.1, localhost, under_score.example]\n",
			base(func(r *HTTPRoute) {
				r.Hosts = []string{"*.example.com", "[2001:db8::1]", "192.0.2.1", "localhost", "under_score.example"}
			})},
		{"path_prefix", "  - key: [remote_address]\n    match: {path_prefix: /api/}\n", base(func(r *HTTPRoute) { r.PathPrefix = "/api/" })},
		{"path exact", "  - key: [remote_address]\n    match: {path: /login}\n", base(func(r *HTTPRoute) { r.Path = "/login" })},
		{"path segments", "  - key: [remote_address]\n    match: {path: /users/*/posts/**}\n", base(func(r *HTTPRoute) { r.Path = "/users/*/posts/**" })},
		{"path everything", "  - key: [remote_address]\n    match: {path: /**}\n", base(func(r *HTTPRoute) { r.Path = "/**" })},
		{"path and prefix", "  - key: [remote_address]\n    match: {path: /api/*, path_prefix: /api/v}\n", base(func(r *HTTPRoute) { r.Path, r.PathPrefix = "/api/*", "/api/v" })},
		{"methods", "  - key: [remote_address]\n    match: {methods: [get, Post, PURGE]}\n", base(func(r *HTTPRoute) { r.Methods = []string{"GET", "POST", "PURGE"} })},
		{"one method", "  - key: [remote_address]\n    match: {methods: delete}\n", base(func(r *HTTPRoute) { r.Methods = []string{"DELETE"} })},
		{"key parts", `  - key:
      - remote_address
      - path
      - method
      - host
      - {header: X-API-Key}
      - {cookie: session}
      - {query: api_key, missing: shared}
      - {generic: premium, entry: tier}
` + own, base(func(r *HTTPRoute) {
			r.Key = []HTTPKeyPart{
				{Kind: "remote_address", Entry: "remote_address"},
				{Kind: "path", Entry: "path"},
				{Kind: "method", Entry: "method"},
				{Kind: "host", Entry: "host"},
				{Kind: "header", Name: "X-API-Key", Entry: "x-api-key", Missing: "ip"},
				{Kind: "cookie", Name: "session", Entry: "cookie.session", Missing: "ip"},
				{Kind: "query", Name: "api_key", Entry: "query.api_key", Missing: "shared"},
				{Kind: "generic", Name: "premium", Entry: "tier"},
			}
		})},
		{"key parts with entries", `  - key:
      - {header: X-Tenant, entry: tenant, missing: SKIP}
      - {cookie: id, entry: user, missing: ip}
` + own, base(func(r *HTTPRoute) {
			r.Key = []HTTPKeyPart{
				{Kind: "header", Name: "X-Tenant", Entry: "tenant", Missing: "skip"},
				{Kind: "cookie", Name: "id", Entry: "user", Missing: "ip"},
			}
		})},
		{"entry matches the tree", "  - key: [{header: X-Forwarded-For, entry: remote_address}]\n",
			base(func(r *HTTPRoute) {
				r.Key = []HTTPKeyPart{{Kind: "header", Name: "X-Forwarded-For", Entry: "remote_address", Missing: "ip"}}
			})},
		{"nested tree", "  - key: [path, remote_address]\n", base(func(r *HTTPRoute) {
			r.Key = []HTTPKeyPart{{Kind: "path", Entry: "path"}, {Kind: "remote_address", Entry: "remote_address"}}
		})},
		{"action deny", "  - key: [remote_address]\n    action: DENY\n    status: 503\n", base(func(r *HTTPRoute) { r.Status = 503 })},
		{"action ban", "  - key: [remote_address]\n    action: ban\n    status: 403\n    ban: {threshold: 20, interval: 1m, duration: 10m}\n",
			base(func(r *HTTPRoute) {
				r.Action, r.Status, r.Ban = "ban", 403, HTTPBan{Threshold: 20, Interval: time.Minute, Duration: 10 * time.Minute}
			})},
		{"action delay", "  - key: [remote_address]\n    action: delay\n    max_delay: 500ms\n",
			base(func(r *HTTPRoute) { r.Action, r.MaxDelay = "delay", 500*time.Millisecond })},
		{"action redirect", "  - key: [remote_address]\n    action: redirect\n    redirect: https://example.com/slow-down?from=api\n",
			base(func(r *HTTPRoute) {
				r.Action, r.Status, r.Redirect, r.RedirectStatus = "redirect", 0, "https://example.com/slow-down?from=api", 302
			})},
		{"redirect path and status", "  - key: [remote_address]\n    action: redirect\n    redirect: /busy.html\n    redirect_status: 307\n",
			base(func(r *HTTPRoute) {
				r.Action, r.Status, r.Redirect, r.RedirectStatus = "redirect", 0, "/busy.html", 307
			})},
		{"action shadow", "  - key: [remote_address]\n    action: shadow\n", base(func(r *HTTPRoute) { r.Action, r.Status = "shadow", 0 })},
		{"cost", "  - key: [remote_address]\n    cost: 1_000\n", base(func(r *HTTPRoute) { r.Cost = 1000 })},
		{"exempt_cidrs", "  - key: [remote_address]\n    exempt_cidrs: [10.0.0.0/8, 192.0.2.7, \"2001:db8::/32\", \"::1\", \"::ffff:192.0.2.8\"]\n",
			base(func(r *HTTPRoute) {
				r.ExemptCIDRs = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.0.2.7/32"),
					netip.MustParsePrefix("2001:db8::/32"), netip.MustParsePrefix("::1/128"), netip.MustParsePrefix("192.0.2.8/32")}
			})},
		{"empty exempt_cidrs", "  - key: [remote_address]\n    exempt_cidrs: []\n", base(nil)},
		{"merge keys", "  - &r {key: [remote_address], cost: 3}\n", base(func(r *HTTPRoute) { r.Cost = 3 })},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := parseRoute(t, tt.route)
			got := *r
			if got.File != "t.yaml" || got.Line != 11 {
				t.Errorf("at %s:%d, want t.yaml:11", got.File, got.Line)
			}
			got.File, got.Line, got.Limit = "", 0, nil
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("route\n%+v\nwant\n%+v", got, tt.want)
			}
			if own := strings.Contains(tt.route, "rate_limit"); (r.Limit != nil) != own {
				t.Errorf("limit %v, want one: %v", r.Limit, own)
			}
		})
	}

	// Anchors and merge keys.
	d := mustParse(t, httpTree+"  - &a\n    key: [remote_address]\n    action: delay\n    max_delay: 1s\n  - <<: *a\n    name: b\n")
	if rs := d.HTTP(); len(rs) != 2 || rs[1].Name != "b" || rs[1].MaxDelay != time.Second || rs[0].Name != "http[0]" {
		t.Errorf("merged routes %+v", rs)
	}
	// No http section, or an empty one.
	for _, src := range []string{"domain: t\n", "domain: t\nhttp:\n", "domain: t\nhttp: []\n"} {
		if d := mustParse(t, src); d.HTTP() != nil {
			t.Errorf("%q: routes %v", src, d.HTTP())
		}
	}
	// HTTP returns a copy.
	d = mustParse(t, httpTree+"  - key: [remote_address]\n")
	d.HTTP()[0] = nil
	if d.HTTP()[0] == nil {
		t.Error("HTTP shares its slice")
	}
}

// httpWant is the example's routes (testdata/http/edge.yaml), without
// their limits.
var httpWant = []HTTPRoute{
	{Name: "per-ip", File: "testdata/http/edge.yaml", Line: 13, Key: []HTTPKeyPart{{Kind: "remote_address", Entry: "remote_address"}},
		Action: "deny", Status: 429, Cost: 1},
	{Name: "login", File: "testdata/http/edge.yaml", Line: 15, Path: "/login", Methods: []string{"POST"},
		Key:    []HTTPKeyPart{{Kind: "path", Entry: "path"}, {Kind: "remote_address", Entry: "remote_address"}},
		Action: "ban", Status: 429, Ban: HTTPBan{Threshold: 20, Interval: time.Minute, Duration: 10 * time.Minute}, Cost: 1},
	{Name: "api-keys", File: "testdata/http/edge.yaml", Line: 20, Hosts: []string{"*.example.com"}, PathPrefix: "/api/",
		Key:    []HTTPKeyPart{{Kind: "header", Name: "X-API-Key", Entry: "api_key", Missing: "ip"}},
		Action: "delay", Status: 429, MaxDelay: 500 * time.Millisecond, Cost: 1},
}

func parseFile(t *testing.T, name string) *Domain {
	t.Helper()
	data, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	d, err := Parse(name, data)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestHTTPExample(t *testing.T) {
	d := parseFile(t, "testdata/http/edge.yaml")
	rs := d.HTTP()
	if len(rs) != len(httpWant) {
		t.Fatalf("%d routes", len(rs))
	}
	for i, r := range rs {
		got := *r
		got.Limit = nil
		if !reflect.DeepEqual(got, httpWant[i]) {
			t.Errorf("route %d\n%+v\nwant\n%+v", i, got, httpWant[i])
		}
	}
	if rs[0].Limit != nil || rs[1].Limit != nil {
		t.Error("routes relying on the descriptors have limits of their own")
	}
	l := rs[2].Limit
	if l == nil || l.Policy == nil {
		t.Fatalf("api-keys: limit %+v", l)
	}
	if l.Name != "edge.http.api-keys" || l.NameGiven || l.Domain != "edge" || l.File != "testdata/http/edge.yaml" || l.Line != 24 ||
		l.Unit != "minute" || l.RequestsPerUnit != 600 || l.Window != time.Minute || l.ShadowMode || l.Unlimited || l.Blocked {
		t.Errorf("api-keys limit %+v", l)
	}
	if n := l.Policy.Name(); n != "rules/edge#http/api-keys" {
		t.Errorf("policy %q", n)
	}
	rules := l.Policy.Rules()
	if len(rules) != 1 || rules[0].Name != "minute" || rules[0].Algorithm != floodgate.TokenBucket || rules[0].Limit != 600 ||
		rules[0].Burst != 100 || rules[0].Period != time.Minute || rules[0].Calendar != "" || rules[0].OnStoreFailure != "" {
		t.Errorf("rules %+v", rules)
	}
	// The route's limit is its own: not a descriptor's.
	if len(d.Limits()) != 2 {
		t.Errorf("%d descriptor limits, want 2", len(d.Limits()))
	}
	for _, dl := range d.Limits() {
		if dl == l || dl.Policy.Name() == l.Policy.Name() {
			t.Errorf("descriptor limit %q is the route's", dl.Name)
		}
	}
	// Routes relying on the descriptors build descriptors the tree limits.
	c, _ := NewConfig(d)
	checkMatch(t, c, "edge", es("path", "/login", "remote_address", "192.0.2.7"), want{rpu: 5, unit: "minute"})
	checkMatch(t, c, "edge", es("remote_address", "192.0.2.7"), want{rpu: 10, unit: "second"})
}

func TestHTTPOwnLimit(t *testing.T) {
	d := mustParse(t, `domain: own.example
failure_mode: closed
http:
  - name: burst
    key: [remote_address]
    action: shadow
    rate_limits:
      - {unit: second, requests_per_unit: 10}
      - {name: slow, window: 90s, requests_per_unit: 100, failure_mode: open}
  - name: named
    key: [{header: X-API-Key}]
    rate_limit: {name: api, unit: hour, requests_per_unit: 1000, replaces: [{name: other}]}
  - name: free
    key: [remote_address]
    rate_limit: {unlimited: true}
  - name: blocked
    key: [remote_address]
    rate_limit: {unit: minute, requests_per_unit: 0}
`)
	if len(d.Limits()) != 0 {
		t.Errorf("%d descriptor limits", len(d.Limits()))
	}
	rs := d.HTTP()
	if len(rs) != 4 {
		t.Fatalf("%d routes", len(rs))
	}
	l := rs[0].Limit
	if l.Name != "own%2Eexample.http.burst" || !l.ShadowMode || l.Policy.Name() != "rules/own.example#http/burst" {
		t.Errorf("burst: name %q shadow %v policy %q", l.Name, l.ShadowMode, l.Policy.Name())
	}
	rules := l.Policy.Rules()
	if len(rules) != 2 || rules[0].Name != "second" || rules[0].OnStoreFailure != floodgate.FailClosed ||
		rules[1].Name != "slow" || rules[1].Period != 90*time.Second || rules[1].OnStoreFailure != floodgate.FailOpen {
		t.Errorf("burst rules %+v", rules)
	}
	if l := rs[1].Limit; l.Name != "api" || !l.NameGiven || !reflect.DeepEqual(l.Replaces, []string{"other"}) || l.ShadowMode ||
		l.Policy.Name() != "rules/own.example#http/named" {
		t.Errorf("named %+v", l)
	}
	if l := rs[2].Limit; !l.Unlimited || l.Policy != nil || l.Name != "own%2Eexample.http.free" {
		t.Errorf("free %+v", l)
	}
	if l := rs[3].Limit; !l.Blocked || l.Policy == nil || l.RequestsPerUnit != 0 {
		t.Errorf("blocked %+v", l)
	}
}

func TestHTTPPolicyNames(t *testing.T) {
	src := httpTree + `  - name: a
    key: [remote_address]
    rate_limit: {unit: second, requests_per_unit: 1}
  - name: "x/y#z=%"
    key: [remote_address]
    rate_limit: {unit: second, requests_per_unit: 1}
  - name: ` + strings.Repeat("n", 300) + `
    key: [remote_address]
    rate_limit: {unit: second, requests_per_unit: 1}
`
	d1, d2 := mustParse(t, src), mustParse(t, strings.Replace(src, "requests_per_unit: 1}", "requests_per_unit: 7, algorithm: gcra}", 1))
	seen := map[string]bool{}
	for _, l := range d1.Limits() {
		seen[l.Policy.Name()] = true
	}
	wantNames := []string{"rules/t#http/a", "rules/t#http/x%2Fy%23z%3D%25", ""}
	for i, r := range d1.HTTP() {
		n := r.Limit.Policy.Name()
		if seen[n] {
			t.Errorf("policy %q shared", n)
		}
		seen[n] = true
		if wantNames[i] != "" && n != wantNames[i] {
			t.Errorf("route %d: policy %q, want %q", i, n, wantNames[i])
		}
		if len(n) > 200 {
			t.Errorf("policy name of %d bytes", len(n))
		}
		// Stable across parses (and a changed limit): state is kept.
		r2 := d2.HTTP()[i]
		if r2.Limit.Policy.Name() != n || r2.Limit.Policy == r.Limit.Policy || r2.Limit.Name != r.Limit.Name {
			t.Errorf("route %d reparsed: policy %q name %q, was %q %q", i, r2.Limit.Policy.Name(), r2.Limit.Name, n, r.Limit.Name)
		}
	}
	if n := d1.HTTP()[2].Limit.Policy.Name(); !strings.HasPrefix(n, "rules/t#http/nnn") || !strings.Contains(n[120:], "#") {
		t.Errorf("long name %q", n)
	}
	// A route named like a descriptor path's policy still has its own.
	d := mustParse(t, `domain: t
descriptors:
  - key: "#http"
    value: a
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: http
    descriptors:
      - key: a
        rate_limit: {unit: second, requests_per_unit: 1}
http:
  - name: a
    key: [remote_address]
    rate_limit: {unit: second, requests_per_unit: 1}
`)
	names := map[string]bool{}
	for _, l := range d.Limits() {
		names[l.Policy.Name()] = true
		names[l.Name] = true
	}
	l := d.HTTP()[0].Limit
	if names[l.Policy.Name()] || names[l.Name] {
		t.Errorf("route limit %q (policy %q) shares a name with a descriptor's: %v", l.Name, l.Policy.Name(), names)
	}
	if l.Name != "rules/t#http/a" {
		t.Errorf("a route whose readable name is taken is named %q", l.Name)
	}
}

func TestHTTPJSON(t *testing.T) {
	c, err := NewConfig(parseFile(t, "testdata/http/edge.yaml"), mustParse(t, "domain: plain\n"))
	if err != nil {
		t.Fatal(err)
	}
	j, err := c.JSON()
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Domains []struct {
			Domain string
			HTTP   []struct {
				Name   string
				Line   int
				Action string
				Status int
				Cost   int64
				Match  *struct {
					Host       []string
					PathPrefix string `json:"path_prefix"`
					Path       string
					Methods    []string
				}
				Key []struct {
					Kind, Name, Entry, Missing string
				}
				MaxDelay string `json:"max_delay"`
				Ban      *struct {
					Threshold          int64
					Interval, Duration string
				}
				Limit *struct {
					Name, Policy string
					Rules        []map[string]any
				}
			}
		}
	}
	if err := json.Unmarshal(j, &v); err != nil {
		t.Fatal(err)
	}
	if len(v.Domains) != 2 || v.Domains[0].Domain != "edge" || len(v.Domains[0].HTTP) != 3 || v.Domains[1].HTTP != nil {
		t.Fatalf("JSON:\n%s", j)
	}
	if strings.Count(string(j), `"http"`) != 1 {
		t.Errorf("a domain without routes lists them:\n%s", j)
	}
	rs := v.Domains[0].HTTP
	if r := rs[0]; r.Name != "per-ip" || r.Line != 13 || r.Action != "deny" || r.Status != 429 || r.Cost != 1 || r.Match != nil ||
		len(r.Key) != 1 || r.Key[0].Kind != "remote_address" || r.Key[0].Entry != "remote_address" || r.Limit != nil || r.Ban != nil {
		t.Errorf("per-ip %+v", r)
	}
	if r := rs[1]; r.Match == nil || r.Match.Path != "/login" || len(r.Match.Methods) != 1 || r.Ban == nil ||
		r.Ban.Threshold != 20 || r.Ban.Interval != "1m0s" || r.Ban.Duration != "10m0s" || len(r.Key) != 2 {
		t.Errorf("login %+v", r)
	}
	if r := rs[2]; r.Match == nil || r.Match.Host[0] != "*.example.com" || r.Match.PathPrefix != "/api/" || r.MaxDelay != "500ms" ||
		r.Key[0].Name != "X-API-Key" || r.Key[0].Entry != "api_key" || r.Key[0].Missing != "ip" ||
		r.Limit == nil || r.Limit.Policy != "rules/edge#http/api-keys" || r.Limit.Name != "edge.http.api-keys" ||
		len(r.Limit.Rules) != 1 || r.Limit.Rules[0]["algorithm"] != "token_bucket" {
		t.Errorf("api-keys %+v", r)
	}
}

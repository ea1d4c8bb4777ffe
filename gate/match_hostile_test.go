package gate

import (
	"errors"
	"fmt"
	"net/http/httptest"
	"testing"

	"github.com/floodgate/floodgate/rules"
)

// Spellings of one request that a server treats alike match a limit
// alike: a cleaned path (net/http's ServeMux and FileServer serve
// "//admin/x" and "/z/../admin/x" as "/admin/x"), a host with its root dot
// ("api.example.com."), and a method in lower case (which many frameworks
// upper-case). An audit passed a limit of 2 four times with each.
func TestMatchSeesThroughSpellings(t *testing.T) {
	l := &limit{Limit: &Limit{Match: Match{PathPrefix: "/admin/"}}}
	for _, p := range []string{"/admin/x", "//admin/x", "/z/../admin/x", "/./admin/x", "/admin/./x", "/admin//x", "/admin/"} {
		if !l.matches(&Request{HTTP: httptest.NewRequest("GET", "http://h"+p, nil)}) {
			t.Errorf("path %q does not match the prefix /admin/", p)
		}
	}
	for _, p := range []string{"/adminx", "/admin", "/z/admin/x"} {
		if l.matches(&Request{HTTP: httptest.NewRequest("GET", "http://h"+p, nil)}) {
			t.Errorf("path %q matches the prefix /admin/", p)
		}
	}
	r := httptest.NewRequest("GET", "http://h/", nil)
	r.URL.Path = "/../admin/x" // "/%2e%2e/admin/x" as net/http decodes it
	if !l.matches(&Request{HTTP: r}) {
		t.Error("/../admin/x does not match /admin/")
	}

	h := &limit{Limit: &Limit{}, hosts: []string{"api.example.com", "*.example.org"}}
	for _, host := range []string{"api.example.com", "API.example.com.", "api.example.com.:80", "a.example.org.", "a.example.org.:8080"} {
		r := httptest.NewRequest("GET", "http://x/", nil)
		r.Host = host
		if !h.matches(&Request{HTTP: r}) {
			t.Errorf("host %q does not match", host)
		}
	}

	m := &limit{Limit: &Limit{}, methods: []string{"POST"}}
	for _, method := range []string{"POST", "post", "Post"} {
		if !m.matches(&Request{HTTP: httptest.NewRequest(method, "http://h/login", nil)}) {
			t.Errorf("method %q does not match POST", method)
		}
	}
	if m.matches(&Request{HTTP: httptest.NewRequest("GET", "http://h/login", nil)}) {
		t.Error("GET matches POST")
	}
}

func TestCleanPathKeepsCleanPaths(t *testing.T) {
	for in, want := range map[string]string{"": "/", "/": "/", "/a": "/a", "/a/": "/a/", "//a//": "/a/", "/a/../b": "/b", "/a/..": "/", "a": "/a"} {
		if got := cleanPath(in); got != want {
			t.Errorf("cleanPath(%q) = %q, want %q", in, got, want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { _ = cleanPath("/api/v1/users/") }); n != 0 {
		t.Errorf("a clean path costs %v allocations", n)
	}
}

// What rules files declare, a gate takes, so that validate (which reads
// each file alone) says ok to exactly what a proxy loads: a route's key is
// bounded as a limit's, and routes are bounded per file only
// (rules.MaxRoutes), a gate taking any number: here three files at that
// bound make one gate, and the last route of the last file limits.
func TestRulesBoundsMatchTheGate(t *testing.T) {
	if rules.MaxRouteParts != maxKeyParts {
		t.Fatalf("rules bound a route's key at %d parts; the gate at %d", rules.MaxRouteParts, maxKeyParts)
	}
	dir := t.TempDir()
	writeRoutes(t, dir, 3, rules.MaxRoutes)
	cfg, errs := rules.LoadDir(dir)
	if len(errs) > 0 {
		t.Fatal(errors.Join(errs...))
	}
	limits, err := FromRules(cfg)
	if err != nil || len(limits) != 3*rules.MaxRoutes {
		t.Fatalf("%d limits, %v", len(limits), err)
	}
	g, _ := memGate(t, Config{Limits: limits, Rules: cfg})
	last := fmt.Sprintf("/d2/r%d", rules.MaxRoutes-1)
	for i := range 3 {
		if v := check(g, httpReq("192.0.2.1:1", last)); v.Allowed != (i < 2) || len(v.Outcomes) != 1 {
			t.Fatalf("request %d to %s: allowed %v, %d outcomes", i, last, v.Allowed, len(v.Outcomes))
		}
	}
}

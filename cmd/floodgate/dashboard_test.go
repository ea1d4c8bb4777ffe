package main

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate/internal/dashboard"
	"github.com/floodgate/floodgate/internal/recorder"
	"github.com/floodgate/floodgate/internal/redistest"
)

// dashboardRoutes are the dashboard's routes, each as a client calls it.
var dashboardRoutes = []struct{ method, path, body string }{
	{"GET", "/dashboard/", ""},
	{"GET", "/dashboard/app.js", ""},
	{"GET", "/dashboard/whatif.js", ""},
	{"GET", "/dashboard/vendor/uplot/uPlot.iife.min.js", ""},
	{"GET", "/dashboard/session", ""},
	{"GET", "/dashboard/events", ""},
	{"GET", "/dashboard/api/v1/rules", ""},
	{"GET", "/dashboard/api/v1/top", ""},
	{"POST", "/dashboard/api/v1/keys/inspect", `{"domain":"api","entries":[{"key":"user","value":"a"}]}`},
}

// call sends one request; for an event stream it reads up to the first
// event. It returns the status and what was read.
func call(t *testing.T, c *http.Client, method, u, body string, hdr map[string]string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, u, strings.NewReader(body))
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	defer resp.Body.Close()
	if resp.Header.Get("Content-Type") == "text/event-stream" {
		r := bufio.NewReader(resp.Body)
		var b strings.Builder
		for snap := false; ; {
			line, err := r.ReadString('\n')
			b.WriteString(line)
			if err != nil || snap && strings.HasPrefix(line, "data: ") {
				break
			}
			snap = snap || line == "event: snapshot\n"
		}
		return resp.StatusCode, b.String()
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b)
}

// TestDashboardTLSAndToken: on a serve with TLS and an admin token, every
// dashboard route (the page, its assets, the event stream, the admin API
// behind it) speaks TLS only, refuses requests without the token, and
// answers the token or a session cookie, which is Secure.
func TestDashboardTLSAndToken(t *testing.T) {
	p := newPKI(t)
	cert, key := p.issue(t, "server", x509.ExtKeyUsageServerAuth)
	dir := t.TempDir()
	writeRules(t, dir, "api.yaml", apiRules)
	s := startServerNoClient(t, "--rules", dir, "--data", t.TempDir(), "--tls-cert", cert, "--tls-key", key, "--admin-token", strongToken)
	pool := x509.NewCertPool()
	pool.AddCert(p.ca)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
	noRedirect := func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	secure := &http.Client{Transport: tr, Timeout: 30 * time.Second, CheckRedirect: noRedirect}
	plain := &http.Client{Timeout: 30 * time.Second}
	auth := map[string]string{"Authorization": "Bearer " + strongToken, "X-Floodgate-Dashboard": "1"}
	for _, rt := range dashboardRoutes {
		// plaintext: the listener speaks TLS only
		code, body := call(t, plain, rt.method, "http://"+s.admin+rt.path, rt.body, auth)
		if code == 200 || strings.Contains(body, "event: snapshot") || strings.Contains(body, "uPlot") {
			t.Errorf("%s %s over plain HTTP: %d %.80q", rt.method, rt.path, code, body)
		}
		// TLS without the token
		if code, body := call(t, secure, rt.method, "https://"+s.admin+rt.path, rt.body, map[string]string{"X-Floodgate-Dashboard": "1"}); code != 401 {
			t.Errorf("%s %s without the token: %d %.80q", rt.method, rt.path, code, body)
		}
		// TLS with it
		code, body = call(t, secure, rt.method, "https://"+s.admin+rt.path, rt.body, auth)
		if code >= 300 {
			t.Errorf("%s %s with the token: %d %.80q", rt.method, rt.path, code, body)
		}
		if rt.path == "/dashboard/events" && !strings.Contains(body, "event: snapshot") {
			t.Errorf("the event stream over TLS: %q", body)
		}
	}
	// the login form's cookie is Secure, and opens the stream
	req, _ := http.NewRequest("POST", "https://"+s.admin+"/dashboard/login", strings.NewReader(url.Values{"token": {strongToken}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := secure.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("login: %d", resp.StatusCode)
	}
	var cookie *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == "floodgate_dashboard" {
			cookie = c
		}
	}
	if cookie == nil || !cookie.Secure || !cookie.HttpOnly || cookie.SameSite != http.SameSiteStrictMode {
		t.Fatalf("session cookie over TLS: %+v", cookie)
	}
	if code, body := call(t, secure, "GET", "https://"+s.admin+"/dashboard/events", "", map[string]string{"Cookie": cookie.Name + "=" + cookie.Value}); code != 200 || !strings.Contains(body, "event: snapshot") {
		t.Errorf("the stream with the session cookie: %d %q", code, body)
	}
}

// TestNoDashboard: --no-dashboard serves no /dashboard/ (the admin API
// stays).
func TestNoDashboard(t *testing.T) {
	dir := t.TempDir()
	writeRules(t, dir, "api.yaml", apiRules)
	s := startServerNoClient(t, "--rules", dir, "--data", t.TempDir(), "--no-dashboard")
	c := &http.Client{Timeout: 30 * time.Second}
	if code, _ := call(t, c, "GET", "http://"+s.admin+"/dashboard/", "", nil); code != 404 {
		t.Errorf("/dashboard/ with --no-dashboard: %d, want 404", code)
	}
	if code, _ := call(t, c, "GET", "http://"+s.admin+"/v1/rules", "", nil); code != 200 {
		t.Errorf("/v1/rules with --no-dashboard: %d", code)
	}
}

// TestProxyDashboard: floodgate proxy serves the dashboard on its admin
// listener with the panels whose data it has: decisions per route, their
// top limited keys, the store's health; every route needs the token.
func TestProxyDashboard(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer up.Close()
	dir := t.TempDir()
	writeRules(t, dir, "edge.yaml", proxyRules)
	p := startProxy(t, up.URL, dir, "--admin-token", strongToken)
	base := "http://" + p.addrs["proxy"]
	for range 8 {
		proxyGet(t, base+"/keyed/x", "X-API-Key", "flooder") // 3 passed, 5 refused
	}
	for i := range 3 {
		proxyGet(t, base+"/keyed/x", "X-API-Key", fmt.Sprint("light", i))
	}
	c := &http.Client{Timeout: 30 * time.Second}
	admin := "http://" + p.addrs["admin"]
	for _, rt := range dashboardRoutes {
		if code, _ := call(t, c, rt.method, admin+rt.path, rt.body, map[string]string{"X-Floodgate-Dashboard": "1"}); code != 401 {
			t.Errorf("proxy %s %s without the token: %d, want 401", rt.method, rt.path, code)
		}
	}
	auth := map[string]string{"Authorization": "Bearer " + strongToken}
	if code, body := call(t, c, "GET", admin+"/dashboard/", "", auth); code != 200 || !strings.Contains(body, `id="whatif"`) {
		t.Fatalf("proxy page: %d", code)
	}
	// snapshots until one holds the refusals (a sample a second)
	deadline := time.Now().Add(time.Minute)
	for {
		code, body := call(t, c, "GET", admin+"/dashboard/events", "", auth)
		if code != 200 {
			t.Fatalf("proxy events: %d %s", code, body)
		}
		_, data, _ := strings.Cut(body, "data: ")
		var snap dashboard.Snapshot
		if err := json.Unmarshal([]byte(strings.TrimSpace(data)), &snap); err != nil {
			t.Fatalf("snapshot %q: %v", data, err)
		}
		var refused, allowed uint64
		for _, s := range snap.Series {
			if s.Rule == "edge/per-key" {
				refused, allowed = s.Total[recorder.Refused], s.Total[recorder.Allowed]
			}
		}
		top := ""
		for _, r := range snap.Top {
			if r.Rule == "edge/per-key" && len(r.Keys) > 0 {
				top = fmt.Sprintf("%s %d", r.Keys[0].Key, r.Keys[0].Count)
			}
		}
		if refused == 5 && allowed == 6 && top == "flooder 5" {
			if snap.Server != "proxy" || snap.Panels.Admin || snap.Panels.Latency || snap.Rules != nil || snap.Health.Store != "memory" {
				t.Errorf("proxy snapshot: server %q panels %+v rules %v health %+v", snap.Server, snap.Panels, snap.Rules, snap.Health)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no snapshot with per-key's 6 allowed, 5 refused and flooder on top: %d %d %q; series %+v top %+v", allowed, refused, top, snap.Series, snap.Top)
		}
	}
}

// TestDashboardStreamEndsOnSIGTERM: an open event stream does not hold
// SIGTERM's drain: the stream ends and serve exits at once, well within a
// drain timeout of ten minutes (stop fails after 20 s).
func TestDashboardStreamEndsOnSIGTERM(t *testing.T) {
	dir := t.TempDir()
	writeRules(t, dir, "api.yaml", apiRules)
	s := startServerNoClient(t, "--rules", dir, "--data", t.TempDir(), "--drain-timeout", "10m")
	resp, err := http.Get("http://" + s.admin + "/dashboard/events")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	r := bufio.NewReader(resp.Body)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("stream ended before its first snapshot: %v", err)
		}
		if line == "event: snapshot\n" {
			break
		}
	}
	s.stop(t)
	if _, err := io.Copy(io.Discard, r); err != nil {
		t.Logf("stream: %v", err)
	}
}

// snapshotOf reads one snapshot from serve's event stream.
func snapshotOf(t *testing.T, admin string) dashboard.Snapshot {
	t.Helper()
	code, body := call(t, &http.Client{Timeout: 30 * time.Second}, "GET", "http://"+admin+"/dashboard/events", "", nil)
	_, data, _ := strings.Cut(body, "data: ")
	var snap dashboard.Snapshot
	if err := json.Unmarshal([]byte(strings.TrimSpace(data)), &snap); code != 200 || err != nil {
		t.Fatalf("events: %d %v %q", code, err, body)
	}
	return snap
}

// TestDashboardRulesAndReload: the rules panel's data holds each limit's
// file:line, and the last reload's result: ok, then a refused file's
// error naming its file:line, while the previous rules stay listed.
func TestDashboardRulesAndReload(t *testing.T) {
	dir := t.TempDir()
	writeRules(t, dir, "api.yaml", apiRules)
	s := startServerNoClient(t, "--rules", dir, "--data", t.TempDir())
	snap := snapshotOf(t, s.admin)
	if snap.Rules == nil || !snap.Rules.Reload.OK || len(snap.Rules.Limits) == 0 {
		t.Fatalf("rules: %+v", snap.Rules)
	}
	l := snap.Rules.Limits[0]
	if l.Domain != "api" || l.Name != "api.user" || !strings.HasSuffix(l.File, "api.yaml") || l.Line != 4 || l.Text != "50 per 1h0m0s" {
		t.Errorf("limit %+v, want api.user of api.yaml:4, 50 per 1h0m0s", l)
	}
	writeRules(t, dir, "api.yaml", "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight, requests_per_unit: 5}\n")
	deadline := time.Now().Add(time.Minute)
	for {
		snap = snapshotOf(t, s.admin)
		if r := snap.Rules.Reload; !r.OK && r.Error != "" {
			if !strings.Contains(r.Error, "api.yaml:4") || r.Time.IsZero() {
				t.Errorf("refused reload: %+v, want its error at api.yaml:4", r)
			}
			if len(snap.Rules.Limits) == 0 || snap.Rules.Limits[0].Text != "50 per 1h0m0s" {
				t.Errorf("after a refused reload the previous rules are not listed: %+v", snap.Rules.Limits)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no refused reload in a minute: %+v", snap.Rules.Reload)
		}
	}
}

// TestDashboardRedisHealth: the store panel's data follows Redis: the
// breaker closed while it answers; open, with errors and degraded
// decisions, once it is killed.
func TestDashboardRedisHealth(t *testing.T) {
	srv := redistest.Standalone(t)
	dir := t.TempDir()
	writeRules(t, dir, "api.yaml", apiRules)
	// a patient timeout: with the 50 ms default a starved host's slow call
	// reads as an error while Redis is up (load 25 did that)
	s := startServer(t, "--rules", dir, "--data", t.TempDir(), "--store", "redis://"+srv.Addr, "--store-timeout", "10s")
	s.ask(t, "api", desc("user", "a"))
	h := snapshotOf(t, s.admin).Health
	if h.Store != "redis" || h.Breaker != "closed" || h.Calls == 0 || h.Errors != 0 {
		t.Fatalf("health with Redis up: %+v", h)
	}
	srv.Kill()
	deadline := time.Now().Add(time.Minute)
	for {
		s.ask(t, "api", desc("user", "a")) // decided by the failure mode
		h = snapshotOf(t, s.admin).Health
		if h.Breaker == "open" {
			if h.Errors == 0 || h.Degraded == 0 || h.BreakerOpens == 0 {
				t.Errorf("breaker open: %+v, want errors, degraded decisions and an opening counted", h)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the breaker never showed open with Redis killed: %+v", h)
		}
	}
}

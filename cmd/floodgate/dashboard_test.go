package main

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
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
		for !strings.Contains(b.String(), "event: snapshot") {
			line, err := r.ReadString('\n')
			b.WriteString(line)
			if err != nil {
				break
			}
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

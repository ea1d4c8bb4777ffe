package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate/service"
)

// strongToken is 32 random hex digits: 128 bits, the least taken beyond
// loopback.
const strongToken = "9d41c07be35a2f68e1b04c9a7d52f3e6"

// clientFrom is an HTTP client whose connections come from the loopback
// address local (127.0.0.2, say), so one test can be two clients.
func clientFrom(local string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}, Timeout: 10 * time.Second}
	return &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return d.DialContext(ctx, network, addr)
		},
		MaxIdleConnsPerHost: 4,
	}}
}

func adminGet(t *testing.T, c *http.Client, url, token string) (int, http.Header) {
	t.Helper()
	return adminDo(t, c, "GET", url, token)
}

func adminDo(t *testing.T, c *http.Client, method, url, token string) (int, http.Header) {
	t.Helper()
	req, _ := http.NewRequest(method, url, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header
}

// hammerAdmin sends 4,000 wrong tokens to the admin API at adminURL from
// 127.0.0.1, each in turn to the next of the routes ("METHOD URL"), and
// checks that after the allowance they are answered 429 with a
// Retry-After, that the metric at metricsAddr counts both kinds, and that
// the right token from 127.0.0.2 still works at adminURL.
func hammerAdmin(t *testing.T, adminURL, metricsAddr string, routes ...string) {
	const n = 4000
	attacker, operator := clientFrom("127.0.0.1"), clientFrom("127.0.0.2")
	if code, _ := adminGet(t, operator, adminURL, strongToken); code != 200 {
		t.Fatalf("the right token: %d", code)
	}
	codes := map[int]int{}
	start := time.Now()
	for i := range n {
		method, url, _ := strings.Cut(routes[i%len(routes)], " ")
		code, h := adminDo(t, attacker, method, url, fmt.Sprintf("guess-%032d", i))
		codes[code]++
		if code == http.StatusTooManyRequests {
			if s, err := strconv.Atoi(h.Get("Retry-After")); err != nil || s < 1 {
				t.Fatalf("a 429 with Retry-After %q, want whole seconds", h.Get("Retry-After"))
			}
		}
	}
	elapsed := time.Since(start)
	t.Logf("%d wrong tokens in %v from one address: %v", n, elapsed, codes)
	// The allowance refills continuously (AdminFailureLimit a period):
	// a slow run earns a guess or two more, bounded by its own length.
	most := service.AdminFailureLimit + int(elapsed*time.Duration(service.AdminFailureLimit)/service.AdminFailurePeriod) + 1
	if codes[401] < service.AdminFailureLimit || codes[401] > most || codes[401]+codes[429] != n {
		t.Fatalf("%d wrong tokens in %v from one address: %v, want %d to %d answered 401, the rest 429", n, elapsed, codes, service.AdminFailureLimit, most)
	}
	if got := metricValue(t, metricsAddr, `floodgate_admin_auth_failures_total{result="bad_token"}`); got != float64(codes[401]) {
		t.Errorf("bad_token failures counted %v, want %d", got, codes[401])
	}
	if got := metricValue(t, metricsAddr, `floodgate_admin_auth_failures_total{result="throttled"}`); got != float64(codes[429]) {
		t.Errorf("throttled failures counted %v, want %d", got, codes[429])
	}
	if code, _ := adminGet(t, operator, adminURL, strongToken); code != 200 {
		t.Fatalf("the right token from another address after the attack: %d", code)
	}
}

// serve's admin API throttles wrong tokens per client address.
func TestServeAdminThrottlesWrongTokens(t *testing.T) {
	dir := t.TempDir()
	writeRules(t, dir, "api.yaml", apiRules)
	s := startServerNoClient(t, "--rules", dir, "--data", t.TempDir(), "--admin-addr", "0.0.0.0:0", "--admin-token", strongToken)
	_, port, err := net.SplitHostPort(s.admin)
	if err != nil {
		t.Fatal(err)
	}
	url := "http://127.0.0.1:" + port + "/v1/rules"
	hammerAdmin(t, url, s.http, "GET "+url)
}

// proxy's admin API throttles wrong tokens per client address, with one
// allowance for its ban route and the service's routes: guesses spread
// over both get no more than one route's.
func TestProxyAdminThrottlesWrongTokens(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(up.Close)
	dir := t.TempDir()
	writeRules(t, dir, "edge.yaml", proxyRules)
	p := startProxy(t, up.URL, dir, "--admin-addr", "0.0.0.0:0", "--admin-token", strongToken)
	_, port, err := net.SplitHostPort(p.addrs["admin"])
	if err != nil {
		t.Fatal(err)
	}
	base := "http://127.0.0.1:" + port
	hammerAdmin(t, base+"/v1/rules", "127.0.0.1:"+port, "GET "+base+"/v1/rules", "POST "+base+"/v1/bans/lift")
}

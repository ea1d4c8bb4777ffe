package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// A soft route: 2 an hour, 50% more with a warning.
const proxySoftRules = `domain: edge
http:
  - name: soft
    match: {path_prefix: /soft/}
    key: [remote_address]
    rate_limit: {unit: hour, requests_per_unit: 2, mode: soft, soft_percent: 50, algorithm: token_bucket}
  - name: hard
    match: {path_prefix: /hard/}
    key: [remote_address]
    rate_limit: {unit: hour, requests_per_unit: 2, algorithm: token_bucket}
`

// floodgate proxy counts a soft route's crossings as serve counts its
// rules' (floodgate_soft_limit_crossings_total): the one request admitted
// past the soft line, with Floodgate-Warning, and only it, is in
// floodgate_proxy_soft_limit_crossings_total and, as admitted, in the
// decisions' ok; a hard route's requests, admitted or refused, never are.
func TestProxyCountsSoftCrossings(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer up.Close()
	dir := t.TempDir()
	writeRules(t, dir, "edge.yaml", proxySoftRules)
	p := startProxy(t, up.URL, dir)
	base := "http://" + p.addrs["proxy"]
	var got []string
	for range 4 {
		code, h, _ := proxyGet(t, base+"/soft/")
		got = append(got, http.StatusText(code)+"/"+h.Get("Floodgate-Warning"))
	}
	if want := "OK/ OK/ OK/soft limit exceeded Too Many Requests/"; strings.Join(got, " ") != want {
		t.Fatalf("soft route: %q, want %q", strings.Join(got, " "), want)
	}
	for i := range 3 {
		if code, h, _ := proxyGet(t, base+"/hard/"); (code == 200) != (i < 2) || h.Get("Floodgate-Warning") != "" {
			t.Fatalf("hard route request %d: %d %v", i, code, h)
		}
	}
	_, _, metrics := proxyGet(t, "http://"+p.addrs["admin"]+"/metrics")
	for _, want := range []string{
		`floodgate_proxy_soft_limit_crossings_total{limit="edge/soft"} 1`,
		`floodgate_proxy_limit_decisions_total{limit="edge/soft",outcome="ok"} 3`,
		`floodgate_proxy_limit_decisions_total{limit="edge/soft",outcome="over_limit"} 1`,
		`floodgate_proxy_limit_decisions_total{limit="edge/hard",outcome="over_limit"} 1`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("no %s in\n%s", want, grepLines(metrics, "floodgate_proxy_"))
		}
	}
	if s := grepLines(metrics, `floodgate_proxy_soft_limit_crossings_total{limit="edge/hard"}`); s != "" {
		t.Errorf("the hard route counted crossings: %s", s)
	}
}

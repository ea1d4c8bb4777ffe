package main

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// A request without a Host: HTTP/1.1 requires one, so it gets 400 (not a
// 502 counted as the upstream's error, as before); HTTP/1.0 may leave it
// out, and goes on with the upstream's host.
func TestProxyRequestWithoutHost(t *testing.T) {
	var seenHost string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seenHost = r.Host
		io.WriteString(w, "upstream")
	}))
	defer up.Close()
	dir := t.TempDir()
	writeRules(t, dir, "edge.yaml", proxyRules)
	p := startProxy(t, up.URL, dir)
	raw := func(req string) string { return statusLine(t, p.addrs["proxy"], req) }
	if got := raw("GET /x HTTP/1.1\r\n\r\n"); !strings.Contains(got, " 400 ") {
		t.Errorf("HTTP/1.1 without Host: %q, want 400", got)
	}
	if got := raw("GET /x HTTP/1.0\r\n\r\n"); !strings.Contains(got, " 200 ") || seenHost != strings.TrimPrefix(up.URL, "http://") {
		t.Errorf("HTTP/1.0 without Host: %q, upstream saw Host %q", got, seenHost)
	}
	if v := metricValue(t, p.addrs["admin"], "floodgate_proxy_upstream_errors_total"); v != 0 {
		t.Errorf("upstream errors %v, want 0", v)
	}
}

// statusLine sends req as it is on a connection of its own to addr and
// returns the first line of the answer ("" if none comes in 10 s).
func statusLine(t *testing.T, addr, req string) string {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, req)
	line, _ := bufio.NewReader(c).ReadString('\n')
	return line
}

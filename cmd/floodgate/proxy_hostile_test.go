package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// hostileRules limit a route on an IPv6 host, 2 per address.
const hostileRules = `domain: hostile
http:
  - name: v6host
    match: {host: "[::1]"}
    key: [remote_address]
    rate_limit: {unit: hour, requests_per_unit: 2, algorithm: token_bucket}
`

// recordingUpstream keeps the header of each request by path, and counts
// the requests.
func recordingUpstream(t *testing.T) (*httptest.Server, func(path string) http.Header, *atomic.Int64) {
	t.Helper()
	var mu sync.Mutex
	seen := map[string]http.Header{}
	var n atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		io.Copy(io.Discard, r.Body)
		mu.Lock()
		seen[r.URL.Path] = r.Header.Clone()
		mu.Unlock()
		if r.URL.Path == "/up-hop" {
			w.Header()["Connection"] = []string{"a1, a2, a3, a4, a5, a6, a7, a8, X-Up-Secret"}
			w.Header().Set("X-Up-Secret", "1")
		}
		io.WriteString(w, "ok")
	}))
	t.Cleanup(up.Close)
	return up, func(path string) http.Header {
		mu.Lock()
		defer mu.Unlock()
		return seen[path]
	}, &n
}

// Every header a Connection line names stays on its hop, however many
// it names and however the lines are split. An audit got a client's
// X-Secret to the upstream as the ninth name of one line (the proxy
// dropped eight at most), and as the only name of a line followed by
// "Connection: close" (fasthttp's PeekAll then gives "close" alone); an
// upstream's ninth name came back to the client likewise. The client's
// Cookie header passes as it was written.
func TestProxyHostileConnectionListedHeaders(t *testing.T) {
	up, seen, _ := recordingUpstream(t)
	dir := t.TempDir()
	writeRules(t, dir, "h.yaml", hostileRules)
	p := startProxy(t, up.URL, dir)
	addr := p.addrs["proxy"]
	for path, req := range map[string]string{
		"/nine":  "GET /nine HTTP/1.1\r\nHost: x\r\nConnection: a1, a2, a3, a4, a5, a6, a7, a8, X-Secret, close\r\nX-Secret: s\r\nA1: 1\r\nCookie: a=1;b;  c=\"x\"\r\n\r\n",
		"/split": "GET /split HTTP/1.1\r\nHost: x\r\nConnection: X-Secret\r\nConnection: close\r\nX-Secret: s\r\n\r\n",
	} {
		if line := statusLine(t, addr, req); !strings.HasPrefix(line, "HTTP/1.1 200") {
			t.Fatalf("%s: %q", path, line)
		}
		h := seen(path)
		if h == nil || h.Get("X-Secret") != "" || h.Get("A1") != "" || h.Get("Connection") != "" {
			t.Errorf("%s: the upstream got %v", path, h)
		}
		if path == "/nine" && h.Get("Cookie") != `a=1;b;  c="x"` {
			t.Errorf("Cookie reached the upstream as %q", h.Get("Cookie"))
		}
	}
	code, h, _ := proxyGet(t, "http://"+addr+"/up-hop")
	if code != 200 || h.Get("X-Up-Secret") != "" {
		t.Errorf("the upstream's ninth Connection name came back: %d %v", code, h)
	}
}

// A chunked request that also carries a Content-Length is framed by its
// chunks, and its connection closes after the answer (RFC 9112, 6.1): a
// server in front that framed it by its Content-Length disagrees on where
// the next request starts. An audit had the proxy serve the request
// pipelined after it on the same connection.
func TestProxyHostileChunkedWithContentLength(t *testing.T) {
	up, seen, n := recordingUpstream(t)
	dir := t.TempDir()
	writeRules(t, dir, "h.yaml", hostileRules)
	p := startProxy(t, up.URL, dir)
	conn, br, resp, err := rawRequest(t, p.addrs["proxy"], "POST /te HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"+
		"5\r\nhello\r\n0\r\n\r\nGET /second HTTP/1.1\r\nHost: x\r\n\r\n")
	if err != nil {
		t.Fatal(err)
	}
	io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !resp.Close {
		t.Errorf("CL+TE: %d, Connection %q; want 200 and the connection closed", resp.StatusCode, resp.Header.Get("Connection"))
	}
	if rest, _ := io.ReadAll(br); len(rest) != 0 {
		t.Errorf("after the CL+TE request the proxy answered %q", rest)
	}
	conn.Close()
	if seen("/second") != nil || n.Load() != 1 {
		t.Errorf("the pipelined request reached the upstream (%d requests)", n.Load())
	}
	// A plain chunked request keeps its connection.
	_, _, resp, err = rawRequest(t, p.addrs["proxy"], "POST /te HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
	if err != nil || resp.StatusCode != 200 || resp.Close {
		t.Errorf("a chunked request: %v %v", resp, err)
	}
}

// A client's own X-Real-IP is not passed on (its own X-Forwarded-For and
// Forwarded were not): an upstream behind the proxy that reads X-Real-IP,
// as those behind nginx do, took any address a client named. From a
// trusted proxy it passes.
func TestProxyHostileXRealIP(t *testing.T) {
	up, seen, _ := recordingUpstream(t)
	dir := t.TempDir()
	writeRules(t, dir, "h.yaml", hostileRules)
	for _, trusted := range []bool{false, true} {
		var extra []string
		if trusted {
			extra = []string{"--trusted-proxies", "127.0.0.0/8"}
		}
		p := startProxy(t, up.URL, dir, extra...)
		if code, _, _ := proxyGet(t, "http://"+p.addrs["proxy"]+"/real", "X-Real-IP", "203.0.113.9"); code != 200 {
			t.Fatal(code)
		}
		if got := seen("/real").Get("X-Real-IP"); (got == "203.0.113.9") != trusted {
			t.Errorf("trusted %v: the upstream got X-Real-IP %q", trusted, got)
		}
	}
}

// A route on an IPv6 host limits requests for it, whatever their port and
// spelling of the address: an audit sent http://[::1]:PORT/ through a
// limit of 2 as often as it liked (gate.TestHostileIPv6HostRouteApplies).
func TestProxyHostileIPv6HostRoute(t *testing.T) {
	up, _, _ := recordingUpstream(t)
	dir := t.TempDir()
	writeRules(t, dir, "h.yaml", hostileRules)
	p := startProxy(t, up.URL, dir)
	var got []string
	for _, host := range []string{"[::1]:8000", "[0:0:0:0:0:0:0:1]", "[::1]"} {
		got = append(got, strings.TrimSpace(statusLine(t, p.addrs["proxy"], "GET / HTTP/1.1\r\nHost: "+host+"\r\n\r\n")))
	}
	if !strings.HasPrefix(got[0], "HTTP/1.1 200") || !strings.HasPrefix(got[1], "HTTP/1.1 200") || !strings.HasPrefix(got[2], "HTTP/1.1 429") {
		t.Errorf("three requests for [::1] through a limit of 2: %q", got)
	}
}

// A request with two Host lines is refused (RFC 9112, 3.2: 400): the
// proxy decided and forwarded by the last, where a server in front of it
// may have routed by the first. One Host, in any case, passes.
func TestProxyHostileTwoHosts(t *testing.T) {
	up, _, hits := recordingUpstream(t)
	dir := t.TempDir()
	writeRules(t, dir, "h.yaml", hostileRules)
	p := startProxy(t, up.URL, dir)
	if got := statusLine(t, p.addrs["proxy"], "GET /two HTTP/1.1\r\nHost: other.example\r\nhost: api.example\r\n\r\n"); !strings.HasPrefix(got, "HTTP/1.1 400") {
		t.Errorf("two Host lines: %q, want 400", got)
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("the upstream got %d requests with two Hosts", n)
	}
	if got := statusLine(t, p.addrs["proxy"], "GET /one HTTP/1.1\r\nHOST: api.example\r\nX-Host: b\r\n\r\n"); !strings.HasPrefix(got, "HTTP/1.1 200") {
		t.Errorf("one Host line: %q, want 200", got)
	}
}

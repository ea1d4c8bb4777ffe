package main

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/floodgate/floodgate/internal/redistest"
)

// startProxy runs `floodgate proxy` in front of upstream with the rules in
// dir (and extra flags).
func startProxy(t *testing.T, upstream, dir string, extra ...string) *server {
	t.Helper()
	args := append([]string{"proxy", "--upstream", upstream, "--listen", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0",
		"--rules", dir, "--data", t.TempDir(), "--log-format", "json", "--reload-interval", "100ms"}, extra...)
	return startBinary(t, args, "proxy", "admin")
}

// Token buckets, not fixed windows: counts that must be exact cannot meet
// a window's end in the middle of a test.
const proxyRules = `domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 5, algorithm: token_bucket}
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: 3, algorithm: token_bucket}
http:
  - name: per-ip
    match: {path_prefix: /limited/}
    key: [remote_address]
  - name: per-key
    match: {path_prefix: /keyed/}
    key:
      - {header: X-API-Key, entry: api_key, missing: shared}
  - name: shadow
    match: {path_prefix: /shadow/}
    key: [remote_address]
    action: shadow
    rate_limit: {unit: hour, requests_per_unit: 1, algorithm: token_bucket}
`

func proxyGet(t *testing.T, url string, hdr ...string) (int, http.Header, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

func TestProxyLimitsAndReloads(t *testing.T) {
	var seenXFF atomic.Value
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seenXFF.Store(r.Header.Get("X-Forwarded-For"))
		io.WriteString(w, "hello from upstream "+r.URL.Path)
	}))
	defer up.Close()
	dir := t.TempDir()
	writeRules(t, dir, "edge.yaml", proxyRules)
	p := startProxy(t, up.URL, dir)
	base := "http://" + p.addrs["proxy"]

	// Exactly 5 per client address under concurrency, counted at the proxy.
	var ok, refused atomic.Int64
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 3; j++ {
				code, h, body := proxyGet(t, base+"/limited/x", "X-Forwarded-For", "203.0.113.1")
				switch code {
				case 200:
					ok.Add(1)
					if body != "hello from upstream /limited/x" || h.Get("RateLimit-Policy") != `"edge.remote_address";q=5;w=3600` {
						t.Errorf("passed: %q %v", body, h)
					}
				case 429:
					refused.Add(1)
				default:
					t.Errorf("status %d", code)
				}
			}
		}()
	}
	wg.Wait()
	if ok.Load() != 5 || refused.Load() != 19 {
		t.Fatalf("%d passed, %d refused; want 5 and 19", ok.Load(), refused.Load())
	}
	// The client's own X-Forwarded-For is not believed (no trusted
	// proxies) and not passed on as if it were: the upstream sees the peer.
	if got := seenXFF.Load(); got != "127.0.0.1" {
		t.Fatalf("upstream saw X-Forwarded-For %q, want 127.0.0.1", got)
	}
	// Unmatched paths pass unlimited.
	for i := 0; i < 10; i++ {
		if code, _, _ := proxyGet(t, base+"/free"); code != 200 {
			t.Fatalf("unlimited path: %d", code)
		}
	}
	// A header key, and a shared key without it.
	for i := 0; i < 4; i++ {
		code, _, _ := proxyGet(t, base+"/keyed/", "X-API-Key", "k1")
		if (code == 200) != (i < 3) {
			t.Fatalf("api key request %d: %d", i, code)
		}
	}
	if code, _, _ := proxyGet(t, base+"/keyed/", "X-API-Key", "k2"); code != 200 {
		t.Fatal("another API key was refused")
	}
	// Shadow never refuses.
	for i := 0; i < 5; i++ {
		if code, _, _ := proxyGet(t, base+"/shadow/"); code != 200 {
			t.Fatalf("shadow route refused: %d", code)
		}
	}

	// A live reload raises the per-key limit; a broken file is refused
	// and the last good rules stay.
	writeRules(t, dir, "edge.yaml", strings.Replace(proxyRules, "requests_per_unit: 3,", "requests_per_unit: 6,", 1))
	waitFor(t, "reload", func() bool { code, _, _ := proxyGet(t, base+"/keyed/", "X-API-Key", "k1"); return code == 200 })
	writeRules(t, dir, "edge.yaml", proxyRules+"  - name: broken\n    key: [nonsense]\n")
	waitFor(t, "refusal logged", func() bool { return strings.Contains(p.logs(), "rules file refused") })
	if code, _, _ := proxyGet(t, base+"/limited/x", "X-Forwarded-For", "203.0.113.1"); code != 429 {
		t.Fatalf("after a refused file: %d", code)
	}
	code, _, metrics := proxyGet(t, "http://"+p.addrs["admin"]+"/metrics")
	if code != 200 || !strings.Contains(metrics, `floodgate_proxy_limit_decisions_total{limit="edge/per-ip",outcome="over_limit"}`) ||
		!strings.Contains(metrics, `floodgate_proxy_limit_decisions_total{limit="edge/shadow",outcome="shadow_over_limit"} 4`) {
		t.Fatalf("metrics:\n%s", metrics)
	}
}

func TestProxyTrustedProxy(t *testing.T) {
	var seenXFF atomic.Value
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seenXFF.Store(r.Header.Get("X-Forwarded-For"))
	}))
	defer up.Close()
	dir := t.TempDir()
	writeRules(t, dir, "edge.yaml", proxyRules)
	p := startProxy(t, up.URL, dir, "--trusted-proxies", "127.0.0.0/8,::1")
	base := "http://" + p.addrs["proxy"]
	for _, ip := range []string{"203.0.113.1", "203.0.113.2"} {
		for i := 0; i < 6; i++ {
			code, _, _ := proxyGet(t, base+"/limited/", "X-Forwarded-For", "198.51.100.9, "+ip)
			if (code == 200) != (i < 5) {
				t.Fatalf("%s request %d: %d", ip, i, code)
			}
		}
	}
	if got := seenXFF.Load(); got != "198.51.100.9, 203.0.113.2, 127.0.0.1" {
		t.Fatalf("upstream saw X-Forwarded-For %q", got)
	}
}

// lockstepSink is an upstream handler that reads chunks of size bytes,
// sending each one's index on got as it arrives, and answers their SHA-256.
func lockstepSink(chunks, size int, got chan<- int) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		h := sha256.New()
		buf := make([]byte, size)
		for i := 0; i < chunks; i++ {
			if _, err := io.ReadFull(r.Body, buf); err != nil {
				http.Error(w, err.Error(), 500)
				return
			}
			h.Write(buf)
			got <- i
		}
		w.Write(h.Sum(nil))
	}
}

// lockstepUpload sends chunks of size bytes to url (through the proxy to a
// lockstepSink), each only after the sink has had the one before — which
// a proxy that buffered whole bodies could not pass — and checks the
// digest the sink answers. knownLength sends a Content-Length; otherwise
// the body is chunked.
func lockstepUpload(t *testing.T, method, url string, chunks, size int, knownLength bool, got <-chan int) {
	t.Helper()
	pr, pw := io.Pipe()
	want := sha256.New()
	go func() {
		chunk := bytes.Repeat([]byte("floodgate"), size/9+1)[:size]
		for i := 0; i < chunks; i++ {
			chunk[0] = byte(i)
			want.Write(chunk)
			if _, err := pw.Write(chunk); err != nil {
				return
			}
			select {
			case <-got:
			case <-time.After(20 * time.Second):
				pw.CloseWithError(io.ErrUnexpectedEOF)
				t.Error("a chunk did not reach the upstream before the next was sent: the proxy buffers")
				return
			}
		}
		pw.Close()
	}()
	req, _ := http.NewRequest(method, url, pr)
	if knownLength {
		req.ContentLength = int64(chunks * size)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	sum, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Equal(sum, want.Sum(nil)) {
		t.Fatalf("upload: %d, digest mismatch", resp.StatusCode)
	}
}

// Bodies stream both ways: each chunk reaches the other side before the
// next is sent, which a proxy that buffered whole bodies could not do.
func TestProxyStreamsBodiesAndEvents(t *testing.T) {
	const chunks, size = 64, 1 << 20 // 64 MiB each way
	gotChunk := make(chan int, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/upload":
			lockstepSink(chunks, size, gotChunk)(w, r)
		case "/events":
			w.Header().Set("Content-Type", "text/event-stream")
			for i := 0; i < 3; i++ {
				io.WriteString(w, "data: event\n\n")
				w.(http.Flusher).Flush()
				<-gotChunk // the client has read it
			}
		}
	}))
	defer up.Close()
	dir := t.TempDir()
	writeRules(t, dir, "edge.yaml", proxyRules)
	p := startProxy(t, up.URL, dir)
	base := "http://" + p.addrs["proxy"]

	lockstepUpload(t, "POST", base+"/upload", chunks, size, false, gotChunk)

	resp, err := http.Get(base + "/events")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	for i := 0; i < 3; i++ {
		line, err := br.ReadString('\n')
		if err != nil || line != "data: event\n" {
			t.Fatalf("event %d: %q %v", i, line, err)
		}
		br.ReadString('\n')
		gotChunk <- i
	}
}

// An upgraded connection (WebSocket) is passed through both ways.
func TestProxyPassesWebSocket(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "websocket" {
			http.Error(w, "want an upgrade", 400)
			return
		}
		conn, brw, err := w.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		io.WriteString(conn, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		// Echo, upper-cased, line by line.
		for {
			line, err := brw.ReadString('\n')
			if err != nil {
				return
			}
			io.WriteString(conn, strings.ToUpper(line))
		}
	}))
	defer up.Close()
	dir := t.TempDir()
	writeRules(t, dir, "edge.yaml", proxyRules)
	p := startProxy(t, up.URL, dir)
	conn, br, resp, err := rawRequest(t, p.addrs["proxy"], "GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
	if err != nil || resp.StatusCode != 101 {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	for _, msg := range []string{"hello\n", "over the proxy\n"} {
		io.WriteString(conn, msg)
		got, err := br.ReadString('\n')
		if err != nil || got != strings.ToUpper(msg) {
			t.Fatalf("echo %q: %q %v", msg, got, err)
		}
	}
}

// With the upstream down the proxy answers 502 with a clear body, and
// recovers when it is back.
func TestProxyUpstreamDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	dir := t.TempDir()
	writeRules(t, dir, "edge.yaml", proxyRules)
	p := startProxy(t, "http://"+addr, dir)
	base := "http://" + p.addrs["proxy"]
	code, _, body := proxyGet(t, base+"/free")
	if code != 502 || !strings.Contains(body, "did not answer") || !strings.Contains(body, addr) {
		t.Fatalf("upstream down: %d %q", code, body)
	}
	ln, err = net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("the port was taken meanwhile: %v", err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "back") })}
	go srv.Serve(ln)
	defer srv.Close()
	if code, _, body := proxyGet(t, base+"/free"); code != 200 || body != "back" {
		t.Fatalf("upstream back: %d %q", code, body)
	}
}

// Two proxies on one Redis enforce one limit, and a `floodgate serve` on
// the same Redis sees the same counts (the keys are the service's).
func TestProxyFleetOnRedis(t *testing.T) {
	srv := redistest.Standalone(t)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer up.Close()
	dir := t.TempDir()
	writeRules(t, dir, "edge.yaml", proxyRules)
	// the store's timeout is not the subject: generous, or a starved host
	// times calls out and the rule's failure mode (open) admits them (two
	// proxies admitted 8 of 3)
	a := startProxy(t, up.URL, dir, "--store", "redis://"+srv.Addr, "--store-timeout", "10s")
	b := startProxy(t, up.URL, dir, "--store", "redis://"+srv.Addr, "--store-timeout", "10s")
	var ok atomic.Int64
	var wg sync.WaitGroup
	for _, p := range []*server{a, b} {
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 4 {
					if code, _, _ := proxyGet(t, "http://"+p.addrs["proxy"]+"/keyed/", "X-API-Key", "fleet"); code == 200 {
						ok.Add(1)
					}
				}
			}()
		}
	}
	wg.Wait()
	if ok.Load() != 3 {
		t.Fatalf("two proxies admitted %d, want exactly the limit of 3", ok.Load())
	}
	s := startServer(t, "--rules", dir, "--data", t.TempDir(), "--store", "redis://"+srv.Addr, "--store-timeout", "10s")
	if resp := s.ask(t, "edge", desc("api_key", "fleet")); resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("floodgate serve on the same Redis: %v, want OVER_LIMIT", resp.OverallCode)
	}
}

// Hostile requests get an error status, and the proxy goes on serving.
func TestProxyHostileRequests(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer up.Close()
	dir := t.TempDir()
	writeRules(t, dir, "edge.yaml", proxyRules)
	p := startProxy(t, up.URL, dir, "--trusted-proxies", "127.0.0.0/8")
	base := "http://" + p.addrs["proxy"]
	raw := func(req string) string { t.Helper(); return statusLine(t, p.addrs["proxy"], req) }
	for name, req := range map[string]string{
		"a 200 KiB header":      "GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 200<<10) + "\r\n\r\n",
		"a broken request line": "GET\r\n\r\n",
		"a bad chunked body":    "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
		"two content lengths":   "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
	} {
		if line := raw(req); !strings.HasPrefix(line, "HTTP/1.1 4") {
			t.Errorf("%s: answered %q, want a 4xx status", name, line)
		}
	}
	// Forwarding headers full of garbage, or very long, from a trusted peer.
	for _, xff := range []string{strings.Repeat("1.2.3.4, ", 3000), "[[::1]]], for=\"", strings.Repeat("x", 10000), "::ffff:999.1.1.1"} {
		if code, _, _ := proxyGet(t, base+"/free", "X-Forwarded-For", xff, "Forwarded", xff); code != 200 {
			t.Errorf("X-Forwarded-For %.40q: %d", xff, code)
		}
	}
	if code, _, body := proxyGet(t, base+"/free"); code != 200 || body != "ok" {
		t.Fatalf("after hostile requests: %d %q", code, body)
	}
}

// rawRequest dials addr, writes req as it is and reads the response's
// head; the connection (and its reader, for what follows) stays open until
// the test ends, with a 20 s deadline.
func rawRequest(t *testing.T, addr, req string) (net.Conn, *bufio.Reader, *http.Response, error) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(20 * time.Second))
	io.WriteString(conn, req)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	return conn, br, resp, err
}

// A limit that decides nothing (the example rules' per-address limit
// exempts loopback) is counted as not_limited: it was counted as
// shadow_over_limit, as though a shadow limit would have refused every
// request from loopback.
func TestProxyMetricsExemptIsNotShadowOver(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer up.Close()
	p := startBinary(t, []string{"proxy", "--upstream", up.URL, "--listen", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0",
		"--data", t.TempDir(), "--log-format", "json"}, "proxy", "admin")
	for range 3 {
		if code, _, _ := proxyGet(t, "http://"+p.addrs["proxy"]+"/"); code != 200 {
			t.Fatalf("loopback request: %d", code)
		}
	}
	_, _, metrics := proxyGet(t, "http://"+p.addrs["admin"]+"/metrics")
	if strings.Contains(metrics, `outcome="shadow_over_limit"`) ||
		!strings.Contains(metrics, `floodgate_proxy_limit_decisions_total{limit="example/per-ip",outcome="not_limited"} 3`) {
		t.Fatalf("metrics:\n%s", grepLines(metrics, "limit_decisions"))
	}
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

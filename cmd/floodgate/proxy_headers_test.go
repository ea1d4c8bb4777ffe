package main

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// Hop-by-hop headers go both ways; the RateLimit fields are the proxy's
// even when the upstream sends its own; the upstream URL's path and query
// prefix the request's.
func TestProxyHeadersBothWays(t *testing.T) {
	var seen atomic.Value
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen.Store(r.Clone(r.Context()))
		w.Header().Set("Connection", "X-Up-Hop")
		w.Header().Set("X-Up-Hop", "1")
		w.Header().Set("Keep-Alive", "timeout=5")
		w.Header().Set("RateLimit", "from-upstream")
		w.Header().Set("X-Up", "kept")
		io.WriteString(w, "ok")
	}))
	defer up.Close()
	dir := t.TempDir()
	writeRules(t, dir, "edge.yaml", proxyRules)
	p := startProxy(t, up.URL+"/base?fixed=1", dir)
	req, _ := http.NewRequest("GET", "http://"+p.addrs["proxy"]+"/limited/x?q=2", nil)
	req.Header.Set("Connection", "X-Client-Hop")
	req.Header.Set("X-Client-Hop", "1")
	req.Header.Set("Proxy-Authorization", "secret")
	req.Header.Set("Forwarded", "for=192.0.2.1")
	req.Header.Set("X-Forwarded-Host", "evil")
	req.Host = "example.test"
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "ok" {
		t.Fatalf("%d %q", resp.StatusCode, body)
	}
	if h := resp.Header; h.Get("X-Up-Hop") != "" || h.Get("Keep-Alive") != "" || h.Get("X-Up") != "kept" ||
		len(h.Values("Ratelimit")) != 1 || !strings.HasPrefix(h.Get("RateLimit"), `"edge.remote_address";r=4;t=`) {
		t.Fatalf("response header %v", h)
	}
	r := seen.Load().(*http.Request)
	if r.RequestURI != "/base/limited/x?fixed=1&q=2" || r.Host != "example.test" {
		t.Fatalf("upstream got %s (host %s)", r.RequestURI, r.Host)
	}
	if h := r.Header; h.Get("X-Client-Hop") != "" || h.Get("Proxy-Authorization") != "" || h.Get("Forwarded") != "" ||
		h.Get("X-Forwarded-Host") != "example.test" || h.Get("X-Forwarded-Proto") != "http" || h.Get("X-Forwarded-For") != "127.0.0.1" ||
		h.Get("Content-Type") != "" || h.Get("User-Agent") != "Go-http-client/1.1" {
		t.Fatalf("upstream request header %v", h)
	}
}

// A refusal is httplimit's: JSON when asked for, with the fields and
// no-store; a refused request's unread body closes the connection.
func TestProxyRefusal(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.Copy(io.Discard, r.Body) }))
	defer up.Close()
	dir := t.TempDir()
	writeRules(t, dir, "edge.yaml", proxyRules)
	p := startProxy(t, up.URL, dir)
	for range 5 {
		proxyGet(t, "http://"+p.addrs["proxy"]+"/limited/")
	}
	code, h, body := proxyGet(t, "http://"+p.addrs["proxy"]+"/limited/", "Accept", "application/json")
	if code != 429 || h.Get("Content-Type") != "application/json" || h.Get("Cache-Control") != "no-store" ||
		h.Get("Retry-After") == "" || !strings.HasPrefix(body, `{"error":"rate_limited","limit":"edge/per-ip","retry_after":`) {
		t.Fatalf("%d %v %q", code, h, body)
	}
	code, h, body = proxyGet(t, "http://"+p.addrs["proxy"]+"/limited/")
	if code != 429 || h.Get("Content-Type") != "text/plain; charset=utf-8" || !strings.HasPrefix(body, "rate limit exceeded (edge/per-ip); retry in ") {
		t.Fatalf("%d %v %q", code, h, body)
	}

	// A large body is not read: the connection closes after the refusal
	// rather than read the body as the next request.
	conn, err := net.Dial("tcp", p.addrs["proxy"])
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	big := strings.Repeat("GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n", 1000)
	io.WriteString(conn, "POST /limited/ HTTP/1.1\r\nHost: x\r\nContent-Length: "+strconv.Itoa(len(big))+"\r\n\r\n")
	go io.WriteString(conn, big)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 429 {
		t.Fatalf("%v %v", resp, err)
	}
	io.Copy(io.Discard, resp.Body)
	if resp, err := http.ReadResponse(br, nil); err == nil {
		t.Fatalf("a second response on the connection: %d", resp.StatusCode)
	}
}

// A body of known length streams too: each chunk reaches the upstream
// before the next is sent.
func TestProxyStreamsKnownLength(t *testing.T) {
	const chunks, size = 16, 1 << 20
	gotChunk := make(chan int, 1)
	up := httptest.NewServer(lockstepSink(chunks, size, gotChunk))
	defer up.Close()
	dir := t.TempDir()
	writeRules(t, dir, "edge.yaml", proxyRules)
	p := startProxy(t, up.URL, dir)
	lockstepUpload(t, "PUT", "http://"+p.addrs["proxy"]+"/upload", chunks, size, true, gotChunk)
}

// The upstream's 101 answer carries the RateLimit fields.
func TestProxyUpgradeFields(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, _, err := w.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		io.WriteString(conn, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\nhello")
	}))
	defer up.Close()
	dir := t.TempDir()
	writeRules(t, dir, "edge.yaml", proxyRules)
	p := startProxy(t, up.URL, dir)
	_, br, resp, err := rawRequest(t, p.addrs["proxy"], "GET /limited/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
	if err != nil || resp.StatusCode != 101 || resp.Header.Get("Upgrade") != "websocket" ||
		resp.Header.Get("RateLimit-Policy") == "" || resp.Header.Get("Content-Type") != "" {
		t.Fatalf("%v %v", resp, err)
	}
	rest, _ := io.ReadAll(br)
	if string(rest) != "hello" {
		t.Fatalf("after the upgrade: %q", rest)
	}
}

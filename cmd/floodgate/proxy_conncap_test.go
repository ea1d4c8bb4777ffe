package main

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestMaxConnsPerIPFlag(t *testing.T) {
	c, err := proxyFlags([]string{"--upstream", "http://127.0.0.1:1", "--max-conns-per-ip", "64"}, io.Discard)
	if err != nil || c.connCap.maxConnsPerIP != 64 {
		t.Fatalf("--max-conns-per-ip 64: %v, %+v", err, c)
	}
	c, err = proxyFlags([]string{"--upstream", "http://127.0.0.1:1"}, io.Discard)
	if err != nil || c.connCap.maxConnsPerIP != 0 {
		t.Fatalf("default: %v; want no cap", err)
	}
	t.Setenv("FLOODGATE_MAX_CONNS_PER_IP", "8")
	if c, err = proxyFlags([]string{"--upstream", "http://127.0.0.1:1"}, io.Discard); err != nil || c.connCap.maxConnsPerIP != 8 {
		t.Fatalf("FLOODGATE_MAX_CONNS_PER_IP=8: %v", err)
	}
	_, err = proxyFlags([]string{"--upstream", "http://127.0.0.1:1", "--max-conns-per-ip", "-1"}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "--max-conns-per-ip -1") {
		t.Fatalf("-1: %v; want an error naming the flag", err)
	}
}

// The binary: with --max-conns-per-ip 3, three idle connections from
// 127.0.0.1 hold the address's places; a fourth is answered 429 and
// closed, and counted in /metrics; once they close, requests pass again.
func TestProxyMaxConnsPerIP(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer up.Close()
	p := startBinary(t, []string{"proxy", "--upstream", up.URL, "--listen", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0",
		"--data", t.TempDir(), "--log-format", "json", "--max-conns-per-ip", "3"}, "proxy", "admin")
	var held []net.Conn
	for range 3 {
		c, err := net.Dial("tcp", p.addrs["proxy"])
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		held = append(held, c)
	}
	// accepted in order: the fourth comes after the three are counted
	c, err := net.Dial("tcp", p.addrs["proxy"])
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(20 * time.Second)) //nolint:errcheck
	b, _ := io.ReadAll(c)
	c.Close()
	if !strings.HasPrefix(string(b), "HTTP/1.1 429 ") || !strings.Contains(string(b), "too many connections") {
		t.Fatalf("the fourth connection read %q; want 429", b)
	}
	_, _, metrics := proxyGet(t, "http://"+p.addrs["admin"]+"/metrics")
	if !strings.Contains(metrics, "floodgate_proxy_connections_refused_total 1\n") {
		t.Fatalf("metrics:\n%s", grepLines(metrics, "connections_refused"))
	}
	for _, c := range held {
		c.Close()
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get("http://" + p.addrs["proxy"] + "/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) { // the closes reach the proxy in their own time
			t.Fatalf("after the held connections closed: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

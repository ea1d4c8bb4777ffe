package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// upstreamCounting is an upstream that counts the connections it accepts.
func upstreamCounting(t *testing.T, h http.HandlerFunc) (*httptest.Server, *atomic.Int64, *h1Transport) {
	t.Helper()
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ConnState = func(c net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	tr := newH1Transport(srv.Listener.Addr().String(), &net.Dialer{Timeout: time.Second}, http.DefaultTransport, 16)
	t.Cleanup(tr.CloseIdle)
	return srv, &conns, tr
}

func roundTrip(t *testing.T, tr http.RoundTripper, method, url string, body io.Reader) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, body)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestH1TransportReusesConnections(t *testing.T) {
	srv, conns, tr := upstreamCounting(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/empty":
			w.WriteHeader(http.StatusNoContent)
		case "/echo":
			io.Copy(w, r.Body)
		default:
			io.WriteString(w, "hello")
		}
	})
	for i := 0; i < 50; i++ {
		if code, body := roundTrip(t, tr, "GET", srv.URL+"/", nil); code != 200 || body != "hello" {
			t.Fatalf("GET: %d %q", code, body)
		}
		if code, _ := roundTrip(t, tr, "HEAD", srv.URL+"/", nil); code != 200 {
			t.Fatalf("HEAD: %d", code)
		}
		if code, _ := roundTrip(t, tr, "GET", srv.URL+"/empty", nil); code != 204 {
			t.Fatalf("204: %d", code)
		}
		if code, body := roundTrip(t, tr, "POST", srv.URL+"/echo", strings.NewReader("body")); code != 200 || body != "body" {
			t.Fatalf("POST: %d %q", code, body)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("%d connections for 200 sequential requests, want 1", n)
	}
}

// Pooled connections the upstream closed while they were idle: requests
// without a body are sent again on a new connection.
func TestH1TransportStaleConnections(t *testing.T) {
	srv, conns, tr := upstreamCounting(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	for i := 0; i < 5; i++ {
		roundTrip(t, tr, "GET", srv.URL, nil)
		srv.CloseClientConnections()
		time.Sleep(10 * time.Millisecond) // let the close arrive
	}
	if code, body := roundTrip(t, tr, "GET", srv.URL, nil); code != 200 || body != "ok" {
		t.Fatalf("after the upstream closed idle connections: %d %q", code, body)
	}
	// A request with a body cannot be sent twice: the connection is
	// checked before it is used.
	srv.CloseClientConnections()
	time.Sleep(10 * time.Millisecond)
	if code, body := roundTrip(t, tr, "POST", srv.URL, io.NopCloser(strings.NewReader("once"))); code != 200 || body != "ok" {
		t.Fatalf("POST after the upstream closed idle connections: %d %q", code, body)
	}
	if conns.Load() < 5 {
		t.Fatalf("%d connections", conns.Load())
	}
}

// A response abandoned half-read does not leave its connection in the pool
// out of step; a "Connection: close" response is not reused.
func TestH1TransportAbandonedAndClosed(t *testing.T) {
	big := strings.Repeat("x", 1<<20)
	srv, conns, tr := upstreamCounting(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/big":
			io.WriteString(w, big)
		case "/close":
			w.Header().Set("Connection", "close")
			io.WriteString(w, "bye")
		default:
			io.WriteString(w, "small")
		}
	})
	req, _ := http.NewRequest("GET", srv.URL+"/big", nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 100)
	io.ReadFull(resp.Body, buf)
	resp.Body.Close()
	if code, body := roundTrip(t, tr, "GET", srv.URL+"/", nil); code != 200 || body != "small" {
		t.Fatalf("after an abandoned body: %d %q", code, body)
	}
	roundTrip(t, tr, "GET", srv.URL+"/close", nil)
	if code, body := roundTrip(t, tr, "GET", srv.URL+"/", nil); code != 200 || body != "small" {
		t.Fatalf("after Connection: close: %d %q", code, body)
	}
	if n := conns.Load(); n != 3 {
		t.Fatalf("%d connections, want 3 (one per closed exchange)", n)
	}
}

// 1xx informational responses are skipped; the final answer is returned.
func TestH1TransportSkipsEarlyHints(t *testing.T) {
	srv, _, tr := upstreamCounting(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</style.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		io.WriteString(w, "final")
	})
	if code, body := roundTrip(t, tr, "GET", srv.URL, nil); code != 200 || body != "final" {
		t.Fatalf("%d %q", code, body)
	}
}

// A client that leaves interrupts the exchange at once.
func TestH1TransportCancel(t *testing.T) {
	release := make(chan struct{})
	srv, _, tr := upstreamCounting(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	defer close(release)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL, nil)
	start := time.Now()
	if _, err := tr.RoundTrip(req); err == nil || time.Since(start) > 5*time.Second {
		t.Fatalf("err %v after %v", err, time.Since(start))
	}
}

func TestH1TransportConcurrent(t *testing.T) {
	srv, conns, tr := upstreamCounting(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, r.URL.Path) })
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 100; i++ {
				path := "/" + strings.Repeat("a", w+1)
				if code, body := roundTrip(t, tr, "GET", srv.URL+path, nil); code != 200 || body != path {
					t.Errorf("%d %q, want %q", code, body, path)
					return
				}
			}
		}()
	}
	wg.Wait()
	if n := conns.Load(); n > 16 {
		t.Fatalf("%d connections for 8 concurrent callers", n)
	}
}

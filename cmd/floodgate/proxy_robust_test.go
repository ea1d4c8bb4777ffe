package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The tests here check how the proxy copes with an upstream or a client
// that stalls or leaves: --upstream-timeout, --client-body-timeout, a
// delayed request whose client goes away, and a refusal decided on the
// header alone. Each timeout under test is lowered to timeoutUnderTest
// (timeouts_test.go) by its flag, and every wait is for a real event: a
// response, the proxy closing a connection (waitServerClose, bounded by
// closeWithin), or a counter or key state the admin API reports.

// silentUpstream accepts connections, reads what comes and never answers.
// It returns its URL and a count of the connections it accepted.
func silentUpstream(t *testing.T) (string, *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns atomic.Int64
	var mu sync.Mutex
	var open []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			mu.Lock()
			open = append(open, c)
			mu.Unlock()
			go io.Copy(io.Discard, c) //nolint:errcheck // until the test ends
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range open {
			c.Close()
		}
	})
	return "http://" + ln.Addr().String(), &conns
}

// An upstream that takes a request and never answers gets the client a
// 504 after --upstream-timeout, counted as an upstream timeout; a GET is
// not tried again (which would double the wait).
func TestProxyUpstreamTimeout(t *testing.T) {
	upURL, conns := silentUpstream(t)
	dir := t.TempDir()
	writeRules(t, dir, "edge.yaml", proxyRules)
	p := startProxy(t, upURL, dir, "--upstream-timeout", timeoutUnderTest.String())
	for i, req := range []string{
		"GET /free HTTP/1.1\r\nHost: x\r\n\r\n",
		"POST /free HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello",
	} {
		start := time.Now()
		conn := dial(t, p.addrs["proxy"])
		conn.SetDeadline(start.Add(closeWithin))
		io.WriteString(conn, req)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("%q: no answer %v after the request (upstream timeout %v): %v", req, time.Since(start), timeoutUnderTest, err)
		}
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusGatewayTimeout || !strings.Contains(string(body), "no response header within") {
			t.Fatalf("%q: %s %q, want 504", req, resp.Status, body)
		}
		if el := time.Since(start); el < closeNotBefore {
			t.Fatalf("504 after %v: before a %v timeout could have fired", el, timeoutUnderTest)
		}
		if n := metricValue(t, p.addrs["admin"], "floodgate_proxy_upstream_timeouts_total"); n != float64(i+1) {
			t.Fatalf("upstream timeouts %v, want %d", n, i+1)
		}
		if n := metricValue(t, p.addrs["admin"], "floodgate_proxy_upstream_errors_total"); n != float64(i+1) {
			t.Fatalf("upstream errors %v, want %d", n, i+1)
		}
	}
	if n := conns.Load(); n != 2 {
		t.Fatalf("the upstream was asked on %d connections, want 2 (one a request, no retry)", n)
	}
}

// --upstream-timeout bounds the wait for the response's header only: a
// response whose header came may take far longer for its body, whether
// fasthttp reads it whole (a known length up to 1 MiB) or streams it
// (chunked), or whether the upstream first sends 100 Continue.
func TestProxyUpstreamTimeoutSparesStreams(t *testing.T) {
	const pause = 3 * timeoutUnderTest // each pause alone outlasts the timeout
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/known" {
			w.Header().Set("Content-Length", "10")
		}
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		for _, part := range []string{"hello", "world"} {
			<-time.After(pause)
			io.WriteString(w, part)
			w.(http.Flusher).Flush()
		}
	}))
	defer up.Close()
	dir := t.TempDir()
	writeRules(t, dir, "edge.yaml", proxyRules)
	p := startProxy(t, up.URL, dir, "--upstream-timeout", timeoutUnderTest.String())
	for _, path := range []string{"/known", "/chunked"} {
		start := time.Now()
		code, _, body := proxyGet(t, "http://"+p.addrs["proxy"]+path)
		if code != 200 || body != "helloworld" {
			t.Fatalf("%s: %d %q after %v, want the whole stream", path, code, body, time.Since(start))
		}
		if el := time.Since(start); el < 2*pause {
			t.Fatalf("%s: answered in %v: the upstream paused for %v", path, el, 2*pause)
		}
	}
	if n := metricValue(t, p.addrs["admin"], "floodgate_proxy_upstream_timeouts_total"); n != 0 {
		t.Fatalf("upstream timeouts %v, want 0", n)
	}
}

// bodySink is an upstream that reads each request's body to its end and
// reports how that went on the channel.
func bodySink(t *testing.T) (string, <-chan error) {
	t.Helper()
	got := make(chan error, 16)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, err := io.Copy(io.Discard, r.Body)
		got <- err
		fmt.Fprintf(w, "read %d", n)
	}))
	t.Cleanup(up.Close)
	return up.URL, got
}

// A client that stalls while it sends its body is cut off after
// --client-body-timeout with 408, both in the first 8 KiB (which the
// server reads before the handler) and in the body streamed on to the
// upstream, whose connection is then given up too; it is counted as the
// client's error, not the upstream's.
func TestProxyClientBodyTimeout(t *testing.T) {
	for _, tc := range []struct {
		name     string
		sent     int  // bytes of the 1 MB body sent before the stall
		upstream bool // whether the upstream got the request (and sees its body fail)
	}{
		{"in the first 8 KiB", 100, false},
		{"streamed", 20 << 10, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			upURL, got := bodySink(t)
			dir := t.TempDir()
			writeRules(t, dir, "edge.yaml", proxyRules)
			p := startProxy(t, upURL, dir, "--client-body-timeout", timeoutUnderTest.String())
			conn := dial(t, p.addrs["proxy"])
			io.WriteString(conn, "POST /free HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n")
			if _, err := conn.Write(bytes.Repeat([]byte("a"), tc.sent)); err != nil {
				t.Fatal(err)
			}
			// The stall: the deadline counts from the last bytes read.
			answer := waitServerClose(t, conn, conn, time.Now())
			if !bytes.HasPrefix(answer, []byte("HTTP/1.1 408 ")) {
				t.Fatalf("answered %q, want 408", answer)
			}
			if tc.upstream {
				select {
				case err := <-got:
					if err == nil {
						t.Fatal("the upstream read the whole body")
					}
				case <-time.After(10 * time.Second):
					t.Fatal("the upstream's connection was not given up")
				}
			}
			if n := metricValue(t, p.addrs["admin"], `floodgate_proxy_client_errors_total{reason="body_timeout"}`); n != 1 {
				t.Fatalf("client body timeouts %v, want 1", n)
			}
			if n := metricValue(t, p.addrs["admin"], "floodgate_proxy_upstream_errors_total"); n != 0 {
				t.Fatalf("upstream errors %v, want 0", n)
			}
		})
	}
}

// --client-body-timeout bounds the wait between two reads, not the whole
// body: a slow body that keeps coming goes through.
func TestProxyClientBodyTimeoutIsIdle(t *testing.T) {
	const timeout = 5 * timeoutUnderTest
	upURL, got := bodySink(t)
	dir := t.TempDir()
	writeRules(t, dir, "edge.yaml", proxyRules)
	p := startProxy(t, upURL, dir, "--client-body-timeout", timeout.String())
	const parts, size = 8, 16 << 10 // 8 parts timeout/4 apart: 2 timeouts in all
	conn := dial(t, p.addrs["proxy"])
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	start := time.Now()
	io.WriteString(conn, "POST /free HTTP/1.1\r\nHost: x\r\nContent-Length: "+strconv.Itoa(parts*size)+"\r\n\r\n")
	tick := time.NewTicker(timeout / 4)
	defer tick.Stop()
	for range parts {
		<-tick.C
		if _, err := conn.Write(bytes.Repeat([]byte("b"), size)); err != nil {
			t.Fatalf("after %v: %v", time.Since(start), err)
		}
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || string(body) != "read "+strconv.Itoa(parts*size) || <-got != nil {
		t.Fatalf("%s %q", resp.Status, body)
	}
	if el := time.Since(start); el < timeout {
		t.Fatalf("the body took %v, less than the timeout %v: the test proves nothing", el, timeout)
	}
}

// A client that goes away in the middle of its body is the client's
// error, not the upstream's: no 502 is counted against the upstream.
func TestProxyClientLeavesMidBody(t *testing.T) {
	upURL, got := bodySink(t)
	dir := t.TempDir()
	writeRules(t, dir, "edge.yaml", proxyRules)
	p := startProxy(t, upURL, dir)
	for i, framing := range []string{"Content-Length: 1000000", "Transfer-Encoding: chunked"} {
		conn := dial(t, p.addrs["proxy"])
		io.WriteString(conn, "POST /free HTTP/1.1\r\nHost: x\r\n"+framing+"\r\n\r\n")
		part := bytes.Repeat([]byte("c"), 20<<10)
		if strings.HasPrefix(framing, "Transfer") {
			part = append([]byte(strconv.FormatInt(int64(len(part)), 16)+"\r\n"), append(part, "\r\n"...)...)
		}
		conn.Write(part)
		select {
		case <-got: // the upstream has the request and part of its body
			t.Fatalf("%s: the upstream's read ended before the client left", framing)
		default:
		}
		conn.Close()
		select {
		case err := <-got:
			if err == nil {
				t.Fatalf("%s: the upstream read a whole body", framing)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: the upstream's request did not end when the client left", framing)
		}
		waitFor(t, "the client's error to be counted", func() bool {
			return metricValue(t, p.addrs["admin"], `floodgate_proxy_client_errors_total{reason="body_aborted"}`) == float64(i+1)
		})
		if n := metricValue(t, p.addrs["admin"], "floodgate_proxy_upstream_errors_total"); n != 0 {
			t.Fatalf("%s: upstream errors %v, want 0", framing, n)
		}
	}
}

// delayRules delays /slow/ requests: one a minute per address, queued up
// to a minute: with one passed, the next waits about a minute, and a
// third (two minutes) is refused.
const delayRules = `domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 1, algorithm: token_bucket}
http:
  - name: slow
    match: {path_prefix: /slow/}
    key: [remote_address]
    action: delay
    max_delay: 1m
`

// inspectRetry asks the proxy's admin API when 127.0.0.1's /slow/ limit
// frees its next slot.
func inspectRetry(t *testing.T, admin string) time.Duration {
	t.Helper()
	resp, err := http.Post("http://"+admin+"/v1/keys/inspect", "application/json",
		strings.NewReader(`{"domain":"edge","entries":[{"key":"remote_address","value":"127.0.0.1"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		RetryAfter string `json:"retry_after"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != 200 {
		t.Fatalf("inspect: %s %v", resp.Status, err)
	}
	d, err := time.ParseDuration(out.RetryAfter)
	if err != nil {
		t.Fatalf("inspect: retry_after %q: %v", out.RetryAfter, err)
	}
	return d
}

// A client that leaves while its request is delayed gives its slot back,
// and its request is not forwarded, as httplimit does through the request
// context: the proxy watches the connection during the delay.
func TestProxyDelayClientGone(t *testing.T) {
	var hits atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		io.WriteString(w, "ok")
	}))
	defer up.Close()
	dir := t.TempDir()
	writeRules(t, dir, "edge.yaml", delayRules)
	p := startProxy(t, up.URL, dir)
	if code, _, _ := proxyGet(t, "http://"+p.addrs["proxy"]+"/slow/first"); code != 200 {
		t.Fatalf("first: %d", code)
	}
	free := inspectRetry(t, p.addrs["admin"]) // about a minute: the first's slot
	conn := dial(t, p.addrs["proxy"])
	io.WriteString(conn, "GET /slow/second HTTP/1.1\r\nHost: x\r\n\r\n")
	// The second request reserves the next slot, and waits for it.
	waitFor(t, "the delayed request's reservation", func() bool { return inspectRetry(t, p.addrs["admin"]) > free+20*time.Second })
	conn.Close()
	// The client is gone: the slot comes back.
	waitFor(t, "the slot given back", func() bool { return inspectRetry(t, p.addrs["admin"]) <= free })
	waitFor(t, "the abandoned delay counted", func() bool {
		return metricValue(t, p.addrs["admin"], `floodgate_proxy_client_errors_total{reason="gone_while_delayed"}`) == 1
	})
	if n := metricValue(t, p.addrs["admin"], `floodgate_proxy_requests_total{outcome="error"}`); n != 1 {
		t.Fatalf("requests counted as errors %v, want 1", n)
	}
	if n := hits.Load(); n != 1 {
		t.Fatalf("the upstream got %d requests, want 1: the abandoned one was forwarded", n)
	}
}

// While the proxy watches a delayed request's connection, what the client
// sends meanwhile (here a pipelined request with a body, itself delayed in
// turn) is kept for the server, and every request is answered in order.
func TestProxyDelayKeepsPipelined(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		io.WriteString(w, r.URL.Path+" "+string(b))
	}))
	defer up.Close()
	dir := t.TempDir()
	// one a second: the second request waits a second, the third two
	writeRules(t, dir, "edge.yaml", strings.NewReplacer("unit: minute", "unit: second", "max_delay: 1m", "max_delay: 10s").Replace(delayRules))
	p := startProxy(t, up.URL, dir)
	conn := dial(t, p.addrs["proxy"])
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReader(conn)
	read := func(want string) {
		t.Helper()
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("waiting for %q: %v", want, err)
		}
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || string(b) != want {
			t.Fatalf("%s %q, want 200 %q", resp.Status, b, want)
		}
	}
	io.WriteString(conn, "GET /slow/1 HTTP/1.1\r\nHost: x\r\n\r\n")
	read("/slow/1 ")
	free := inspectRetry(t, p.addrs["admin"])
	io.WriteString(conn, "GET /slow/2 HTTP/1.1\r\nHost: x\r\n\r\n")
	// The second request waits for its slot; the proxy watches the
	// connection, and reads what comes now.
	waitFor(t, "the delayed request's reservation", func() bool { return inspectRetry(t, p.addrs["admin"]) > free+500*time.Millisecond })
	io.WriteString(conn, "POST /slow/3 HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nbody")
	read("/slow/2 ")
	read("/slow/3 body")
	if n := metricValue(t, p.addrs["admin"], `floodgate_proxy_requests_total{outcome="delayed"}`); n != 2 {
		t.Fatalf("delayed %v, want 2", n)
	}
}

// An over-limit request is refused on its header: its body is not waited
// for (fasthttp would read its first 8 KiB before the handler), it gets no
// 100 Continue, and the connection closes after the refusal, the body
// unread. An allowed request still gets its 100 Continue.
func TestProxyRefusesOnHeader(t *testing.T) {
	var hits atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		b, _ := io.ReadAll(r.Body)
		io.WriteString(w, "got "+string(b))
	}))
	defer up.Close()
	dir := t.TempDir()
	writeRules(t, dir, "edge.yaml", proxyRules)
	p := startProxy(t, up.URL, dir)
	for range 5 {
		proxyGet(t, "http://"+p.addrs["proxy"]+"/limited/")
	}
	for name, head := range map[string]string{
		"expect 100-continue": "POST /limited/ HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\nExpect: 100-continue\r\n\r\n",
		"known length":        "POST /limited/ HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n",
		"chunked":             "POST /limited/ HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
		"chunked, expect":     "POST /limited/ HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n",
	} {
		t.Run(name, func(t *testing.T) {
			conn := dial(t, p.addrs["proxy"])
			io.WriteString(conn, head) // and not a byte of the body
			conn.SetReadDeadline(time.Now().Add(closeWithin))
			br := bufio.NewReader(conn)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("no answer to the header alone: %v", err)
			}
			io.Copy(io.Discard, resp.Body)
			if resp.StatusCode != http.StatusTooManyRequests {
				t.Fatalf("%s first, want 429 (and no 100 Continue)", resp.Status)
			}
			if rest, err := io.ReadAll(br); err != nil || len(rest) > 0 {
				t.Fatalf("after the refusal: %q %v, want the connection closed", rest, err)
			}
		})
	}
	if n := hits.Load(); n != 5 {
		t.Fatalf("the upstream got %d requests, want the 5 allowed", n)
	}

	// Allowed: 100 Continue, then the body goes to the upstream.
	conn := dial(t, p.addrs["proxy"])
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(conn, "POST /free HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
	br := bufio.NewReader(conn)
	if line, err := br.ReadString('\n'); err != nil || line != "HTTP/1.1 100 Continue\r\n" {
		t.Fatalf("allowed: %q %v, want 100 Continue", line, err)
	}
	if line, _ := br.ReadString('\n'); line != "\r\n" {
		t.Fatalf("after 100 Continue: %q", line)
	}
	io.WriteString(conn, "hello")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || string(b) != "got hello" {
		t.Fatalf("allowed: %s %q", resp.Status, b)
	}
}

// The new flags read FLOODGATE_* and refuse what does not parse or is
// negative.
func TestProxyTimeoutFlags(t *testing.T) {
	t.Setenv("FLOODGATE_UPSTREAM_TIMEOUT", "7s")
	t.Setenv("FLOODGATE_CLIENT_BODY_TIMEOUT", "0")
	c, err := proxyFlags([]string{"--upstream", "http://127.0.0.1:1"}, io.Discard)
	if err != nil || c.upstreamTimeout != 7*time.Second || c.bodyTimeout != 0 {
		t.Fatalf("%+v %v", c, err)
	}
	t.Setenv("FLOODGATE_UPSTREAM_TIMEOUT", "soon")
	if _, err := proxyFlags([]string{"--upstream", "http://127.0.0.1:1"}, io.Discard); err == nil {
		t.Fatal("FLOODGATE_UPSTREAM_TIMEOUT=soon accepted")
	}
	t.Setenv("FLOODGATE_UPSTREAM_TIMEOUT", "1s")
	for _, bad := range []string{"--upstream-timeout=-1s", "--client-body-timeout=-1s"} {
		if _, err := proxyFlags([]string{"--upstream", "http://127.0.0.1:1", bad}, io.Discard); err == nil {
			t.Fatalf("%s accepted", bad)
		}
	}
}

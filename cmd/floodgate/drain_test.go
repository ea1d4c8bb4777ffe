package main

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// A client still sending a request body when SIGTERM comes is not waited
// for: its read is cut, it gets 400, and the process exits at once rather
// than at the drain timeout (60s here, far longer than the test).
func TestServeSIGTERMCutsSlowBodies(t *testing.T) {
	dir := t.TempDir()
	writeRules(t, dir, "api.yaml", apiRules)
	s := startServerNoClient(t, "--rules", dir, "--data", t.TempDir(), "--drain-timeout", "60s")
	for _, addr := range []string{s.http, s.admin} {
		path := map[bool]string{true: "/json", false: "/v1/keys/inspect"}[addr == s.http]
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		// headers and a little of a body of 100,000 bytes; the rest never comes
		if _, err := c.Write([]byte("POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{\"domain\":")); err != nil {
			t.Fatal(err)
		}
		defer func() {
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			line, err := bufio.NewReader(c).ReadString('\n')
			// 400 once its handler read was cut; a connection not yet
			// served when the drain began is closed instead
			if (err != nil && line != "") || (err == nil && !strings.Contains(line, " 400 ")) {
				t.Errorf("%s: the slow client got %q, %v; want 400", path, line, err)
			}
		}()
	}
	// Usually both requests are in their handlers by now; if not, their
	// connections close at once. Either way the exit must not wait. The
	// cut itself is tested deterministically by TestBodyCutter.
	time.Sleep(100 * time.Millisecond)
	start := time.Now()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.done:
		if el := time.Since(start); el > 20*time.Second {
			t.Fatalf("exited %s after SIGTERM", el)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("still running 30s after SIGTERM with slow bodies open (drain timeout 60s)\n%s", s.logs())
	}
}

// cut ends a body read in progress (the handler's read fails and it
// answers 400) and any started after it; a request whose body was read is
// untouched.
func TestBodyCutter(t *testing.T) {
	var c bodyCutter
	reading := make(chan struct{}, 2)
	srv := httptest.NewServer(c.wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reading <- struct{}{}
		if _, err := io.ReadAll(r.Body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		io.WriteString(w, "read")
	})))
	defer srv.Close()
	// a whole body is read and answered
	resp, err := http.Post(srv.URL, "text/plain", strings.NewReader("all of it"))
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("a whole body: %v %v", resp, err)
	}
	resp.Body.Close()
	<-reading
	slow := func() net.Conn {
		conn, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		conn.Write([]byte("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nab"))
		return conn
	}
	status := func(conn net.Conn) string {
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		line, _ := bufio.NewReader(conn).ReadString('\n')
		return line
	}
	before := slow()
	defer before.Close()
	<-reading // its handler is reading the body
	c.cut()
	if got := status(before); !strings.Contains(got, " 400 ") {
		t.Fatalf("a body read in progress at the cut: %q, want 400", got)
	}
	after := slow()
	defer after.Close()
	if got := status(after); !strings.Contains(got, " 400 ") {
		t.Fatalf("a body read begun after the cut: %q, want 400", got)
	}
}

// --shadow-mode (FLOODGATE_SHADOW_MODE) reaches the service: a limit of 0
// refuses nothing.
func TestServeShadowModeFlag(t *testing.T) {
	dir := t.TempDir()
	writeRules(t, dir, "api.yaml", "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 0}\n")
	s := startServer(t, "--rules", dir, "--data", t.TempDir(), "--shadow-mode")
	if r := s.ask(t, "api", desc("user", "u")); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("--shadow-mode: %v, want OK", r.OverallCode)
	}
}

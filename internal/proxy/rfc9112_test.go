package proxy

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/gate"
)

// The tests here send exact bytes to a proxy (with a gate that limits
// nothing) in front of an upstream that records what reaches it, and
// check what RFC 9112 asks of the proxy.

// upstreamLog is what a recording upstream received.
type upstreamLog struct {
	mu   sync.Mutex
	reqs []*http.Request
}

func (u *upstreamLog) all() []*http.Request {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]*http.Request(nil), u.reqs...)
}

// startProxy starts a proxy to a recording upstream; it returns the
// proxy's address and the upstream's log.
func startProxy(t *testing.T) (string, *upstreamLog) {
	t.Helper()
	log := &upstreamLog{}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body) //nolint:errcheck
		log.mu.Lock()
		log.reqs = append(log.reqs, r.Clone(context.Background()))
		log.mu.Unlock()
		io.WriteString(w, "ok")
	}))
	t.Cleanup(up.Close)
	u, _ := url.Parse(up.URL)
	p, err := New(Config{Upstream: u})
	if err != nil {
		t.Fatal(err)
	}
	g, err := gate.New(gate.Config{Clock: Clock(clock.Coarse)})
	if err != nil {
		t.Fatal(err)
	}
	p.SetGate(g)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.Serve(l) //nolint:errcheck // ends with Shutdown
	}()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		p.Shutdown(ctx) //nolint:errcheck
		<-done
		g.Close()
	})
	return l.Addr().String(), log
}

// exchange sends raw on a new connection and reads one response; closed
// reports whether the proxy then closed the connection, open whether it
// answered a second request on it (GET /again). Every wait is for an event
// (a response, the connection's end); 10 s bounds a proxy that never
// answers.
func exchange(t *testing.T, addr, raw string) (resp *http.Response, body string, closed bool) {
	t.Helper()
	c, br := send(t, addr, raw)
	defer c.Close()
	resp, body = readResponse(t, br, raw)
	_, err := br.ReadByte()
	return resp, body, err == io.EOF
}

// keptOpen sends raw, reads its response, then asks GET /again on the
// same connection and reports whether it was answered.
func keptOpen(t *testing.T, addr, raw string) bool {
	t.Helper()
	c, br := send(t, addr, raw)
	defer c.Close()
	readResponse(t, br, raw)
	if _, err := io.WriteString(c, "GET /again HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		return false
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == 200
}

func send(t *testing.T, addr, raw string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second)) //nolint:errcheck
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	return c, bufio.NewReader(c)
}

func readResponse(t *testing.T, br *bufio.Reader, raw string) (*http.Response, string) {
	t.Helper()
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("%q: no response: %v", raw, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

// A version other than HTTP/1.0 and HTTP/1.1 gets 505 and never reaches
// the upstream (fasthttp takes any HTTP/d.d).
func TestRefusesUnknownVersion(t *testing.T) {
	addr, up := startProxy(t)
	for _, v := range []string{"HTTP/9.9", "HTTP/2.0", "HTTP/1.2", "HTTP/0.9"} {
		resp, body, closed := exchange(t, addr, "GET /v HTTP/"+strings.TrimPrefix(v, "HTTP/")+"\r\nHost: x\r\n\r\n")
		if resp.StatusCode != http.StatusHTTPVersionNotSupported || !closed {
			t.Errorf("%s: %s %q (closed %v), want 505 and the connection closed", v, resp.Status, body, closed)
		}
	}
	if n := len(up.all()); n != 0 {
		t.Fatalf("the upstream got %d requests, want none", n)
	}
	// HTTP/1.0 and HTTP/1.1 pass.
	if resp, body, _ := exchange(t, addr, "GET /v HTTP/1.0\r\nHost: x\r\n\r\n"); resp.StatusCode != 200 || body != "ok" {
		t.Errorf("HTTP/1.0: %s %q", resp.Status, body)
	}
	if !keptOpen(t, addr, "GET /v HTTP/1.1\r\nHost: x\r\n\r\n") {
		t.Error("HTTP/1.1: not answered, or the connection closed")
	}
}

// A header with a line ending in a bare LF (RFC 9112, 2.2) is refused
// with 400 and the connection closed: a server in front of the proxy may
// read the lines otherwise.
func TestRefusesBareLF(t *testing.T) {
	addr, up := startProxy(t)
	for name, raw := range map[string]string{
		"every line":        "GET /lf HTTP/1.1\nHost: x\n\n",
		"request line":      "GET /lf HTTP/1.1\nHost: x\r\n\r\n",
		"one header line":   "GET /lf HTTP/1.1\r\nHost: x\nX-A: 1\r\n\r\n",
		"the blank line":    "GET /lf HTTP/1.1\r\nHost: x\r\n\n",
		"http/1.0 no field": "GET /lf HTTP/1.0\n\n",
		// read with the request before it (fasthttp's read-ahead): its
		// raw header lines tell
		"pipelined": "GET /ok HTTP/1.1\r\nHost: x\r\n\r\nGET /lf HTTP/1.1\r\nHost: x\nX-A: 1\r\n\r\n",
	} {
		c, br := send(t, addr, raw)
		if strings.HasPrefix(raw, "GET /ok") {
			if resp, _ := readResponse(t, br, raw); resp.StatusCode != 200 {
				t.Errorf("%s: the first request: %s", name, resp.Status)
			}
		}
		resp, body := readResponse(t, br, raw)
		_, err := br.ReadByte()
		closed := err == io.EOF
		c.Close()
		if resp.StatusCode != http.StatusBadRequest || !closed {
			t.Errorf("%s: %s %q (closed %v), want 400 and the connection closed", name, resp.Status, body, closed)
		}
	}
	if reqs := up.all(); len(reqs) != 1 || reqs[0].URL.Path != "/ok" {
		t.Fatalf("the upstream got %d requests, want GET /ok alone", len(reqs))
	}
	// A bare LF in a body is the body's business, and the connection
	// goes on.
	if !keptOpen(t, addr, "POST /lf HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\na\n\nbc") {
		t.Fatal("a body with bare LFs: not answered, or the connection closed")
	}
	if reqs := up.all(); len(reqs) != 3 || reqs[1].URL.Path != "/lf" {
		t.Fatalf("the upstream got %d requests, want GET /ok, POST /lf and GET /again", len(reqs))
	}
}

// CONNECT is not forwarded: the proxy is no tunnel.
func TestRefusesConnect(t *testing.T) {
	addr, up := startProxy(t)
	resp, body, closed := exchange(t, addr, "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n")
	if resp.StatusCode != http.StatusNotImplemented || !closed {
		t.Fatalf("%s %q (closed %v), want 501 and the connection closed", resp.Status, body, closed)
	}
	if n := len(up.all()); n != 0 {
		t.Fatalf("the upstream got %d requests, want none", n)
	}
}

// "close" among a Connection field's tokens, in any case and on any of
// its lines, closes the client's connection after the response; the
// headers the field names go, with the hop-by-hop ones.
func TestConnectionCloseAmongTokens(t *testing.T) {
	addr, up := startProxy(t)
	for i, conn := range []string{
		"Connection: close, X-Foo\r\n",
		"Connection: X-Foo, CLOSE\r\n",
		"Connection: X-Foo\r\nConnection: Close\r\n",
		"Connection: x-foo , close \r\n",
	} {
		resp, body, closed := exchange(t, addr, "GET /c HTTP/1.1\r\nHost: x\r\n"+conn+"X-Foo: secret\r\nKeep-Alive: timeout=5\r\nTE: trailers\r\nX-Keep: 1\r\n\r\n")
		if resp.StatusCode != 200 || body != "ok" || !closed {
			t.Errorf("%q: %s %q (closed %v), want 200 and the connection closed", conn, resp.Status, body, closed)
			continue
		}
		reqs := up.all()
		if len(reqs) != i+1 {
			t.Fatalf("%q: the upstream got %d requests, want %d", conn, len(reqs), i+1)
		}
		h := reqs[i].Header
		if h.Get("X-Foo") != "" || h.Get("Keep-Alive") != "" || h.Get("Te") != "" || h.Get("X-Keep") != "1" {
			t.Errorf("%q: the upstream got %v", conn, h)
		}
	}
	// Without close, the connection stays open.
	if !keptOpen(t, addr, "GET /c HTTP/1.1\r\nHost: x\r\nConnection: X-Foo\r\nX-Foo: 1\r\n\r\n") {
		t.Fatal("Connection: X-Foo closed the connection")
	}
}

// scanHeader finds a bare LF, and the header's end, however the header is
// cut into reads (a CR at the end of one, its LF at the start of the
// next), and reads nothing of a body.
func TestScanHeaderAcrossReads(t *testing.T) {
	for _, tc := range []struct {
		raw    string
		bareLF bool
	}{
		{"GET / HTTP/1.1\r\nHost: x\r\n\r\nbody\n\nmore\n", false},
		{"GET / HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n\r\n", false},
		{"GET / HTTP/1.1\nHost: x\r\n\r\n", true},
		{"GET / HTTP/1.1\r\nHost: x\n\r\n", true},
		{"GET / HTTP/1.1\r\nHost: x\r\n\n", true},
		{"GET / HTTP/1.1\r\n\nHost: x\r\n\r\n", true},
	} {
		for cut := 1; cut <= len(tc.raw); cut++ {
			c := &peerConn{header: headerAwaited}
			for b := []byte(tc.raw); len(b) > 0; {
				n := min(cut, len(b))
				c.scanHeader(b[:n])
				b = b[n:]
			}
			if c.bareLF != tc.bareLF || !tc.bareLF && c.header != headerRead {
				t.Fatalf("%q in reads of %d: bare LF %v, header state %d", tc.raw, cut, c.bareLF, c.header)
			}
		}
	}
}

package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// The tests here check serve's slow-client timeouts (httpTimeouts) over
// real TCP connections. Each lowers the timeout it checks to timeoutUnderTest
// and sets the other two to timeoutLong, so that only the timeout under test
// can end the connection in time: net/http falls back to ReadTimeout for a
// zero ReadHeaderTimeout or IdleTimeout, and a test that left ReadTimeout
// short would pass without the timeout it means to check.
//
// serve runs in this process (the binary the other end-to-end tests start
// has the production values built in). Every wait is for the server to
// close the connection, bounded by a read deadline of closeWithin; a close
// that comes sooner than closeNotBefore is an error too.
const (
	timeoutUnderTest = 200 * time.Millisecond
	timeoutLong      = time.Minute
	closeWithin      = 10 * timeoutUnderTest // room for a loaded machine under -race
	closeNotBefore   = timeoutUnderTest / 2  // the timeouts run from before the test's clock starts
)

// startServeWithTimeouts runs serve in this process, its HTTP and admin
// listeners built with to, and returns their addresses (by API: "http",
// "admin"). The server stops, and httpTimeouts is restored, when the test
// ends.
func startServeWithTimeouts(t *testing.T, to serverTimeouts) map[string]string {
	t.Helper()
	prev := httpTimeouts
	httpTimeouts = to // before serve's goroutine starts: no race
	// Cleanups run last-registered first: this one runs after serve has
	// returned.
	t.Cleanup(func() { httpTimeouts = prev })

	logs := &listenWatcher{addrs: make(chan [2]string, 3)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	args := []string{"--data", t.TempDir(), "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
		"--admin-addr", "127.0.0.1:0", "--log-format", "json", "--reload-interval", "0", "--drain-timeout", "5s"}
	go func() { done <- serve(ctx, args, io.Discard, logs) }()
	t.Cleanup(func() {
		cancel()
		select {
		case code := <-done:
			if code != 0 {
				t.Errorf("serve exited %d\n%s", code, logs.String())
			}
		case <-time.After(20 * time.Second):
			t.Errorf("serve did not stop\n%s", logs.String())
		}
	})

	addrs := map[string]string{}
	timeout := time.After(30 * time.Second)
	for len(addrs) < 3 { // grpc, http, admin
		select {
		case a := <-logs.addrs:
			addrs[a[0]] = a[1]
		case code := <-done:
			done <- code // for the cleanup
			t.Fatalf("serve exited %d before listening\n%s", code, logs.String())
		case <-timeout:
			t.Fatalf("serve did not listen in time\n%s", logs.String())
		}
	}
	return addrs
}

// listenWatcher takes serve's JSON log and reports each "listening"
// record's API and address.
type listenWatcher struct {
	mu      sync.Mutex
	all     bytes.Buffer
	partial []byte
	addrs   chan [2]string
}

func (w *listenWatcher) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.all.Write(p)
	w.partial = append(w.partial, p...)
	for {
		i := bytes.IndexByte(w.partial, '\n')
		if i < 0 {
			break
		}
		var m struct{ Msg, API, Addr string }
		if json.Unmarshal(w.partial[:i], &m) == nil && m.Msg == "listening" {
			select {
			case w.addrs <- [2]string{m.API, m.Addr}:
			default:
			}
		}
		w.partial = w.partial[i+1:]
	}
	return len(p), nil
}

func (w *listenWatcher) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.all.String()
}

// dial connects to addr over TCP and closes the connection when the test
// ends.
func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// waitServerClose reads r (over conn) until the server closes the
// connection, and returns what it read and how long after start the close
// came. It fails the test if the connection is still open closeWithin
// after start, or if the close came before closeNotBefore. A reset counts
// as a close: a server that closes with unread data in its socket resets.
func waitServerClose(t *testing.T, conn net.Conn, r io.Reader, start time.Time) []byte {
	t.Helper()
	conn.SetReadDeadline(start.Add(closeWithin))
	got, err := io.ReadAll(r) // nil error at EOF
	elapsed := time.Since(start)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("the server had not closed the connection %v after the request began (timeout %v); read %q", elapsed, timeoutUnderTest, got)
	}
	if err != nil && !errors.Is(err, net.ErrClosed) && !isReset(err) {
		t.Fatalf("reading until the server closes: %v", err)
	}
	if elapsed < closeNotBefore {
		t.Fatalf("the server closed the connection %v after the request began: before a %v timeout could have fired; read %q", elapsed, timeoutUnderTest, got)
	}
	t.Logf("closed by the server after %v (timeout %v)", elapsed, timeoutUnderTest)
	return got
}

func isReset(err error) bool {
	var se *os.SyscallError
	return errors.As(err, &se) && (strings.Contains(se.Err.Error(), "reset") || strings.Contains(se.Err.Error(), "broken pipe"))
}

// notOK fails the test if got holds an HTTP response with a 2xx status.
func notOK(t *testing.T, got []byte) {
	t.Helper()
	if len(got) == 0 {
		return
	}
	resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(got)), nil)
	if err != nil {
		t.Fatalf("the server sent %q, not an HTTP response: %v", got, err)
	}
	if resp.StatusCode/100 == 2 {
		t.Fatalf("the server answered %s to an incomplete request: %q", resp.Status, got)
	}
	t.Logf("answered %s before closing", resp.Status)
}

// The production values are all set: with none, net/http waits on a client
// forever; ReadHeaderTimeout and IdleTimeout fall back to ReadTimeout when
// zero, which the tests below could not tell apart.
func TestServeTimeoutsSet(t *testing.T) {
	to := httpTimeouts
	if to.readHeader <= 0 || to.read <= 0 || to.idle <= 0 {
		t.Fatalf("httpTimeouts %+v: each must be more than 0", to)
	}
	if to.readHeader > to.read {
		t.Fatalf("httpTimeouts %+v: the headers' timeout is beyond the whole request's", to)
	}
}

// listeners are serve's HTTP listeners, by API: each is built with
// httpTimeouts. For each, a path to GET and one that reads a POST body.
var listeners = []struct{ api, get, post string }{
	{"http", "/healthz", "/json"},
	{"admin", "/v1/rules", "/v1/keys/inspect"},
}

// A client that sends part of its request line and headers and then stalls
// is cut off after ReadHeaderTimeout.
func TestServeReadHeaderTimeout(t *testing.T) {
	addrs := startServeWithTimeouts(t, serverTimeouts{readHeader: timeoutUnderTest, read: timeoutLong, idle: timeoutLong})
	for _, l := range listeners {
		t.Run(l.api, func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			conn := dial(t, addrs[l.api])
			if _, err := io.WriteString(conn, "GET "+l.get+" HTTP/1.1\r\nHost: floodgate\r\nUser-Ag"); err != nil {
				t.Fatal(err)
			}
			notOK(t, waitServerClose(t, conn, conn, start))
		})
	}
}

// A client that sends a POST's headers promising a 1000-byte body, then
// trickles it a byte at a time, is cut off after ReadTimeout: the timeout
// counts from the request's start, and each byte does not renew it. The
// handler sees its body read fail; the client sees the connection close,
// after at most an error response.
func TestServeReadTimeoutSlowBody(t *testing.T) {
	addrs := startServeWithTimeouts(t, serverTimeouts{readHeader: timeoutLong, read: timeoutUnderTest, idle: timeoutLong})
	for _, l := range listeners {
		t.Run(l.api, func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			conn := dial(t, addrs[l.api])
			if _, err := io.WriteString(conn, "POST "+l.post+" HTTP/1.1\r\nHost: floodgate\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"); err != nil {
				t.Fatal(err)
			}
			stop := make(chan struct{})
			trickled := make(chan struct{})
			go func() { // at most closeWithin/20ms bytes: far fewer than 1000
				defer close(trickled)
				tick := time.NewTicker(20 * time.Millisecond)
				defer tick.Stop()
				for {
					select {
					case <-stop:
						return
					case <-tick.C:
						conn.SetWriteDeadline(time.Now().Add(time.Second))
						if _, err := conn.Write([]byte(" ")); err != nil {
							return // the server has closed
						}
					}
				}
			}()
			got := waitServerClose(t, conn, conn, start)
			close(stop)
			<-trickled
			notOK(t, got)
		})
	}
}

// A keep-alive connection left idle after a complete request and response
// is closed after IdleTimeout.
func TestServeIdleTimeout(t *testing.T) {
	addrs := startServeWithTimeouts(t, serverTimeouts{readHeader: timeoutLong, read: timeoutLong, idle: timeoutUnderTest})
	for _, l := range listeners {
		t.Run(l.api, func(t *testing.T) {
			t.Parallel()
			conn := dial(t, addrs[l.api])
			start := time.Now() // the idle time starts after the response is written, so after this
			if _, err := io.WriteString(conn, "GET "+l.get+" HTTP/1.1\r\nHost: floodgate\r\n\r\n"); err != nil {
				t.Fatal(err)
			}
			conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			br := bufio.NewReader(conn)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusOK || resp.Close {
				t.Fatalf("GET %s: %s, close %v, %v: %s", l.get, resp.Status, resp.Close, err, body)
			}
			if got := waitServerClose(t, conn, br, start); len(got) > 0 {
				t.Fatalf("the idle connection got %q", got)
			}
		})
	}
}

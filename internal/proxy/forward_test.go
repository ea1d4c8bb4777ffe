package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/gate"
)

// A body of known length streams: each piece the client sends reaches the
// upstream before the client sends the next (fasthttp 1.78 kept the tail
// of each read in its write buffer until the next read).
func TestStreamsKnownLengthPieceByPiece(t *testing.T) {
	const pieces, size = 4, 9000 // each past the 8 KiB fasthttp reads before the handler runs
	got := make(chan int, pieces)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		buf := make([]byte, size)
		for range pieces {
			if _, err := io.ReadFull(r.Body, buf); err != nil {
				http.Error(w, err.Error(), 500)
				return
			}
			got <- len(buf)
		}
		io.WriteString(w, "whole")
	}))
	defer up.Close()
	u, _ := url.Parse(up.URL)
	p, err := New(Config{Upstream: u})
	if err != nil {
		t.Fatal(err)
	}
	g, err := gate.New(gate.Config{Clock: Clock(clock.Coarse)})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	p.SetGate(g)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go p.Serve(l) //nolint:errcheck // ends with Shutdown
	defer p.Shutdown(t.Context())

	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second)) //nolint:errcheck
	io.WriteString(c, "PUT /up HTTP/1.1\r\nHost: x\r\nContent-Length: "+strconv.Itoa(pieces*size)+"\r\n\r\n")
	for i := range pieces {
		io.WriteString(c, strings.Repeat(string(rune('a'+i)), size))
		select {
		case <-got:
		case <-time.After(10 * time.Second):
			t.Fatalf("piece %d did not reach the upstream before the next was sent", i)
		}
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || string(b) != "whole" {
		t.Fatalf("%s %q", resp.Status, b)
	}
}

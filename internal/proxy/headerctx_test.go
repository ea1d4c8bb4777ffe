package proxy

import (
	"bufio"
	"io"
	"net"
	"reflect"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/valyala/fasthttp"
)

// The gate runs in the server's HeaderReceived hook only where fasthttp
// hands it the header of the handler's RequestCtx; this fasthttp does.
func TestHeaderCtx(t *testing.T) {
	if !headerCtxWorks() {
		t.Fatal("HeaderReceived's header is not its RequestCtx's: the gate would wait for the first 8 KiB of each body")
	}
}

// ctxOfHeader's arithmetic holds only while a RequestCtx holds its Request,
// and a Request its Header, by value: the day fasthttp makes either a
// pointer (or moves the header elsewhere), this fails, before any probe.
func TestHeaderCtxLayout(t *testing.T) {
	req, ok := reflect.TypeFor[fasthttp.RequestCtx]().FieldByName("Request")
	if !ok || req.Type != reflect.TypeFor[fasthttp.Request]() || len(req.Index) != 1 {
		t.Fatalf("fasthttp.RequestCtx.Request: %+v, want a field of type fasthttp.Request", req)
	}
	hdr, ok := reflect.TypeFor[fasthttp.Request]().FieldByName("Header")
	if !ok || hdr.Type != reflect.TypeFor[fasthttp.RequestHeader]() || len(hdr.Index) != 1 {
		t.Fatalf("fasthttp.Request.Header: %+v, want a field of type fasthttp.RequestHeader", hdr)
	}
	if got := req.Offset + hdr.Offset; got != headerCtxOffset {
		t.Fatalf("the header is at %d in a RequestCtx, headerCtxOffset says %d", got, headerCtxOffset)
	}
}

// On a real connection, each of several pipelined requests' hook sees
// the RequestCtx its handler then gets, with the connection and the URI.
func TestHeaderCtxPipelined(t *testing.T) {
	type seen struct {
		ctx  uintptr
		conn net.Conn
		uri  string
	}
	hooked := make(chan seen, 3)
	handled := make(chan uintptr, 3)
	s := &fasthttp.Server{
		HeaderReceived: func(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
			ctx := ctxOfHeader(h)
			hooked <- seen{uintptr(unsafe.Pointer(ctx)), ctx.Conn(), string(ctx.RequestURI())}
			return fasthttp.RequestConfig{}
		},
		Handler: func(ctx *fasthttp.RequestCtx) { handled <- uintptr(unsafe.Pointer(ctx)) },
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(l) //nolint:errcheck // ends with Shutdown
	defer s.Shutdown()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second)) //nolint:errcheck
	io.WriteString(c, strings.Repeat("GET /a HTTP/1.1\r\nHost: x\r\n\r\n", 2)+"GET /b HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	io.Copy(io.Discard, bufio.NewReader(c)) //nolint:errcheck
	for i, want := range []string{"/a", "/a", "/b"} {
		h, got := <-hooked, <-handled
		if h.ctx != got || h.uri != want || h.conn == nil || h.conn.RemoteAddr().String() != c.LocalAddr().String() {
			t.Fatalf("request %d: the hook saw ctx %#x (%s, conn from %v), the handler got %#x", i, h.ctx, h.uri, h.conn.RemoteAddr(), got)
		}
	}
}

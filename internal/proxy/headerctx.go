package proxy

import (
	"io"
	"log/slog"
	"net"
	"sync"
	"time"
	"unsafe"

	"github.com/valyala/fasthttp"
)

// headerCtxOffset is where a RequestCtx holds its request's header.
//
// This is the proxy's one reach into fasthttp's insides: its
// HeaderReceived hook is given the header alone (still so in 1.78), and
// fasthttp has no public way from it to the request's connection and
// URI, which the gate needs before the body is read. It is checked three
// ways: a field renamed fails the build; TestHeaderCtxLayout fails the day
// a RequestCtx stops holding its Request, or a Request its Header, by
// value; and headerCtxWorks probes it at start, the gate then moving to
// the handler where it fails.
var headerCtxOffset = unsafe.Offsetof((*fasthttp.RequestCtx)(nil).Request) + unsafe.Offsetof((*fasthttp.Request)(nil).Header)

// ctxOfHeader returns the RequestCtx whose request's header h is: the
// server's HeaderReceived hook is given &ctx.Request.Header, and the gate
// needs the rest of ctx (the connection, the URI). Only for the hook, and
// only where headerCtxWorks.
func ctxOfHeader(h *fasthttp.RequestHeader) *fasthttp.RequestCtx {
	return (*fasthttp.RequestCtx)(unsafe.Add(unsafe.Pointer(h), -int(headerCtxOffset)))
}

// headerCtxOnce runs headerCtxWorks's check once; headerCtxOK is its
// answer.
var (
	headerCtxOnce sync.Once
	headerCtxOK   bool
)

// headerCtxWorks reports whether this fasthttp gives HeaderReceived the
// header of the RequestCtx its handler then gets (as fasthttp 1.58's to 1.78's
// serveConn does), checked once on a request served over net.Pipe by
// comparing addresses, never dereferencing a guess. Where it does not,
// the gate runs in the handler, after fasthttp has read up to 8 KiB of a
// body.
func headerCtxWorks() bool {
	headerCtxOnce.Do(func() {
		var guess uintptr
		same := make(chan bool, 1)
		s := &fasthttp.Server{
			HeaderReceived: func(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
				guess = uintptr(unsafe.Pointer(h)) - headerCtxOffset
				return fasthttp.RequestConfig{}
			},
			Handler: func(ctx *fasthttp.RequestCtx) {
				select {
				case same <- guess == uintptr(unsafe.Pointer(ctx)):
				default:
				}
			},
			Logger: fastLogger{slog.New(slog.DiscardHandler)},
		}
		client, server := net.Pipe()
		done := make(chan struct{})
		go func() {
			defer close(done)
			s.ServeConn(server) //nolint:errcheck // ends when client closes
		}()
		go io.WriteString(client, "GET / HTTP/1.1\r\nHost: probe\r\n\r\n") //nolint:errcheck
		select {
		case headerCtxOK = <-same:
		case <-time.After(5 * time.Second):
		}
		client.Close()
		server.Close()
		<-done
	})
	return headerCtxOK
}

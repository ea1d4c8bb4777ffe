package main

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"time"
)

// h1Transport is the proxy's transport to a plain-HTTP upstream: HTTP/1.1
// on pooled keep-alive connections, the request written and the response
// read by the caller's goroutine. net/http's Transport gives each
// connection a reading and a writing goroutine and hands every request
// across both; for a proxy whose every request makes the trip, those
// hand-offs are a good share of its CPU. Upgrades (WebSocket), Expect:
// 100-continue, CONNECT and https go to the standard transport, which
// handles them.
type h1Transport struct {
	addr     string // the upstream's host:port
	dialer   *net.Dialer
	fallback http.RoundTripper
	idle     chan *h1Conn
	maxIdle  time.Duration
}

type h1Conn struct {
	c        net.Conn
	br       *bufio.Reader
	bw       *bufio.Writer
	lastUsed time.Time
}

var h1Readers = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 16<<10) }}
var h1Writers = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, 16<<10) }}

func newH1Transport(addr string, dialer *net.Dialer, fallback http.RoundTripper, poolSize int) *h1Transport {
	return &h1Transport{addr: addr, dialer: dialer, fallback: fallback, idle: make(chan *h1Conn, poolSize), maxIdle: 60 * time.Second}
}

func (t *h1Transport) dial(ctx context.Context) (*h1Conn, error) {
	c, err := t.dialer.DialContext(ctx, "tcp", t.addr)
	if err != nil {
		return nil, err
	}
	br, bw := h1Readers.Get().(*bufio.Reader), h1Writers.Get().(*bufio.Writer)
	br.Reset(c)
	bw.Reset(c)
	return &h1Conn{c: c, br: br, bw: bw}, nil
}

func (pc *h1Conn) close() {
	pc.c.Close()
	pc.br.Reset(nil)
	pc.bw.Reset(nil)
	h1Readers.Put(pc.br)
	h1Writers.Put(pc.bw)
}

// alive reports whether an idle connection is still open and in step:
// nothing buffered, and the socket has neither data nor the upstream's
// close waiting (connAlive peeks without waiting).
func (pc *h1Conn) alive() bool {
	return pc.br.Buffered() == 0 && connAlive(pc.c)
}

// get returns an idle connection (reused) or a new one.
func (t *h1Transport) get(ctx context.Context) (*h1Conn, bool, error) {
	for {
		select {
		case pc := <-t.idle:
			if time.Since(pc.lastUsed) > t.maxIdle {
				pc.close()
				continue
			}
			return pc, true, nil
		default:
			pc, err := t.dial(ctx)
			return pc, false, err
		}
	}
}

func (t *h1Transport) put(pc *h1Conn) {
	pc.lastUsed = time.Now()
	select {
	case t.idle <- pc:
	default:
		pc.close()
	}
}

// CloseIdle closes the pooled connections.
func (t *h1Transport) CloseIdle() {
	for {
		select {
		case pc := <-t.idle:
			pc.close()
		default:
			return
		}
	}
}

func (t *h1Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme != "http" || req.Method == http.MethodConnect || req.Header.Get("Upgrade") != "" || req.Header.Get("Expect") != "" {
		return t.fallback.RoundTrip(req)
	}
	// A request without a body can be sent again on a new connection when
	// a pooled one turns out to have been closed by the upstream.
	replayable := req.Body == nil || req.Body == http.NoBody
	for attempt := 0; ; attempt++ {
		pc, reused, err := t.get(req.Context())
		if err != nil {
			return nil, err
		}
		if reused && !replayable && !pc.alive() {
			// A body cannot be sent twice: make sure of the connection
			// first.
			pc.close()
			if pc, err = t.dial(req.Context()); err != nil {
				return nil, err
			}
			reused = false
		}
		resp, err := t.exchange(pc, req)
		if err == nil {
			return resp, nil
		}
		if reused && replayable && attempt == 0 && req.Context().Err() == nil {
			continue
		}
		return nil, err
	}
}

// aLongTimeAgo is a deadline in the past: it interrupts blocked I/O.
var aLongTimeAgo = time.Unix(1, 0)

func (t *h1Transport) exchange(pc *h1Conn, req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	// The client leaving interrupts the exchange.
	stop := context.AfterFunc(ctx, func() { pc.c.SetDeadline(aLongTimeAgo) })
	fail := func(err error) (*http.Response, error) {
		stop()
		pc.close()
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, ctxErr
		}
		return nil, err
	}
	if err := req.Write(pc.bw); err != nil {
		return fail(err)
	}
	if err := pc.bw.Flush(); err != nil {
		return fail(err)
	}
	for {
		resp, err := http.ReadResponse(pc.br, req)
		if err != nil {
			return fail(err)
		}
		if resp.StatusCode >= 100 && resp.StatusCode < 200 && resp.StatusCode != http.StatusSwitchingProtocols {
			continue // 103 Early Hints and the like: the final answer follows
		}
		resp.Body = &h1Body{rc: resp.Body, pc: pc, t: t, stop: stop, keep: !resp.Close && !req.Close}
		return resp, nil
	}
}

// h1Body returns its connection to the pool once the response has been
// read to its end; a response abandoned half-read closes the connection.
type h1Body struct {
	rc   io.ReadCloser
	pc   *h1Conn
	t    *h1Transport
	stop func() bool
	keep bool
	eof  bool
	done bool
	mu   sync.Mutex
}

func (b *h1Body) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if errors.Is(err, io.EOF) {
		b.eof = true
	}
	return n, err
}

func (b *h1Body) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.done {
		return nil
	}
	b.done = true
	b.rc.Close()
	// stop reports false when the context already fired and poisoned
	// the connection's deadline.
	if b.stop() && b.eof && b.keep {
		b.t.put(b.pc)
	} else {
		b.pc.close()
	}
	return nil
}

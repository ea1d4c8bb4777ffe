package proxy

import (
	"bytes"
	"net"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/floodgate/floodgate/gate"
	"github.com/floodgate/floodgate/throttle"
)

// peerListener remembers each connection's remote address as a string,
// once per connection, for the gate's Request.Peer. scan: its connections
// check the line endings of request headers (peerConn.Read), which needs
// the HeaderReceived hook to tell a header from a body.
type peerListener struct {
	net.Listener
	scan  bool
	conns *connCap // the cap of connections per client address, or nil
}

type peerConn struct {
	net.Conn
	addr string     // "ip:port"
	host string     // "ip"
	ip   netip.Addr // unmapped
	rd   time.Time  // the read deadline set
	// stash is what watch read while the gate delayed the request, for
	// Read to hand fasthttp before reading on.
	stash []byte
	// pend is the gate's decision on the request being read, made in
	// headerReceived, for serve.
	pend pendingVerdict
	// gctx is the gate's context for the connection's requests: it leads
	// watchingClock here.
	gctx connContext
	// adm is the throttler's admission of the request the gate is
	// deciding (decide), for watchingClock: a delay action gives its slot
	// back while it sleeps and enters the throttler again when it ends.
	adm admission
	// readErr is the last error a read of the connection returned.
	readErr error

	// header is where the connection is in reading a request's header
	// (Read checks its line endings: scanHeader); lineLen is the length
	// of the line being read (its bytes so far, a CR included), last the
	// last byte read; bareLF: a line ended in a bare LF.
	header  headerState
	lineLen int
	last    byte
	bareLF  bool

	// capped is the cap the connection is counted in (nil: none);
	// uncapped, that Close has uncounted it.
	capped   *connCap
	uncapped atomic.Bool
}

// headerState is where a connection is in reading a request's header.
type headerState uint8

const (
	headerUnchecked headerState = iota // the line endings are not checked here
	headerAwaited                      // the next bytes are a header's
	headerRead                         // its end has been read (a body follows)
)

// pendingVerdict is what headerReceived decided of a connection's current
// request, for the handler (serve) or, if its body fails first, the error
// handler (requestError).
type pendingVerdict struct {
	set bool
	v   *gate.Verdict // nil with bad
	bad *badRequest   // refused before the gate (checkRequest)
	// skipped: a refused request's body was left unread (fasthttp was
	// told it has none): the connection closes after the answer.
	skipped bool
	// tk is the throttler's admission of an allowed request (nil: no
	// throttler, or not throttled), Done once it is forwarded; shed, why
	// the throttler refused it (it never reached the gate).
	tk   *throttle.Ticket
	shed error
}

// Read hands out what watch read ahead first. While a header is awaited,
// it checks its line endings (scanHeader): once a line ended in a bare LF,
// a read for more of that header fails with errBareLF, for fasthttp waits
// for a CRLF CRLF that may never come.
func (c *peerConn) Read(b []byte) (int, error) {
	if c.bareLF && c.header == headerAwaited {
		return 0, errBareLF
	}
	if len(c.stash) > 0 {
		n := copy(b, c.stash)
		c.stash = c.stash[n:]
		if len(c.stash) == 0 {
			c.stash = nil
		}
		c.scanHeader(b[:n])
		return n, nil
	}
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.scanHeader(b[:n])
	}
	if err != nil {
		c.readErr = err
	}
	return n, err
}

// scanHeader checks the line endings of what was read while a header is
// awaited, up to the header's blank line. (A blank line before a request
// line, which RFC 9112 lets a server skip, ends the check early;
// checkRequest then reads the header's own lines again.)
func (c *peerConn) scanHeader(b []byte) {
	if c.header == headerAwaited {
		rest, prev := b, c.last
		for {
			i := bytes.IndexByte(rest, '\n')
			if i < 0 {
				c.lineLen += len(rest)
				break
			}
			if i > 0 {
				prev = rest[i-1]
			}
			if prev != '\r' {
				c.bareLF = true
				break
			}
			if c.lineLen+i == 1 { // the line is its CR alone
				c.header = headerRead
				break
			}
			c.lineLen, prev, rest = 0, '\n', rest[i+1:]
		}
	}
	c.last = b[len(b)-1]
}

// awaitHeader says the next bytes read are a request's header: its end
// is read when the response has been written (serve, requestError).
func (c *peerConn) awaitHeader() {
	if c.header != headerUnchecked {
		c.header, c.lineLen, c.bareLF = headerAwaited, 0, false
	}
}

// setReadDeadlineNow sets a read deadline of d from now (0: none), without
// SetReadDeadline's skipping.
func (c *peerConn) setReadDeadlineNow(d time.Duration) {
	c.rd = time.Time{}
	if d > 0 {
		c.rd = time.Now().Add(d)
	}
	c.Conn.SetReadDeadline(c.rd) //nolint:errcheck // a broken connection fails its next read
}

// maxStash bounds what watch reads ahead of fasthttp: past it, a client's
// leaving goes unnoticed until the delay ends.
const maxStash = 64 << 10

// aLongTimeAgo is a deadline that has passed: it ends a blocked read.
var aLongTimeAgo = time.Unix(1, 0)

// watch reads the connection in the background, as net/http's server does
// while a handler runs, and calls gone if the client closes it (EOF or a
// reset). What it reads (a pipelined request, the body) is kept for Read.
// stop ends the watch and restores the read deadline; it must be called
// before the connection is read or watched again.
//
// fasthttp has no other way to learn that a client left: its RequestCtx's
// Done is only the server's shutdown, and nothing reads the connection
// while a handler (or the HeaderReceived hook) runs.
func (c *peerConn) watch(gone func()) (stop func()) {
	if len(c.stash) >= maxStash {
		return func() {}
	}
	c.Conn.SetReadDeadline(time.Time{}) //nolint:errcheck // only stop ends the read
	buf := c.stash
	done := make(chan struct{})
	go func() {
		defer close(done)
		for len(buf) < maxStash {
			if cap(buf)-len(buf) < 512 {
				nb := make([]byte, len(buf), min(max(2*cap(buf), 4<<10), maxStash+512))
				copy(nb, buf)
				buf = nb
			}
			n, err := c.Conn.Read(buf[len(buf):cap(buf)])
			buf = buf[:len(buf)+n]
			if err != nil {
				if !isTimeout(err) { // stop's deadline is not the client's doing
					gone()
				}
				return
			}
		}
	}()
	return func() {
		c.Conn.SetReadDeadline(aLongTimeAgo) //nolint:errcheck
		<-done
		c.stash = buf
		c.Conn.SetReadDeadline(c.rd) //nolint:errcheck
	}
}

// connContext is the context the gate is given for a connection's
// requests: never done, its value for peerConnKey the connection.
type connContext struct{ pc *peerConn }

// peerConnKey is connContext's one value's key.
type peerConnKey struct{}

// Deadline implements context.Context: none.
func (connContext) Deadline() (time.Time, bool) { return time.Time{}, false }

// Done implements context.Context: never done.
func (connContext) Done() <-chan struct{} { return nil }

// Err implements context.Context: never an error.
func (connContext) Err() error { return nil }

// Value implements context.Context: the connection, for peerConnKey.
func (c *connContext) Value(key any) any {
	if _, ok := key.(peerConnKey); ok {
		return c.pc
	}
	return nil
}

// SetReadDeadline skips a deadline less than a second after the one set:
// fasthttp sets one or two per request, each a timer update.
func (c *peerConn) SetReadDeadline(t time.Time) error {
	if !t.IsZero() && !c.rd.IsZero() {
		if d := t.Sub(c.rd); d >= 0 && d < time.Second {
			return nil
		}
	}
	c.rd = t
	return c.Conn.SetReadDeadline(t)
}

// SetDeadline is SetReadDeadline's companion.
func (c *peerConn) SetDeadline(t time.Time) error {
	c.rd = t
	return c.Conn.SetDeadline(t)
}

func (l peerListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if pc := l.admit(c); pc != nil {
			return pc, nil
		}
	}
}

// admit wraps an accepted connection, or refuses it (nil) when its
// address holds its cap of connections.
func (l peerListener) admit(c net.Conn) *peerConn {
	pc := newPeerConn(c)
	if l.conns != nil {
		ok, exempt := l.conns.take(pc.ip)
		if !ok {
			refuseConn(c)
			return nil
		}
		if !exempt {
			pc.capped = l.conns
		}
	}
	if l.scan {
		pc.header = headerAwaited
	}
	return pc
}

func newPeerConn(c net.Conn) *peerConn {
	pc := &peerConn{Conn: c, addr: c.RemoteAddr().String()}
	pc.gctx.pc = pc
	pc.ip = gate.PeerAddr(pc.addr)
	if h, _, err := net.SplitHostPort(pc.addr); err == nil {
		pc.host = h
	}
	return pc
}

func peerOf(ctx *fasthttp.RequestCtx) *peerConn {
	if pc, ok := ctx.Conn().(*peerConn); ok {
		return pc
	}
	return newPeerConn(ctx.Conn())
}

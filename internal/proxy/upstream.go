package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/valyala/fasthttp"
)

// hostClient returns a client of the upstream's connections whose write
// buffer holds writeBuf bytes. The requests whose body of known length
// streams go through one of 1 byte: fasthttp (since 1.7x) writes such a
// body through a writer that flushes only a full buffer, and the tail of
// each read would wait there for the next read, which a client that waits
// for an answer before sending more never sends. Through a 1-byte buffer
// every write goes to the connection at once. (A chunked body is flushed
// chunk by chunk; see flushingReader.)
func (p *Proxy) hostClient(writeBuf int) *fasthttp.HostClient {
	return &fasthttp.HostClient{
		Addr:  p.upAddr,
		IsTLS: p.upTLS != nil,
		Dial: func(string) (net.Conn, error) {
			c, err := p.dial()
			if err != nil {
				return nil, err
			}
			return &upConn{Conn: c, redial: p.dial, tls: p.upTLS != nil, used: time.Now(), headerTimeout: p.timeouts.upstream}, nil
		},
		// As fasthttp's default (GET, HEAD and PUT are tried again on a
		// fresh connection), but an upstream that let --upstream-timeout
		// pass is not asked again: that would double the wait.
		RetryIfErr: func(req *fasthttp.Request, _ int, err error) (bool, bool) {
			if isHeaderTimeout(err) {
				return false, false
			}
			return false, req.Header.IsGet() || req.Header.IsHead() || req.Header.IsPut()
		},
		MaxConns:                      1 << 16, // as net/http: no limit to speak of
		MaxIdleConnDuration:           60 * time.Second,
		MaxIdemponentCallAttempts:     2,
		ReadBufferSize:                maxHeaderBytes,
		WriteBufferSize:               writeBuf,
		MaxResponseBodySize:           maxBufferedBody,
		StreamResponseBody:            true,
		DisablePathNormalizing:        true, // pass the path as the client sent it
		NoDefaultUserAgentHeader:      true,
		DisableHeaderNamesNormalizing: false,
	}
}

// dial opens a connection to the upstream (TLS for https).
func (p *Proxy) dial() (net.Conn, error) {
	c, err := p.dialer.Dial("tcp", p.upAddr)
	if err != nil || p.upTLS == nil {
		return c, err
	}
	tc := tls.Client(c, p.upTLS)
	ctx, cancel := context.WithTimeout(context.Background(), p.dialer.Timeout)
	defer cancel()
	if err := tc.HandshakeContext(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return tc, nil
}

// upConn is a connection to the upstream. Before it is used again after a
// pause, it makes sure the upstream has not closed it meanwhile and, if it
// has, dials again in its place: nothing has been written yet, so any
// request (even one whose body streams, which fasthttp would not retry)
// can go on the new connection instead of failing.
//
// With a headerTimeout, the wait for each response's header is bounded,
// and only that: fasthttp's own ReadTimeout would bound the whole
// response, body included, and cut a long stream. fasthttp clears the read
// deadline after it has written a request and before it reads the
// response: there the header's deadline is set instead, and Read lifts it
// as soon as the header's blank line has come (after a 100 Continue,
// fasthttp's one interim response, the next header's).
type upConn struct {
	net.Conn
	redial func() (net.Conn, error)
	tls    bool
	used   time.Time
	// deadlines are set: fasthttp sets none (no timeouts) but clears
	// both for each request, a timer update each.
	rdSet, wdSet bool

	headerTimeout time.Duration
	awaiting      bool    // a response's header is awaited under headerTimeout
	lineLen       int     // bytes (CR aside) of the header line being read
	blockLen      int     // bytes of the header read so far
	status        [3]byte // its status code
}

// upstreamHeaderTimeout is Read's error when the upstream's header did not
// come within headerTimeout (fasthttp reports it as ErrTimeout when no
// byte of the header came).
type upstreamHeaderTimeout struct{ d time.Duration }

// Error names the timeout.
func (e upstreamHeaderTimeout) Error() string {
	return fmt.Sprintf("no response header within %v", e.d)
}

// Timeout marks it a timeout.
func (upstreamHeaderTimeout) Timeout() bool { return true }

// isHeaderTimeout reports whether a HostClient's error is the upstream's
// header timeout: the only read deadline its connections have (writes have
// none).
func isHeaderTimeout(err error) bool {
	var ht upstreamHeaderTimeout
	return errors.Is(err, fasthttp.ErrTimeout) || errors.As(err, &ht)
}

// Read reads, and while a header is awaited, watches for its end.
func (c *upConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if !c.awaiting {
		return n, err
	}
	for i := 0; i < n && c.awaiting; i++ {
		switch ch := b[i]; ch {
		case '\r':
		case '\n':
			if c.lineLen == 0 && c.blockLen > 0 {
				// The blank line: the header is whole. A 100 Continue's
				// is followed by the real one, awaited in turn.
				if c.status != [3]byte{'1', '0', '0'} {
					c.awaiting, c.rdSet = false, false
					if derr := c.Conn.SetReadDeadline(time.Time{}); derr != nil && err == nil {
						err = derr
					}
				}
				c.blockLen, c.status = 0, [3]byte{}
				continue
			}
			c.lineLen = 0
		default:
			// "HTTP/1.1 200": the status code is the block's 10th to
			// 12th bytes.
			if k := c.blockLen - 9; k >= 0 && k < 3 {
				c.status[k] = ch
			}
			c.lineLen++
			c.blockLen++
		}
	}
	if err != nil && c.awaiting && isTimeout(err) {
		err = upstreamHeaderTimeout{c.headerTimeout}
	}
	return n, err
}

// staleAfter is how long a connection may sit unused before it is checked.
const staleAfter = time.Second

// SetWriteDeadline is called by fasthttp before each request it writes.
func (c *upConn) SetWriteDeadline(t time.Time) error {
	now := time.Now()
	if now.Sub(c.used) > staleAfter && !connAlive(c.rawConn()) {
		nc, err := c.redial()
		if err != nil {
			return err
		}
		c.Conn.Close()
		c.Conn, c.rdSet, c.wdSet = nc, false, false
	}
	c.used = now
	if t.IsZero() && !c.wdSet {
		return nil
	}
	c.wdSet = !t.IsZero()
	return c.Conn.SetWriteDeadline(t)
}

// SetReadDeadline is called by fasthttp before each response it reads,
// with no deadline: the header's is set instead.
func (c *upConn) SetReadDeadline(t time.Time) error {
	if t.IsZero() && c.headerTimeout > 0 {
		c.awaiting, c.lineLen, c.blockLen, c.status = true, 0, 0, [3]byte{}
		c.rdSet = true
		return c.Conn.SetReadDeadline(time.Now().Add(c.headerTimeout))
	}
	c.awaiting = false
	if t.IsZero() && !c.rdSet {
		return nil
	}
	c.rdSet = !t.IsZero()
	return c.Conn.SetReadDeadline(t)
}

// SetDeadline sets both.
func (c *upConn) SetDeadline(t time.Time) error {
	c.awaiting = false
	c.rdSet, c.wdSet = !t.IsZero(), !t.IsZero()
	return c.Conn.SetDeadline(t)
}

func (c *upConn) rawConn() net.Conn {
	if tc, ok := c.Conn.(*tls.Conn); ok {
		return tc.NetConn()
	}
	return c.Conn
}

// Handshake tells fasthttp the connection is already TLS when it is (dial
// did the handshake).
func (c *upConn) Handshake() error {
	if tc, ok := c.Conn.(*tls.Conn); ok {
		return tc.Handshake()
	}
	return errors.New("not a TLS connection")
}

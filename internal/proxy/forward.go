package proxy

import (
	"fmt"
	"io"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/floodgate/floodgate/gate"
)

var (
	hdrXFF       = []byte("X-Forwarded-For")
	hdrXRealIP   = []byte("X-Real-IP")
	hdrXFHost    = []byte("X-Forwarded-Host")
	hdrXFProto   = []byte("X-Forwarded-Proto")
	hdrForwarded = []byte("Forwarded")
	valHTTP      = []byte("http")
	commaSpace   = []byte(", ")
)

// prepare turns the client's request into the upstream's, in place: the
// hop-by-hop headers go, X-Forwarded-* are set as httputil's
// ProxyRequest.SetXForwarded sets them (a client's own X-Forwarded-For
// kept only from a trusted proxy), the path and query join the upstream
// URL's, and the request is HTTP/1.1.
func (p *Proxy) prepare(ctx *fasthttp.RequestCtx, pc *peerConn) {
	h := &ctx.Request.Header
	removeHop(h)
	h.DelBytes([]byte("Expect")) // the server answered 100-continue itself
	h.SetNoDefaultContentType(true)
	if !h.IsHTTP11() {
		h.SetProtocol("HTTP/1.1")
	}
	p.setForwarded(h, pc, ctx.Host())
	if p.rewrite {
		p.rewriteURI(ctx)
	}
	if p.upTLS != nil {
		ctx.Request.URI().SetScheme("https")
	}
}

// setForwarded sets the forwarding headers of a request from pc for host
// as httputil's ProxyRequest.SetXForwarded does: X-Forwarded-For extends
// a trusted proxy's, and replaces an untrusted client's own (whose
// Forwarded and X-Real-IP go too); X-Forwarded-Host and -Proto. A
// forwarded request and a deferred one (deferRequest) carry the same.
func (p *Proxy) setForwarded(h *fasthttp.RequestHeader, pc *peerConn, host []byte) {
	h.DelBytes(hdrForwarded)
	if trustedPeer(p.trusted, pc.ip) {
		if prior := h.PeekAll("X-Forwarded-For"); len(prior) > 0 {
			var store [256]byte
			chain := store[:0]
			for i, v := range prior {
				if i > 0 {
					chain = append(chain, commaSpace...)
				}
				chain = append(chain, v...)
			}
			chain = append(chain, commaSpace...)
			chain = append(chain, pc.host...)
			h.DelBytes(hdrXFF)
			h.SetCanonical(hdrXFF, chain)
		} else {
			h.SetCanonical(hdrXFF, s2b(pc.host))
		}
	} else {
		// A client's own forwarding headers name whatever it likes: the
		// upstream gets the proxy's X-Forwarded-For alone (Forwarded is
		// dropped above), and no X-Real-IP, which nginx-style upstreams
		// believe from their proxy.
		h.DelBytes(hdrXRealIP)
		h.DelBytes(hdrXFF)
		if pc.host != "" {
			h.SetCanonical(hdrXFF, s2b(pc.host))
		}
	}
	h.DelBytes(hdrXFHost)
	h.SetCanonical(hdrXFHost, host)
	h.DelBytes(hdrXFProto)
	h.SetCanonical(hdrXFProto, valHTTP)
}

// rewriteURI joins the request's path and query to the upstream URL's, as
// httputil's ProxyRequest.SetURL does.
func (p *Proxy) rewriteURI(ctx *fasthttp.RequestCtx) {
	uri := ctx.Request.URI()
	path, query := string(uri.PathOriginal()), string(uri.QueryString())
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	switch a, b := strings.HasSuffix(p.upPath, "/"), strings.HasPrefix(path, "/"); {
	case a && b:
		path = p.upPath + path[1:]
	case !a && !b:
		path = p.upPath + "/" + path
	default:
		path = p.upPath + path
	}
	if p.upQuery != "" {
		if query == "" {
			query = p.upQuery
		} else {
			query = p.upQuery + "&" + query
		}
	}
	if query != "" {
		path += "?" + query
	}
	host := string(ctx.Host())
	ctx.Request.SetRequestURI(path)
	ctx.Request.Header.SetHost(host)
}

// forward sends an allowed request to the upstream and its answer back,
// with the verdict's RateLimit fields over the upstream's.
func (p *Proxy) forward(ctx *fasthttp.RequestCtx, pc *peerConn, v *gate.Verdict) {
	req := &ctx.Request
	if isUpgrade(&req.Header) {
		p.upgrade(ctx, pc, v)
		return
	}
	p.prepare(ctx, pc)
	out, hc, body := req, p.hc, (*flushingReader)(nil)
	if req.IsBodyStream() {
		if bodyPrefetched(req) {
			req.Body() // from the stream to memory: it can then be resent
		} else {
			out, hc, body = p.streaming(req, pc)
			defer fasthttp.ReleaseRequest(out)
		}
	}
	resp := &ctx.Response
	if err := hc.Do(out, resp); err != nil {
		if body != nil {
			ctx.SetConnectionClose() // what is left of the body is not a request
		}
		switch {
		case body != nil && body.err != nil:
			// The client's body failed: it stalled, the client left, or
			// it is malformed (a broken chunked encoding, say). The
			// client's fault, not the upstream's.
			p.clientBodyFailed(ctx, body.err)
		case isHeaderTimeout(err):
			p.gatewayTimeout(ctx)
		default:
			p.badGateway(ctx, err)
		}
		return
	}
	resp.Header.SetNoDefaultContentType(true)
	removeHop(&resp.Header)
	p.setRateLimit(&resp.Header, v)
}

// streaming returns the upstream's request for a request whose body
// streams (out, to be released), the client to send it with, and the body
// it reads. The body is read as the upstream takes it, for as long as it
// lasts, each read within --client-body-timeout of the last
// (flushingReader), and each read is sent on at once (fasthttp would keep
// the tail of each in its buffer until the next: hcStream,
// flushingReader.WriteTo).
func (p *Proxy) streaming(req *fasthttp.Request, pc *peerConn) (*fasthttp.Request, *fasthttp.HostClient, *flushingReader) {
	pc.setReadDeadlineNow(p.timeouts.body)
	out := fasthttp.AcquireRequest()
	req.Header.CopyTo(&out.Header)
	req.URI().CopyTo(out.URI())
	pc.readErr = nil // see flushingReader.read
	n := req.Header.ContentLength()
	body := &flushingReader{r: req.BodyStream(), pc: pc, timeout: p.timeouts.body, want: int64(n)}
	out.SetBodyStream(body, n)
	if n >= 0 {
		return out, p.hcStream, body
	}
	return out, p.hc, body
}

// clientBodyFailed answers a request whose body could not be read (408 if
// it stalled, else 400; the client may not be there to read it) and
// counts it as the client's error.
func (p *Proxy) clientBodyFailed(ctx *fasthttp.RequestCtx, err error) {
	reason := bodyErrReason(err)
	p.clientErrs[reason].Inc()
	p.log.Debug("the client's request body failed", "reason", clientReasons[reason], "peer", ctx.RemoteAddr().String(), "err", err)
	ctx.Response.Reset()
	ctx.SetConnectionClose()
	ctx.Response.Header.SetContentType("text/plain; charset=utf-8")
	if reason == reasonBodyTimeout {
		ctx.Response.SetStatusCode(fasthttp.StatusRequestTimeout)
		ctx.Response.SetBodyString(fmt.Sprintf("floodgate proxy: the request's body stalled for %v\n", p.timeouts.body))
		return
	}
	ctx.Response.SetStatusCode(fasthttp.StatusBadRequest)
	ctx.Response.SetBodyString(fmt.Sprintf("floodgate proxy: the request's body could not be read: %v\n", err))
}

// gatewayTimeout answers a request whose upstream sent no response header
// within --upstream-timeout.
func (p *Proxy) gatewayTimeout(ctx *fasthttp.RequestCtx) {
	p.upstream.Inc()
	p.upTimeouts.Inc()
	p.log.Warn("upstream timeout: no response header in time", "upstream", p.upName, "timeout", p.timeouts.upstream)
	ctx.Response.Reset()
	ctx.Response.Header.SetNoDefaultContentType(true)
	ctx.Response.SetStatusCode(fasthttp.StatusGatewayTimeout)
	ctx.Response.Header.SetContentType("text/plain; charset=utf-8")
	ctx.Response.SetBodyString(fmt.Sprintf("floodgate proxy: the upstream %s sent no response header within %v\n", p.upName, p.timeouts.upstream))
}

// badGateway answers a request the upstream did not.
func (p *Proxy) badGateway(ctx *fasthttp.RequestCtx, err error) {
	p.upstream.Inc()
	p.log.Warn("upstream unreachable", "upstream", p.upName, "err", err)
	ctx.Response.Reset()
	ctx.Response.Header.SetNoDefaultContentType(true)
	ctx.Response.SetStatusCode(fasthttp.StatusBadGateway)
	ctx.Response.Header.SetContentType("text/plain; charset=utf-8")
	ctx.Response.SetBodyString(fmt.Sprintf("floodgate proxy: the upstream %s did not answer: %v\n", p.upName, err))
}

// flushingReader copies a body to a buffered writer read by read, flushing
// after each, so that a body of known length streams as it comes. Each
// read must come within timeout (--client-body-timeout) of the one before.
// Its err is the client's read error, if any (a stall, a body cut short,
// a broken chunked encoding), so that it is answered and counted as the
// client's failure, not the upstream's.
type flushingReader struct {
	r       io.Reader
	pc      *peerConn     // the client's connection, for the deadlines
	timeout time.Duration // 0: none
	want    int64         // the body's length; -1: chunked
	n       int64         // read so far
	err     error
}

// read reads once, under the deadline. A body that ends early is
// io.ErrUnexpectedEOF where fasthttp's stream says io.EOF: one of known
// length, and a chunked one cut between two chunks (fasthttp reads the
// connection's EOF where the next chunk's size should be as the body's
// end); a chunked body's true end comes without the connection failing.
func (f *flushingReader) read(p []byte) (int, error) {
	if f.timeout > 0 {
		f.pc.setReadDeadlineNow(f.timeout)
	}
	n, err := f.r.Read(p)
	f.n += int64(n)
	if err == io.EOF && (f.want >= 0 && f.n < f.want || f.want < 0 && f.pc.readErr != nil) {
		err = io.ErrUnexpectedEOF
	}
	if err != nil && err != io.EOF {
		f.err = err
	}
	return n, err
}

// Read is read, for fasthttp's chunked writer.
func (f *flushingReader) Read(p []byte) (int, error) { return f.read(p) }

// WriteTo copies the body to w read by read, for fasthttp's writer of a
// body of known length, flushing after each read where w can (fasthttp
// 1.58's could; 1.78's cannot, and hcStream's 1-byte buffer flushes
// instead).
func (f *flushingReader) WriteTo(w io.Writer) (int64, error) {
	fl, _ := w.(interface{ Flush() error })
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	buf := *bp
	var n int64
	for {
		m, err := f.read(buf)
		if m > 0 {
			if _, werr := w.Write(buf[:m]); werr != nil {
				return n, werr
			}
			n += int64(m)
			if fl != nil {
				if ferr := fl.Flush(); ferr != nil {
					return n, ferr
				}
			}
		}
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

var copyBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// trustedPeer reports whether a is one of the trusted proxies.
func trustedPeer(trusted []netip.Prefix, a netip.Addr) bool {
	for _, p := range trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

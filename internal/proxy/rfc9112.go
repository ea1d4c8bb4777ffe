package proxy

import (
	"bytes"

	"github.com/valyala/fasthttp"
)

// badRequest is a request the proxy answers itself, before the gate: one
// that RFC 9112 lets it refuse and that a server in front of the proxy,
// or the upstream, might read otherwise. The connection closes after the
// answer.
type badRequest struct {
	status int
	msg    string
}

// Error is the message, for fasthttp's ErrorHandler (errBareLF).
func (b *badRequest) Error() string { return b.msg }

// answer writes the refusal.
func (b *badRequest) answer(ctx *fasthttp.RequestCtx) {
	ctx.Response.Reset()
	ctx.Response.SetStatusCode(b.status)
	ctx.Response.Header.SetContentType("text/plain; charset=utf-8")
	ctx.Response.SetBodyString("floodgate proxy: " + b.msg + "\n")
	ctx.SetConnectionClose()
}

var (
	errNoHost  = &badRequest{fasthttp.StatusBadRequest, "an HTTP/1.1 request needs one Host header (RFC 9112, 3.2)"}
	errVersion = &badRequest{fasthttp.StatusHTTPVersionNotSupported, "HTTP/1.0 and HTTP/1.1 only"}
	errConnect = &badRequest{fasthttp.StatusNotImplemented, "CONNECT is not supported: this proxy is no tunnel"}
	errBareLF  = &badRequest{fasthttp.StatusBadRequest, "a line of the request's header ends in a bare LF, not CRLF (RFC 9112, 2.2)"}
)

var (
	http10 = []byte("HTTP/1.0")
	http11 = []byte("HTTP/1.1")
)

// checkRequest returns why a request's header must not be forwarded, or
// nil:
//   - a line ended in a bare LF (pc saw it on the wire, or it is in the
//     header's raw lines): a server in front may have read the lines
//     otherwise, and smuggled a request in them;
//   - a version other than HTTP/1.0 and HTTP/1.1 (fasthttp takes any
//     HTTP/d.d): 505;
//   - CONNECT: the proxy is no tunnel, and the upstream is not one to
//     open: 501;
//   - two Host lines (RFC 9112, 3.2): fasthttp keeps the last, a server
//     in front of the proxy may have routed by the first; or an HTTP/1.1
//     request without one, the client's error, not the upstream's.
func checkRequest(h *fasthttp.RequestHeader, pc *peerConn) *badRequest {
	raw := h.RawHeaders()
	switch {
	case pc.bareLF || hasBareLF(raw):
		return errBareLF
	case !bytes.Equal(h.Protocol(), http11) && !bytes.Equal(h.Protocol(), http10):
		return errVersion
	case h.IsConnect():
		return errConnect
	case hostLines(raw) > 1, len(h.Host()) == 0 && h.IsHTTP11():
		return errNoHost
	}
	return nil
}

// hasBareLF reports whether a LF in b follows no CR.
func hasBareLF(b []byte) bool {
	for i := bytes.IndexByte(b, '\n'); i >= 0; {
		if i == 0 || b[i-1] != '\r' {
			return true
		}
		j := bytes.IndexByte(b[i+1:], '\n')
		if j < 0 {
			break
		}
		i += 1 + j
	}
	return false
}

// hostLines counts the Host lines of a request's raw header.
func hostLines(raw []byte) int {
	n := 0
	for len(raw) > 0 {
		line := raw
		if i := indexByte(raw, '\n'); i >= 0 {
			line, raw = raw[:i], raw[i+1:]
		} else {
			raw = nil
		}
		if len(line) >= 5 && line[4] == ':' && eqFold(line[:4], "Host") {
			n++
		}
	}
	return n
}

// ambiguousFraming reports whether a chunked request also had a
// Content-Length, or came as HTTP/1.0: fasthttp reads the chunked body
// (and sends only that on), but a server in front of the proxy may have
// framed it by its Content-Length, and what it took for the next request
// is then part of this one's body. RFC 9112 (6.1, 6.3) wants the
// connection closed after the answer, so nothing is read past a framing
// two servers may disagree on.
func ambiguousFraming(h *fasthttp.RequestHeader) bool {
	if h.ContentLength() != -1 {
		return false
	}
	if !h.IsHTTP11() {
		return true
	}
	found := false
	h.VisitAllInOrder(func(key, _ []byte) {
		found = found || eqFold(key, "Content-Length")
	})
	return found
}

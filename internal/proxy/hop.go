package proxy

import (
	"strings"
	"sync"

	"github.com/valyala/fasthttp"
)

// The hop-by-hop headers (RFC 9110, 7.6.1), removed both ways.
var hopHeaders = [][]byte{
	[]byte("Connection"), []byte("Keep-Alive"), []byte("Proxy-Connection"), []byte("Proxy-Authenticate"),
	[]byte("Proxy-Authorization"), []byte("Te"), []byte("Trailer"), []byte("Transfer-Encoding"), []byte("Upgrade"),
}

// headerLike is what removing hop-by-hop headers needs of a request or
// response header.
type headerLike interface {
	VisitAll(f func(key, value []byte))
	DelBytes(key []byte)
}

// removeHop removes the hop-by-hop headers, and every header a Connection
// line names, however many. Each Connection line is visited:
// PeekAll("Connection") gives fasthttp's "close" alone when one line says
// close, hiding the others ("Connection: X-Secret" then "Connection:
// close" passed X-Secret on). A request's lines are read as received
// (VisitAllInOrder): its VisitAll would parse the Cookie header into
// fasthttp's cookies, and send them on re-serialized.
func removeHop(h headerLike) {
	sc := hopScratches.Get().(*hopScratch)
	sc.buf, sc.names = sc.store[:0], sc.names[:0]
	if rh, ok := h.(*fasthttp.RequestHeader); ok {
		rh.VisitAllInOrder(sc.visit)
	} else {
		h.VisitAll(sc.visit)
	}
	for _, name := range sc.names {
		h.DelBytes(name)
	}
	clear(sc.names)
	hopScratches.Put(sc)
	for _, name := range hopHeaders {
		h.DelBytes(name)
	}
}

// hopScratch is removeHop's working memory, pooled: the names a
// Connection line lists, copied out (deleting headers moves the values),
// and visit, the header visitor, made once, so that a request allocates
// none of it.
type hopScratch struct {
	store [256]byte
	buf   []byte
	names [][]byte
	visit func(key, line []byte)
}

var hopScratches = sync.Pool{New: func() any {
	sc := &hopScratch{}
	sc.visit = sc.connectionNames
	return sc
}}

// connectionNames collects the names a Connection line lists (but close
// and keep-alive); other headers are passed over.
func (sc *hopScratch) connectionNames(key, line []byte) {
	if !eqFold(key, "Connection") {
		return
	}
	for len(line) > 0 {
		var tok []byte
		if i := indexByte(line, ','); i >= 0 {
			tok, line = line[:i], line[i+1:]
		} else {
			tok, line = line, nil
		}
		tok = trimSpace(tok)
		if len(tok) == 0 || eqFold(tok, "close") || eqFold(tok, "keep-alive") {
			continue
		}
		start := len(sc.buf)
		sc.buf = append(sc.buf, tok...)
		sc.names = append(sc.names, sc.buf[start:len(sc.buf):len(sc.buf)])
	}
}

func indexByte(b []byte, c byte) int {
	for i := range b {
		if b[i] == c {
			return i
		}
	}
	return -1
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	return b
}

func eqFold(b []byte, s string) bool { return strings.EqualFold(b2s(b), s) }

// isUpgrade reports whether a request asks to switch protocols (its
// Connection header names Upgrade, and it has an Upgrade header).
func isUpgrade(h *fasthttp.RequestHeader) bool {
	if len(h.Peek("Upgrade")) == 0 {
		return false
	}
	for _, line := range h.PeekAll("Connection") {
		for len(line) > 0 {
			var tok []byte
			if i := indexByte(line, ','); i >= 0 {
				tok, line = line[:i], line[i+1:]
			} else {
				tok, line = line, nil
			}
			if eqFold(trimSpace(tok), "upgrade") {
				return true
			}
		}
	}
	return false
}

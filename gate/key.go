package gate

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/netip"
	"net/textproto"
	"net/url"
	"strings"
)

// PartKind is what a key part is taken from.
type PartKind uint8

// The kinds of key part.
const (
	PartAll    PartKind = iota // one key for all traffic
	PartIP                     // the client address, grouped (see ClientIP)
	PartHeader                 // a request header (gRPC: metadata)
	PartCookie                 // a cookie
	PartQuery                  // a query parameter
	PartPath                   // the URL path (gRPC: the full method, "/pkg.Service/Method")
	PartRoute                  // the matched route pattern (Request.Pattern, or Config.Route)
	PartMethod                 // the HTTP method (gRPC: the full method)
	PartHost                   // the host, without port
	PartUser                   // the authenticated user (see WithUser and Config.User)
	PartConst                  // a fixed value (Envoy's generic_key)
)

var partNames = [...]string{"all", "remote_address", "header", "cookie", "query", "path", "route", "method", "host", "user", "generic"}

// String returns the kind's name (a rules file's key-part name, where it has one).
func (k PartKind) String() string {
	if int(k) < len(partNames) {
		return partNames[k]
	}
	return "unknown"
}

// Missing says what a part whose header, cookie, query parameter or user
// is absent becomes.
type Missing uint8

// The fallbacks of a missing part.
const (
	MissingIP     Missing = iota // the client's address, as PartIP would give (the default)
	MissingShared                // one value shared by every request without it
	MissingSkip                  // the limit does not apply to the request
)

// A Part is one component of a limit's key; a limit's key joins its parts
// (per IP and path, say), and each part is one descriptor entry when the
// gate asks a remote service.
type Part struct {
	// Kind is what the part is taken from (PartIP, PartHeader, ...).
	Kind PartKind
	// Name is the header, cookie or query parameter (or metadata key),
	// or the value of a PartConst.
	Name string
	// Entry is the descriptor entry's key (default: "remote_address" for
	// the IP, the lower-cased header name, "cookie."+name, "query."+name,
	// and the kind's name otherwise).
	Entry string
	// Missing is the fallback when the value is absent.
	Missing Missing
}

// The parts, as constructors.

// All is one key for all traffic.
func All() Part { return Part{Kind: PartAll} }

// IP keys by the client address (see ClientIP for proxies and grouping).
func IP() Part { return Part{Kind: PartIP} }

// Header keys by a request header (for gRPC, a metadata key).
func Header(name string) Part { return Part{Kind: PartHeader, Name: name} }

// Region keys by a header that a CDN or load balancer sets to the client's
// region ("CF-IPCountry", "X-Client-Region"); requests without it share a key.
func Region(header string) Part {
	return Part{Kind: PartHeader, Name: header, Entry: "region", Missing: MissingShared}
}

// Cookie keys by a cookie.
func Cookie(name string) Part { return Part{Kind: PartCookie, Name: name} }

// Query keys by a query parameter.
func Query(name string) Part { return Part{Kind: PartQuery, Name: name} }

// Path keys by the URL path (gRPC: the full method name).
func Path() Part { return Part{Kind: PartPath} }

// Route keys by the matched route pattern ("GET /users/{id}"), so that
// every user ID shares one key.
func Route() Part { return Part{Kind: PartRoute} }

// Method keys by the HTTP method (gRPC: the full method name).
func Method() Part { return Part{Kind: PartMethod} }

// Host keys by the host name.
func Host() Part { return Part{Kind: PartHost} }

// User keys by the authenticated user that an auth middleware stored with
// WithUser (or that Config.User finds).
func User() Part { return Part{Kind: PartUser} }

// Const is a fixed entry, Envoy's generic_key: a descriptor entry that
// names the limit on the remote side.
func Const(entry, value string) Part { return Part{Kind: PartConst, Name: value, Entry: entry} }

// Or returns the part with a fallback for when its value is absent.
func (p Part) Or(m Missing) Part { p.Missing = m; return p }

// As returns the part with another descriptor entry key.
func (p Part) As(entry string) Part { p.Entry = entry; return p }

func (p *Part) entryKey() string {
	if p.Entry != "" {
		return p.Entry
	}
	switch p.Kind {
	case PartIP:
		return "remote_address"
	case PartHeader:
		return strings.ToLower(p.Name)
	case PartCookie:
		return "cookie." + p.Name
	case PartQuery:
		return "query." + p.Name
	}
	return p.Kind.String()
}

type userKey struct{}

// WithUser returns a context carrying the authenticated user, for the
// User key part. Authentication middleware calls it before the limiter.
func WithUser(ctx context.Context, user string) context.Context {
	return context.WithValue(ctx, userKey{}, user)
}

// UserFrom returns the user stored by WithUser.
func UserFrom(ctx context.Context) (string, bool) {
	u, ok := ctx.Value(userKey{}).(string)
	return u, ok && u != ""
}

// A Request is what the gate sees of one request: an HTTP request, or a
// gRPC call's method, metadata and peer. The gate keeps what it derives
// from it (the client address, once found), so a Request is for one
// request: make a new one (or set it to the zero Request) for the next.
type Request struct {
	// HTTP is the request, for net/http.
	HTTP *http.Request
	// Raw is the request, for another HTTP server (fasthttp, say).
	Raw *RawHTTP
	// FullMethod and MD describe a gRPC call ("/pkg.Service/Method").
	FullMethod string
	MD         map[string][]string // a gRPC call's incoming metadata (grpc's metadata.MD), keys lower-case
	// Peer is the connection's remote address.
	Peer string
	// Ctx is the request's context (HTTP: HTTP.Context()).
	Ctx context.Context

	client    netip.Addr
	clientSet bool
}

// RawHTTP is an HTTP request as a server other than net/http sees it.
type RawHTTP struct {
	// Method, Host, Path and RawQuery are the request's method, its host
	// (a port allowed), its path, decoded and cleaned (the gate takes it
	// as it is), and its query without the '?', still escaped.
	Method, Host, Path, RawQuery string
	// Header returns every value of a header, named in canonical form
	// ("X-Api-Key"), or nil.
	Header func(canonicalName string) []string
}

// MaxValue bounds one key part's value in bytes; longer values keep their
// first bytes and a hash of the whole, so distinct values stay distinct
// while one key cannot be made arbitrarily large.
const MaxValue = 256

// appendValue appends a bounded value, escaping the separator '|' and the
// escape '%'.
func appendValue(dst []byte, v string) []byte {
	if len(v) > MaxValue {
		dst = appendEscaped(dst, v[:MaxValue-17])
		return appendValueHash(append(dst, '~'), v)
	}
	return appendEscaped(dst, v)
}

// appendValueHash appends the hash that stands for a long value's end: 16
// hex digits of its SHA-256, the same in every process, so that the
// instances of a fleet (and one restarted) count a long value under one
// key on a shared store, and a client cannot make its value's key
// another's.
func appendValueHash(dst []byte, v string) []byte {
	sum := sha256.Sum256([]byte(v))
	return hex.AppendEncode(dst, sum[:8])
}

func appendEscaped(dst []byte, v string) []byte {
	for i := 0; i < len(v); i++ {
		switch c := v[i]; c {
		case '%', '|':
			dst = append(dst, '%', "0123456789ABCDEF"[c>>4], "0123456789ABCDEF"[c&15])
		default:
			dst = append(dst, c)
		}
	}
	return dst
}

// boundedValue is v bounded as appendValue bounds it, unescaped (for
// descriptor entries).
func boundedValue(v string) string {
	if len(v) > MaxValue {
		return string(appendValueHash([]byte(v[:MaxValue-17]+"~"), v))
	}
	return v
}

// headerValues returns a header's values from an HTTP request or gRPC
// metadata; canon is the name in canonical MIME form, lower in lower case.
func (r *Request) headerValues(canon, lower string) []string {
	if r.HTTP != nil {
		return r.HTTP.Header[canon]
	}
	if r.Raw != nil {
		return r.Raw.Header(canon)
	}
	return r.MD[lower]
}

// cookie finds a cookie in the Cookie header lines without parsing them
// all.
func cookie(lines []string, name string) (string, bool) {
	for _, line := range lines {
		for len(line) > 0 {
			var part string
			if i := strings.IndexByte(line, ';'); i >= 0 {
				part, line = line[:i], line[i+1:]
			} else {
				part, line = line, ""
			}
			part = strings.TrimSpace(part)
			eq := strings.IndexByte(part, '=')
			if eq < 0 || part[:eq] != name {
				continue
			}
			v := part[eq+1:]
			if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
				v = v[1 : len(v)-1]
			}
			return v, v != ""
		}
	}
	return "", false
}

// query finds a query parameter in a raw query without building a map.
func query(raw, name string) (string, bool) {
	for len(raw) > 0 {
		var kv string
		if i := strings.IndexByte(raw, '&'); i >= 0 {
			kv, raw = raw[:i], raw[i+1:]
		} else {
			kv, raw = raw, ""
		}
		k, v, _ := strings.Cut(kv, "=")
		if strings.ContainsAny(k, "%+") {
			uk, err := url.QueryUnescape(k)
			if err != nil {
				continue
			}
			k = uk
		}
		if k != name {
			continue
		}
		if strings.ContainsAny(v, "%+") {
			uv, err := url.QueryUnescape(v)
			if err != nil {
				return "", false
			}
			v = uv
		}
		return v, v != ""
	}
	return "", false
}

// hostOnly strips a port from a host.
func hostOnly(h string) string {
	if h == "" {
		return h
	}
	if h[0] == '[' {
		if i := strings.IndexByte(h, ']'); i > 0 {
			return canonIPv6(h[1:i])
		}
		return h
	}
	if i := strings.LastIndexByte(h, ':'); i >= 0 && strings.IndexByte(h, ':') == i {
		h = h[:i]
	}
	// a fully qualified name's root dot: "api.example.com." is the same host
	return strings.TrimSuffix(h, ".")
}

// canonIPv6 returns an IPv6 literal (a bracketed host's inside) in its
// canonical form, so that "[0:0:0:0:0:0:0:1]" and "[::1]" are one host
// to a limit's Match.Hosts and to the Host part, as they are to the
// servers behind it; anything else comes back as it is.
func canonIPv6(s string) string {
	if a, err := netip.ParseAddr(s); err == nil && a.Is6() {
		if c := a.String(); c != s {
			return c
		}
	}
	return s
}

// matchHost is a Match.Hosts entry as hosts are compared: lower case, and
// an IPv6 address without its brackets and in canonical form, as hostOnly
// gives a request's ("[2001:db8::1]", as rules files write it, matches
// the Host "[2001:DB8:0::1]:8080").
func matchHost(h string) string {
	h = strings.ToLower(h)
	if len(h) > 2 && h[0] == '[' && h[len(h)-1] == ']' {
		return canonIPv6(h[1 : len(h)-1])
	}
	return h
}

// compiledPart is a Part with its names precomputed.
type compiledPart struct {
	Part
	canon, lower, entry string
}

func compilePart(p Part) compiledPart {
	return compiledPart{Part: p, canon: textproto.CanonicalMIMEHeaderKey(p.Name), lower: strings.ToLower(p.Name), entry: p.entryKey()}
}

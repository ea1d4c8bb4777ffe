package gate

import (
	"net/netip"
	"strings"
)

// ClientIP says how a request's client address is found and grouped.
//
// The connection's peer is the client unless the peer is a trusted proxy:
// only then are the forwarding headers read, and they are walked from the
// right (the entry the nearest proxy appended) past every trusted proxy to
// the first address that is not one. A client cannot spoof its way past a
// proxy that appends to the header, and a client that connects directly
// cannot claim another address at all.
type ClientIP struct {
	// TrustedProxies are the addresses of the proxies and load balancers
	// in front of the service. Empty: headers are never read.
	TrustedProxies []netip.Prefix
	// Headers are the forwarding headers read from a trusted proxy, the
	// first present one winning (default X-Forwarded-For alone). Name only
	// the headers your proxies set: a proxy passes the others through as
	// the client sent them, and a header the client wrote that comes
	// first would name its key (a load balancer that appends to
	// X-Forwarded-For, with Forwarded also listed, lets any client choose
	// its address by sending a Forwarded header). For gRPC they are read
	// from the metadata, lower-cased.
	Headers []string
	// IPv6Prefix groups IPv6 clients by network: one host holds a whole
	// /64 and could otherwise mint millions of keys (default 64; 128
	// keys each address).
	IPv6Prefix int
	// IPv4Prefix groups IPv4 clients likewise (default 32).
	IPv4Prefix int
}

// DefaultHeaders are the forwarding headers read from a trusted proxy
// unless ClientIP.Headers says otherwise: X-Forwarded-For, which load
// balancers (AWS, Google Cloud, nginx, HAProxy, Envoy) append to. Set
// Headers to Forwarded or X-Real-IP for proxies that set those instead.
var DefaultHeaders = []string{"X-Forwarded-For"}

func (c *ClientIP) normalize() {
	if len(c.Headers) == 0 {
		c.Headers = DefaultHeaders
	}
	if c.IPv6Prefix <= 0 || c.IPv6Prefix > 128 {
		c.IPv6Prefix = 64
	}
	if c.IPv4Prefix <= 0 || c.IPv4Prefix > 32 {
		c.IPv4Prefix = 32
	}
}

func (c *ClientIP) trusted(a netip.Addr) bool {
	for _, p := range c.TrustedProxies {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// Resolve returns the client's address for a request that came from peer,
// reading forwarding headers through header (which returns every value of
// a header, or nil) only when peer is a trusted proxy. The address is not
// grouped; see Group.
func (c *ClientIP) Resolve(peer netip.Addr, header func(name string) []string) netip.Addr {
	peer = peer.Unmap().WithZone("")
	if !peer.IsValid() || len(c.TrustedProxies) == 0 || !c.trusted(peer) || header == nil {
		return peer
	}
	headers := c.Headers
	if len(headers) == 0 {
		headers = DefaultHeaders
	}
	for _, name := range headers {
		vals := header(name)
		if len(vals) == 0 {
			continue
		}
		switch {
		case strings.EqualFold(name, "Forwarded"):
			return c.walk(peer, vals, forwardedFor)
		case strings.EqualFold(name, "X-Real-IP"):
			// One address, set by the proxy.
			if a, ok := parseHost(strings.TrimSpace(vals[len(vals)-1])); ok {
				return a
			}
			return peer
		default:
			return c.walk(peer, vals, plainList)
		}
	}
	return peer
}

// walk goes from the rightmost address of the header's list leftwards
// while the hop is a trusted proxy. An entry that does not parse ends the
// walk at the last address known: a trusted proxy wrote it, so nothing to
// its left can be believed.
func (c *ClientIP) walk(peer netip.Addr, vals []string, next func(s string) (rest, elem string)) netip.Addr {
	last := peer
	for i := len(vals) - 1; i >= 0; i-- {
		s := vals[i]
		for len(s) > 0 {
			var elem string
			s, elem = next(s)
			elem = strings.TrimSpace(elem)
			if elem == "" {
				continue
			}
			a, ok := parseHost(elem)
			if !ok {
				return last
			}
			if !c.trusted(a) {
				return a
			}
			last = a
		}
	}
	return last
}

// plainList splits the last element off a comma-separated list.
func plainList(s string) (rest, elem string) {
	i := strings.LastIndexByte(s, ',')
	if i < 0 {
		return "", s
	}
	return s[:i], s[i+1:]
}

// forwardedFor splits the last element off an RFC 7239 Forwarded value and
// returns its for= parameter ("" when it has none, which is skipped; an
// element whose for= is obfuscated or "unknown" is returned as written
// and ends the walk).
func forwardedFor(s string) (rest, elem string) {
	// Elements are separated by commas outside quoted strings.
	end, inQuote := -1, false
	for i := len(s) - 1; i >= 0; i-- {
		switch s[i] {
		case '"':
			inQuote = !inQuote
		case ',':
			if !inQuote {
				end = i
			}
		}
		if end >= 0 {
			break
		}
	}
	elem = s[end+1:]
	if end >= 0 {
		rest = s[:end]
	}
	for elem != "" {
		var pair string
		if i := strings.IndexByte(elem, ';'); i >= 0 {
			pair, elem = elem[:i], elem[i+1:]
		} else {
			pair, elem = elem, ""
		}
		pair = strings.TrimSpace(pair)
		if len(pair) > 4 && strings.EqualFold(pair[:4], "for=") {
			v := pair[4:]
			if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
				v = v[1 : len(v)-1]
			}
			if v == "" {
				v = "unknown"
			}
			return rest, v
		}
	}
	return rest, ""
}

// parseHost parses an address as forwarding headers write it: bare,
// [v6], [v6]:port or v4:port.
func parseHost(s string) (netip.Addr, bool) {
	if s == "" || len(s) > 64 {
		return netip.Addr{}, false
	}
	if s[0] == '[' {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return netip.Addr{}, false
		}
		a, err := netip.ParseAddr(s[1:end])
		if err != nil {
			return netip.Addr{}, false
		}
		return a.Unmap().WithZone(""), true
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap().WithZone(""), true
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap().WithZone(""), true
	}
	return netip.Addr{}, false
}

// Group returns the network a client address is keyed by: its IPv6 /64
// (by default), or the address itself for IPv4.
func (c *ClientIP) Group(a netip.Addr) netip.Prefix {
	bits := c.IPv4Prefix
	if a.Is6() {
		bits = c.IPv6Prefix
	}
	if bits <= 0 {
		bits = a.BitLen()
		if a.Is6() {
			bits = 64
		}
	}
	p, err := a.Prefix(bits)
	if err != nil {
		return netip.PrefixFrom(a, a.BitLen())
	}
	return p
}

// appendGroup appends the key of a's group: the address when the group is
// one address, else the prefix ("2001:db8:1:2::/64").
func (c *ClientIP) appendGroup(dst []byte, a netip.Addr) []byte {
	if !a.IsValid() {
		return append(dst, "unknown"...)
	}
	if a.Is4() && (c.IPv4Prefix == 32 || c.IPv4Prefix == 0) {
		return a.AppendTo(dst) // the usual case: an IPv4 client is its own key
	}
	p := c.Group(a)
	if p.Bits() == a.BitLen() {
		return a.AppendTo(dst)
	}
	return p.AppendTo(dst)
}

// PeerAddr parses a connection's remote address ("192.0.2.1:5678",
// "[2001:db8::1]:443", or an address alone). A Unix socket's peer (an
// empty address, "@", or a socket's path, as net/http and grpc-go give
// them) is on this host: it is 127.0.0.1, so a server on a Unix socket
// behind a local proxy finds its clients through ClientIP.TrustedProxies
// (127.0.0.1/32) as one on loopback TCP does, where every such client had
// shared the key "unknown".
func PeerAddr(s string) netip.Addr {
	if a, ok := parseV4Port(s); ok {
		return a
	}
	if s == "" || s == "@" || s[0] == '/' {
		return netip.AddrFrom4([4]byte{127, 0, 0, 1})
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap().WithZone("")
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap().WithZone("")
	}
	return netip.Addr{}
}

// parseV4Port is the fast path of PeerAddr: "a.b.c.d" or "a.b.c.d:port"
// as strict as netip.
func parseV4Port(s string) (netip.Addr, bool) {
	var b [4]byte
	i, val, digits := 0, 0, 0
	for n := 0; n < len(s); n++ {
		c := s[n]
		switch {
		case c >= '0' && c <= '9':
			if digits == 1 && val == 0 {
				return netip.Addr{}, false // a leading zero
			}
			val = val*10 + int(c-'0')
			digits++
			if val > 255 {
				return netip.Addr{}, false
			}
		case c == '.' || c == ':':
			if digits == 0 || i > 3 || (c == '.') == (i == 3) {
				return netip.Addr{}, false
			}
			b[i] = byte(val)
			i, val, digits = i+1, 0, 0
			if c == ':' {
				port := s[n+1:]
				if len(port) == 0 || len(port) > 5 {
					return netip.Addr{}, false
				}
				p := 0
				for j := 0; j < len(port); j++ {
					if port[j] < '0' || port[j] > '9' {
						return netip.Addr{}, false
					}
					p = p*10 + int(port[j]-'0')
				}
				if p > 65535 {
					return netip.Addr{}, false
				}
				return netip.AddrFrom4(b), true
			}
		default:
			return netip.Addr{}, false
		}
	}
	if i != 3 || digits == 0 {
		return netip.Addr{}, false
	}
	b[3] = byte(val)
	return netip.AddrFrom4(b), true
}

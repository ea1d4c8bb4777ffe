package proxy

import (
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// connCap bounds the connections one client address holds open at once,
// as nginx's limit_conn does for requests: a connection past the cap gets
// a 429 answer and is closed as soon as it is accepted. The addresses of
// trusted proxies (load balancers, whose connections carry many clients)
// are exempt. An IPv6 client is counted by its /64, as the gate keys it by
// default: one host holds a /64 and could take a new address per
// connection. The table holds only addresses with a connection open, so
// it is bounded by the open connections.
type connCap struct {
	max     int
	trusted []netip.Prefix
	mu      sync.Mutex
	n       map[netip.Addr]int
	refused atomic.Int64
	metric  prometheus.Counter // floodgate_proxy_connections_refused_total, or nil
}

func newConnCap(max int, trusted []netip.Prefix, metric prometheus.Counter) *connCap {
	if max <= 0 {
		return nil
	}
	return &connCap{max: max, trusted: trusted, n: make(map[netip.Addr]int), metric: metric}
}

// take counts a connection from a; false when a holds max already.
// exempt: the address is not counted (invalid, or a trusted proxy's).
func (cc *connCap) take(a netip.Addr) (ok, exempt bool) {
	if !a.IsValid() || slices.ContainsFunc(cc.trusted, func(p netip.Prefix) bool { return p.Contains(a) }) {
		return true, true
	}
	a = capKey(a)
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if cc.n[a] >= cc.max {
		cc.refused.Add(1)
		if cc.metric != nil {
			cc.metric.Inc()
		}
		return false, false
	}
	cc.n[a]++
	return true, false
}

// capKey is what an address is counted under: itself, or its /64.
func capKey(a netip.Addr) netip.Addr {
	if a.Is6() {
		p, _ := a.Prefix(64)
		return p.Addr()
	}
	return a
}

// give uncounts a connection from a.
func (cc *connCap) give(a netip.Addr) {
	a = capKey(a)
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if n := cc.n[a] - 1; n > 0 {
		cc.n[a] = n
	} else {
		delete(cc.n, a)
	}
}

// open returns how many connections a holds, and how many addresses hold
// any.
func (cc *connCap) open(a netip.Addr) (n, addrs int) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return cc.n[capKey(a)], len(cc.n)
}

// tooManyConns is the answer to a connection past the cap.
const tooManyConns = "HTTP/1.1 429 Too Many Requests\r\nContent-Type: text/plain; charset=utf-8\r\n" +
	"Retry-After: 1\r\nConnection: close\r\nContent-Length: 39\r\n\r\ntoo many connections from your address\n"

// refuseConn answers a connection past the cap and closes it; the write
// goes to a fresh socket's buffer, and is given up after 100ms.
func refuseConn(c net.Conn) {
	c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond)) //nolint:errcheck // a failed write is a closed connection
	_, _ = c.Write([]byte(tooManyConns))
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.CloseWrite() // FIN after the answer, so a client reads it before the close
	}
	_ = c.Close()
}

// Close closes the connection and, the first time, uncounts it from its
// address's connections.
func (c *peerConn) Close() error {
	if c.capped != nil && c.uncapped.CompareAndSwap(false, true) {
		c.capped.give(c.ip)
	}
	return c.Conn.Close()
}

// RefusedConns returns how many connections were refused for the cap of
// connections per client address (Config.MaxConnsPerIP).
func (p *Proxy) RefusedConns() int64 {
	if p.conns == nil {
		return 0
	}
	return p.conns.refused.Load()
}

// OpenConns returns how many connections the address ip holds open, as
// the cap counts them, and how many addresses hold any (0, 0 without a
// cap).
func (p *Proxy) OpenConns(ip netip.Addr) (n, addrs int) {
	if p.conns == nil {
		return 0, 0
	}
	return p.conns.open(ip)
}

package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/gate"
)

// serveCapped serves a proxy with cfg (its upstream set here) on a
// loopback listener and returns the proxy and its address.
func serveCapped(t *testing.T, cfg Config) (*Proxy, string) {
	t.Helper()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	t.Cleanup(up.Close)
	cfg.Upstream, _ = url.Parse(up.URL)
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	g, err := gate.New(gate.Config{Clock: Clock(clock.Coarse)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	p.SetGate(g)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go p.Serve(l) //nolint:errcheck // ends with Shutdown
	t.Cleanup(func() { p.Shutdown(t.Context()) })
	return p, l.Addr().String()
}

func dialFrom(t *testing.T, from, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(20 * time.Second)) //nolint:errcheck
	t.Cleanup(func() { c.Close() })
	return c
}

// roundTrip sends a GET on c and returns the answer's status.
func roundTrip(t *testing.T, c net.Conn) int {
	t.Helper()
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// expectRefused reads c to its end: the 429 answer, then the close.
func expectRefused(t *testing.T, c net.Conn) {
	t.Helper()
	b, err := io.ReadAll(c)
	if err != nil && !strings.Contains(err.Error(), "reset") {
		t.Fatalf("a refused connection: %v", err)
	}
	if !strings.HasPrefix(string(b), "HTTP/1.1 429 ") || !strings.Contains(string(b), "Retry-After: 1\r\n") ||
		!strings.HasSuffix(string(b), "\r\n\r\ntoo many connections from your address\n") {
		t.Fatalf("a refused connection read %q; want the 429 answer", b)
	}
}

func waitOpen(t *testing.T, p *Proxy, ip string, want int) {
	t.Helper()
	a := netip.MustParseAddr(ip)
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, _ := p.OpenConns(a)
		if n == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s holds %d connections; want %d", ip, n, want)
		}
		time.Sleep(time.Millisecond)
	}
}

// One address holds at most 5 connections, idle or not: 200 more are
// answered 429 and closed; a closed one frees its place; another address
// has its own 5.
func TestMaxConnsPerIP(t *testing.T) {
	p, addr := serveCapped(t, Config{MaxConnsPerIP: 5})
	var held []net.Conn
	for range 5 {
		held = append(held, dialFrom(t, "127.0.0.1", addr)) // idle: not a byte sent
	}
	waitOpen(t, p, "127.0.0.1", 5)
	for range 200 {
		expectRefused(t, dialFrom(t, "127.0.0.1", addr))
	}
	if got, metric := p.RefusedConns(), counterValue(p.pm.connsRefused); got != 200 || metric != 200 {
		t.Fatalf("RefusedConns() = %d, floodgate_proxy_connections_refused_total %v; want 200", got, metric)
	}
	for _, c := range held[:2] { // the held ones serve, keep-alive
		for range 3 {
			if code := roundTrip(t, c); code != 200 {
				t.Fatalf("a held connection got %d", code)
			}
		}
	}
	// another address is not touched by 127.0.0.1's cap
	other := dialFrom(t, "127.0.0.2", addr)
	if code := roundTrip(t, other); code != 200 {
		t.Fatalf("127.0.0.2 got %d", code)
	}
	held[0].Close()
	held[1].Close()
	waitOpen(t, p, "127.0.0.1", 3)
	var fresh []net.Conn
	for range 2 {
		c := dialFrom(t, "127.0.0.1", addr)
		fresh = append(fresh, c)
		if code := roundTrip(t, c); code != 200 {
			t.Fatalf("a connection after two closed got %d", code)
		}
	}
	expectRefused(t, dialFrom(t, "127.0.0.1", addr))
	// the table holds only addresses with a connection open
	for _, c := range held[2:] {
		c.Close()
	}
	other.Close()
	for _, c := range fresh {
		c.Close()
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, addrs := p.OpenConns(netip.Addr{}); addrs != 0; _, addrs = p.OpenConns(netip.Addr{}) {
		if time.Now().After(deadline) {
			t.Fatalf("%d addresses still in the table after every connection closed", addrs)
		}
		time.Sleep(time.Millisecond)
	}
}

// Trusted proxies (a load balancer carrying many clients) are exempt.
func TestMaxConnsPerIPTrustedExempt(t *testing.T) {
	p, addr := serveCapped(t, Config{MaxConnsPerIP: 2, TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}})
	var cs []net.Conn
	for range 10 {
		cs = append(cs, dialFrom(t, "127.0.0.1", addr))
	}
	for _, c := range cs {
		if code := roundTrip(t, c); code != 200 {
			t.Fatalf("a trusted proxy's connection got %d", code)
		}
	}
	if n, addrs := p.OpenConns(netip.MustParseAddr("127.0.0.1")); n != 0 || addrs != 0 || p.RefusedConns() != 0 {
		t.Fatalf("trusted connections counted: %d open, %d addresses, %d refused", n, addrs, p.RefusedConns())
	}
}

func TestMaxConnsPerIPNegative(t *testing.T) {
	u, _ := url.Parse("http://127.0.0.1:1")
	if _, err := New(Config{Upstream: u, MaxConnsPerIP: -1}); err == nil || !strings.Contains(err.Error(), "MaxConnsPerIP") {
		t.Fatalf("MaxConnsPerIP -1: %v; want an error naming it", err)
	}
}

// An IPv6 host is counted by its /64: new addresses in it share the cap.
func TestConnCapIPv6Prefix(t *testing.T) {
	cc := newConnCap(2, nil, nil)
	a, b, c := netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("2001:db8::2"), netip.MustParseAddr("2001:db8::3")
	if ok, _ := cc.take(a); !ok {
		t.Fatal("first refused")
	}
	if ok, _ := cc.take(b); !ok {
		t.Fatal("second refused")
	}
	if ok, _ := cc.take(c); ok {
		t.Fatal("a third address of the same /64 got past a cap of 2")
	}
	if ok, _ := cc.take(netip.MustParseAddr("2001:db8:0:1::1")); !ok {
		t.Fatal("another /64 refused")
	}
	cc.give(a)
	if ok, _ := cc.take(c); !ok {
		t.Fatal("a freed place not given")
	}
}

// counterValue reads a counter as a scrape would.
func counterValue(c prometheus.Counter) float64 {
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil || len(mfs) != 1 || len(mfs[0].GetMetric()) != 1 {
		return -1
	}
	return mfs[0].GetMetric()[0].GetCounter().GetValue()
}

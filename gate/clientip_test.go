package gate

import (
	"math/rand/v2"
	"net/http"
	"net/netip"
	"strings"
	"testing"
)

func hdrFunc(h http.Header) func(string) []string {
	return func(name string) []string { return h[http.CanonicalHeaderKey(name)] }
}

func TestClientIPResolve(t *testing.T) {
	c := ClientIP{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")},
		Headers: []string{"Forwarded", "X-Forwarded-For", "X-Real-IP"}}
	c.normalize()
	for _, tc := range []struct {
		peer string
		hdr  []string
		want string
	}{
		// An untrusted peer's headers are ignored: spoofing is useless.
		{"192.0.2.1", []string{"X-Forwarded-For", "203.0.113.9"}, "192.0.2.1"},
		{"192.0.2.1", []string{"X-Real-IP", "203.0.113.9"}, "192.0.2.1"},
		// A trusted proxy's header is walked from the right.
		{"10.0.0.1", []string{"X-Forwarded-For", "203.0.113.9"}, "203.0.113.9"},
		{"10.0.0.1", []string{"X-Forwarded-For", "198.51.100.1, 203.0.113.9, 10.0.0.2"}, "203.0.113.9"},
		{"10.0.0.1", []string{"X-Forwarded-For", "198.51.100.1", "X-Forwarded-For", "203.0.113.9"}, "203.0.113.9"},
		// The client's own spoofed entry, left of the real one, is skipped.
		{"10.0.0.1", []string{"X-Forwarded-For", "1.2.3.4, 203.0.113.9"}, "203.0.113.9"},
		// All trusted: the leftmost.
		{"10.0.0.1", []string{"X-Forwarded-For", "10.0.0.3, 10.0.0.2"}, "10.0.0.3"},
		// Garbage written by a trusted proxy: the last address known.
		{"10.0.0.1", []string{"X-Forwarded-For", "203.0.113.9, nonsense, 10.0.0.2"}, "10.0.0.2"},
		{"10.0.0.1", []string{"X-Real-IP", "203.0.113.7"}, "203.0.113.7"},
		{"10.0.0.1", []string{"Forwarded", `for=198.51.100.1, for="[2001:db8::1]:4711";proto=https, for=10.0.0.2`}, "2001:db8::1"},
		{"10.0.0.1", []string{"Forwarded", `by=10.0.0.1;for=203.0.113.5:80`}, "203.0.113.5"},
		{"10.0.0.1", []string{"Forwarded", `for=unknown, for=10.0.0.2`}, "10.0.0.2"},
		{"10.0.0.1", []string{"Forwarded", `for="_hidden"`}, "10.0.0.1"},
		// Forwarded is preferred to X-Forwarded-For.
		{"10.0.0.1", []string{"X-Forwarded-For", "203.0.113.1", "Forwarded", "for=203.0.113.2"}, "203.0.113.2"},
		{"::ffff:10.0.0.1", []string{"X-Forwarded-For", "::ffff:203.0.113.9"}, "203.0.113.9"},
		{"fd00::1", []string{"X-Forwarded-For", "[2001:db8::7]:9"}, "2001:db8::7"},
		{"10.0.0.1", nil, "10.0.0.1"},
	} {
		h := http.Header{}
		for i := 0; i+1 < len(tc.hdr); i += 2 {
			h.Add(tc.hdr[i], tc.hdr[i+1])
		}
		got := c.Resolve(netip.MustParseAddr(tc.peer), hdrFunc(h))
		if got.String() != tc.want {
			t.Errorf("peer %s %v: %s, want %s", tc.peer, tc.hdr, got, tc.want)
		}
	}
}

// By default only X-Forwarded-For is read: behind a load balancer that
// appends to it and passes other headers through, a client's own
// Forwarded or X-Real-IP header does not choose its key. (With all three
// read, the first present winning, an audit sent 5 requests under 5 keys
// through a limit of 2.)
func TestClientIPDefaultReadsXForwardedForOnly(t *testing.T) {
	c := ClientIP{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}
	c.normalize()
	for _, hdr := range [][]string{
		{"X-Forwarded-For", "203.0.113.5", "Forwarded", "for=198.51.100.1"},
		{"X-Forwarded-For", "203.0.113.5", "X-Real-IP", "198.51.100.1"},
		{"X-Forwarded-For", "198.51.100.1, 203.0.113.5"}, // the client's own entry, then the balancer's
	} {
		h := http.Header{}
		for i := 0; i+1 < len(hdr); i += 2 {
			h.Add(hdr[i], hdr[i+1])
		}
		if got := c.Resolve(netip.MustParseAddr("10.0.0.1"), hdrFunc(h)); got.String() != "203.0.113.5" {
			t.Errorf("%v: %s, want the balancer's 203.0.113.5", hdr, got)
		}
	}
}

// 10,000 random addresses of one /64 share one key; another /64 does not.
func TestIPv6SlashSixtyFourSharesAKey(t *testing.T) {
	c := ClientIP{}
	c.normalize()
	base := netip.MustParseAddr("2001:db8:aa:bb::").As16()
	keys := map[string]bool{}
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 10000; i++ {
		a := base
		for j := 8; j < 16; j++ {
			a[j] = byte(r.Uint32())
		}
		keys[string(c.appendGroup(nil, netip.AddrFrom16(a)))] = true
	}
	if len(keys) != 1 || !keys["2001:db8:aa:bb::/64"] {
		t.Fatalf("keys %v", keys)
	}
	other := base
	other[7]++
	if k := string(c.appendGroup(nil, netip.AddrFrom16(other))); keys[k] {
		t.Fatal("another /64 shares the key")
	}
	c128 := ClientIP{IPv6Prefix: 128}
	c128.normalize()
	if k := string(c128.appendGroup(nil, netip.AddrFrom16(base))); k != "2001:db8:aa:bb::" {
		t.Fatalf("/128 key %q", k)
	}
}

func FuzzClientIP(f *testing.F) {
	f.Add("10.0.0.1:80", "203.0.113.9, 10.0.0.2", "", "")
	f.Add("10.0.0.1:80", "", `for="[2001:db8::1]:4711";proto=https, for=10.0.0.2`, "")
	f.Add("[fd00::1]:1", "", "", "::1")
	f.Add("garbage", "1.2.3.4", `for="`, "x")
	c := ClientIP{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}}
	c.normalize()
	f.Fuzz(func(t *testing.T, peer, xff, fwd, real string) {
		h := http.Header{}
		for k, v := range map[string]string{"X-Forwarded-For": xff, "Forwarded": fwd, "X-Real-Ip": real} {
			if v != "" {
				h.Add(k, v)
			}
		}
		p := PeerAddr(peer)
		a := c.Resolve(p, hdrFunc(h))
		if !c.trusted(p) && a != p.Unmap().WithZone("") {
			t.Fatalf("untrusted peer %s: resolved %s from %v", p, a, h)
		}
		if c.trusted(p) && a.IsValid() && a.Zone() != "" {
			t.Fatalf("zone kept: %s", a)
		}
		c.appendGroup(nil, a)
	})
}

func FuzzKeyParts(f *testing.F) {
	f.Add("a=1; sid=x", "x=1&k=%7C", "k")
	f.Add(`sid="`, "%zz=1&k", "sid")
	f.Fuzz(func(t *testing.T, cookieHdr, rawQuery, name string) {
		r, _ := http.NewRequest("GET", "http://h/", nil)
		r.Header.Set("Cookie", cookieHdr)
		r.URL.RawQuery = rawQuery
		if v, ok := cookie(r.Header["Cookie"], name); ok && v == "" {
			t.Fatal("found an empty cookie")
		}
		if v, ok := query(rawQuery, name); ok && v == "" {
			t.Fatal("found an empty query value")
		}
		k := appendValue(nil, cookieHdr+rawQuery)
		if len(k) > 3*MaxValue {
			t.Fatalf("value of %d bytes", len(k))
		}
		if e := string(appendEscaped(nil, rawQuery)); strings.Contains(e, "|") || strings.Count(e, "%") != strings.Count(rawQuery, "%")+strings.Count(rawQuery, "|") {
			t.Fatalf("escaped %q as %q: a separator left, or an escape unescaped", rawQuery, e)
		}
	})
}

func TestPeerAddrFastPathAgreesWithNetip(t *testing.T) {
	for _, s := range []string{"192.0.2.1:80", "0.0.0.0:1", "255.255.255.255:65535", "1.2.3.4", "01.2.3.4:1", "1.2.3:4", "1.2.3.4.5:6",
		"256.1.1.1:1", "1..2.3:4", "1.2.3.4:", ":1", "[::1]:80", "::1", "1.2.3.04:5", "10.0.0.1:x"} {
		want := netip.Addr{}
		if ap, err := netip.ParseAddrPort(s); err == nil {
			want = ap.Addr()
		} else if a, err := netip.ParseAddr(s); err == nil {
			want = a
		}
		if got, ok := parseV4Port(s); ok && got != want {
			t.Errorf("%q: fast path %v, netip %v", s, got, want)
		}
		if got := PeerAddr(s); got != want {
			t.Errorf("PeerAddr(%q) = %v, want %v", s, got, want)
		}
	}
}

func FuzzPeerAddr(f *testing.F) {
	f.Add("192.0.2.1:80")
	f.Add("[2001:db8::1]:443")
	f.Fuzz(func(t *testing.T, s string) {
		got, ok := parseV4Port(s)
		if !ok {
			return
		}
		want, err := netip.ParseAddr(s)
		if strings.IndexByte(s, ':') >= 0 {
			var ap netip.AddrPort
			ap, err = netip.ParseAddrPort(s)
			want = ap.Addr()
		}
		if err != nil || want != got {
			t.Fatalf("%q: fast path %v, netip %v %v", s, got, want, err)
		}
	})
}

package gate

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/memstore"
	"github.com/floodgate/floodgate/rules"
)

var t0 = time.Unix(1_800_000_000, 0) // a multiple of 1200 s

func newGate(t *testing.T, clk *clock.Manual, limits ...Limit) *Gate {
	t.Helper()
	ms, err := memstore.New(memstore.Options{Clock: clk, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ms.Close() })
	g, err := New(Config{Limits: limits, Store: ms, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func policy(t *testing.T, name string, r floodgate.Rule) *floodgate.Policy {
	t.Helper()
	p, err := floodgate.NewPolicy(name, r)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func httpReq(remote, path string, hdr ...string) *Request {
	r := httptest.NewRequest("GET", "http://example.com"+path, nil)
	r.RemoteAddr = remote
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Add(hdr[i], hdr[i+1])
	}
	return &Request{HTTP: r, Peer: remote}
}

func check(g *Gate, r *Request) *Verdict {
	v := new(Verdict)
	r.clientSet = false
	g.Check(r, v)
	return v
}

func TestKeysAreCountedExactlyPerKey(t *testing.T) {
	clk := clock.NewManual(t0)
	g := newGate(t, clk, Limit{Name: "per-ip", Policy: policy(t, "per-ip", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 5, Period: time.Minute}), Key: []Part{IP()}})
	for _, ip := range []string{"192.0.2.1:1000", "192.0.2.2:1000"} {
		allowed := 0
		for i := 0; i < 8; i++ {
			if check(g, httpReq(ip, "/")).Allowed {
				allowed++
			}
		}
		if allowed != 5 {
			t.Errorf("%s: %d allowed, want 5", ip, allowed)
		}
	}
}

func TestHybridLimitsAreAllOrNothing(t *testing.T) {
	clk := clock.NewManual(t0)
	g := newGate(t, clk,
		Limit{Name: "per-ip", Policy: policy(t, "per-ip", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 3, Period: time.Minute}), Key: []Part{IP()}},
		Limit{Name: "per-user", Policy: policy(t, "per-user", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 5, Period: time.Minute}), Key: []Part{Header("X-User").Or(MissingSkip)}},
	)
	// Three from one address exhaust it; the refused fourth must not
	// consume the user's quota.
	for i := 0; i < 4; i++ {
		v := check(g, httpReq("192.0.2.1:1", "/", "X-User", "alice"))
		if v.Allowed != (i < 3) {
			t.Fatalf("request %d: allowed %v", i, v.Allowed)
		}
		if len(v.Outcomes) != 2 {
			t.Fatalf("%d outcomes, want 2", len(v.Outcomes))
		}
	}
	// alice has used 3 of 5: two more from another address.
	for i := 0; i < 3; i++ {
		v := check(g, httpReq("192.0.2.9:1", "/", "X-User", "alice"))
		if v.Allowed != (i < 2) {
			t.Fatalf("other address, request %d: allowed %v", i, v.Allowed)
		}
		if !v.Allowed && v.Deciding.Limit.Name != "per-user" {
			t.Fatalf("refused by %s, want per-user", v.Deciding.Limit.Name)
		}
	}
	// Without the header the user limit is skipped.
	if v := check(g, httpReq("192.0.2.10:1", "/")); !v.Allowed || len(v.Outcomes) != 1 {
		t.Fatalf("no user header: allowed %v, %d outcomes", v.Allowed, len(v.Outcomes))
	}
}

// A request refused by one limit never holds another's capacity, not even
// for a moment: requests from one address with users of their own race
// requests from it with a spent user, and the first kind gets exactly the
// address's limit (on the compensating path some were refused, by the
// others' hits not yet given back).
func TestHybridLimitsAreAtomic(t *testing.T) {
	clk := clock.NewManual(t0)
	const limit = 400
	g := newGate(t, clk,
		Limit{Name: "per-ip", Policy: policy(t, "per-ip", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: limit, Period: time.Hour}), Key: []Part{IP()}},
		Limit{Name: "per-user", Policy: policy(t, "per-user", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 1, Period: time.Hour}), Key: []Part{Header("X-User").Or(MissingSkip)}},
	)
	if v := check(g, httpReq("192.0.2.99:1", "/", "X-User", "spent")); !v.Allowed {
		t.Fatal("the first request of the spent user was refused")
	}
	var admitted, wrong atomic.Int64
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range limit / 4 {
				user := fmt.Sprintf("u%d-%d", w, i)
				if w%2 == 1 {
					user = "spent"
				}
				v := check(g, httpReq("192.0.2.1:1", "/", "X-User", user))
				switch {
				case v.Allowed && user == "spent":
					wrong.Add(1)
				case v.Allowed:
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if admitted.Load() != limit || wrong.Load() != 0 {
		t.Fatalf("admitted %d of the %d requests with users of their own (%d with the spent user)", admitted.Load(), limit, wrong.Load())
	}
}

func TestMissingFallbacks(t *testing.T) {
	clk := clock.NewManual(t0)
	p := policy(t, "k", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 1, Period: time.Minute})
	g := newGate(t, clk, Limit{Name: "k", Policy: p, Key: []Part{Header("X-Key")}})
	// Falls back to the address: two addresses, one each.
	if !check(g, httpReq("192.0.2.1:1", "/")).Allowed || !check(g, httpReq("192.0.2.2:1", "/")).Allowed {
		t.Fatal("fallback to IP: first request of each address refused")
	}
	v := check(g, httpReq("192.0.2.1:1", "/"))
	if v.Allowed || v.Outcomes[0].Key != "ip:192.0.2.1" {
		t.Fatalf("fallback key %q allowed %v", v.Outcomes[0].Key, v.Allowed)
	}
	g2 := newGate(t, clk, Limit{Name: "k", Policy: p, Key: []Part{Header("X-Key").Or(MissingShared)}})
	if !check(g2, httpReq("192.0.2.1:1", "/")).Allowed || check(g2, httpReq("192.0.2.2:1", "/")).Allowed {
		t.Fatal("shared fallback: requests without the header must share one key")
	}
}

func TestKeyParts(t *testing.T) {
	clk := clock.NewManual(t0)
	p := policy(t, "k", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 100, Period: time.Minute})
	long := make([]byte, 1000)
	for i := range long {
		long[i] = 'a'
	}
	cases := []struct {
		part Part
		req  func() *Request
		want string
	}{
		{Cookie("sid"), func() *Request { return httpReq("192.0.2.1:1", "/", "Cookie", `a=1; sid="xyz"; b=2`) }, "xyz"},
		{Query("api_key"), func() *Request { return httpReq("192.0.2.1:1", "/p?x=1&api%5Fkey=k%7C1&y") }, "k%7C1"},
		{Path(), func() *Request { return httpReq("192.0.2.1:1", "/a/b?q") }, "/a/b"},
		{Method(), func() *Request { return httpReq("192.0.2.1:1", "/") }, "GET"},
		{Host(), func() *Request { return httpReq("192.0.2.1:1", "/") }, "example.com"},
		{Region("CF-IPCountry"), func() *Request { return httpReq("192.0.2.1:1", "/", "Cf-Ipcountry", "NZ") }, "NZ"},
		{Region("CF-IPCountry"), func() *Request { return httpReq("192.0.2.1:1", "/") }, "-"},
		{Const("tier", "gold"), func() *Request { return httpReq("192.0.2.1:1", "/") }, "gold"},
		{All(), func() *Request { return httpReq("192.0.2.1:1", "/") }, "*"},
		{User(), func() *Request {
			r := httpReq("192.0.2.1:1", "/")
			r.HTTP = r.HTTP.WithContext(WithUser(r.HTTP.Context(), "alice"))
			return r
		}, "alice"},
		{Route(), func() *Request {
			r := httpReq("192.0.2.1:1", "/users/7")
			r.HTTP.Pattern = "GET /users/{id}"
			return r
		}, "GET /users/{id}"},
		{IP(), func() *Request { return httpReq("[2001:db8:1:2:3:4:5:6]:443", "/") }, "2001:db8:1:2::/64"},
		{IP(), func() *Request { return httpReq("[::ffff:192.0.2.4]:443", "/") }, "192.0.2.4"},
	}
	for _, c := range cases {
		g := newGate(t, clk, Limit{Name: "k", Policy: p, Key: []Part{c.part}})
		v := check(g, c.req())
		if len(v.Outcomes) != 1 || v.Outcomes[0].Key != c.want {
			t.Errorf("%v %q: outcomes %+v, want key %q", c.part.Kind, c.part.Name, v.Outcomes, c.want)
		}
	}
	// A huge value is capped, and distinct huge values stay distinct.
	g := newGate(t, clk, Limit{Name: "k", Policy: p, Key: []Part{Header("X-K")}})
	a := check(g, httpReq("192.0.2.1:1", "/", "X-K", string(long))).Outcomes[0].Key
	long[999] = 'b'
	b := check(g, httpReq("192.0.2.1:1", "/", "X-K", string(long))).Outcomes[0].Key
	if len(a) > MaxValue || a == b {
		t.Errorf("capped keys: len %d, equal %v", len(a), a == b)
	}
	// and every process (a fleet on one Redis, a restart) keys it alike:
	// the hash was seeded afresh in each process
	sum := sha256.Sum256(long)
	if want := string(long[:MaxValue-17]) + "~" + hex.EncodeToString(sum[:8]); b != want {
		t.Errorf("capped key %q, want %q (its start and 16 hex digits of its SHA-256)", b, want)
	}
}

func TestMatch(t *testing.T) {
	clk := clock.NewManual(t0)
	p := policy(t, "k", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 100, Period: time.Minute})
	g := newGate(t, clk, Limit{Name: "k", Policy: p, Match: Match{Hosts: []string{"*.example.com", "api.test"}, Path: "/users/*/posts/**", Methods: []string{"get"}}})
	for _, c := range []struct {
		method, url string
		want        bool
	}{
		{"GET", "http://a.example.com/users/7/posts", true},
		{"GET", "http://a.example.com:8080/users/7/posts/9/x", true},
		{"GET", "http://API.TEST/users/7/posts/", true},
		{"POST", "http://a.example.com/users/7/posts", false},
		{"GET", "http://example.com/users/7/posts", false},
		{"GET", "http://a.example.com/users/7/8/posts", false},
		{"GET", "http://a.example.com/users/7/postsx", false},
	} {
		r := httptest.NewRequest(c.method, c.url, nil)
		v := check(g, &Request{HTTP: r, Peer: "192.0.2.1:1"})
		if got := len(v.Outcomes) == 1; got != c.want {
			t.Errorf("%s %s: matched %v, want %v", c.method, c.url, got, c.want)
		}
	}
	g2 := newGate(t, clk, Limit{Name: "k", Policy: p, Match: Match{PathPrefix: "/api/"}})
	if len(check(g2, httpReq("192.0.2.1:1", "/api/x")).Outcomes) != 1 || len(check(g2, httpReq("192.0.2.1:1", "/apix")).Outcomes) != 0 {
		t.Error("path prefix")
	}
}

func TestExemptions(t *testing.T) {
	clk := clock.NewManual(t0)
	p := policy(t, "k", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 1, Period: time.Minute})
	g := newGate(t, clk, Limit{Name: "k", Policy: p, Key: []Part{IP()}, ExemptKeys: []string{"192.0.2.7"}, ExemptNets: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}})
	for i := 0; i < 3; i++ {
		if !check(g, httpReq("192.0.2.7:1", "/")).Allowed || !check(g, httpReq("10.1.2.3:1", "/")).Allowed {
			t.Fatal("an exempt client was limited")
		}
	}
	check(g, httpReq("192.0.2.8:1", "/"))
	if check(g, httpReq("192.0.2.8:1", "/")).Allowed {
		t.Fatal("a client that is not exempt was not limited")
	}
}

// The seed's throttle: 2,000 requests per 1,200 s; a client sending
// 2,500 in every 1,200 s is throttled by about 20%.
func TestSeedThrottle(t *testing.T) {
	clk := clock.NewManual(t0)
	p := policy(t, "throttle", floodgate.Rule{Algorithm: floodgate.SlidingWindow, Limit: 2000, Period: 1200 * time.Second})
	g := newGate(t, clk, Limit{Name: "throttle", Policy: p, Key: []Part{IP()}})
	step := 1200 * time.Second / 2500
	denied, total := 0, 0
	for i := 0; i < 3*2500; i++ {
		v := check(g, httpReq("192.0.2.1:1", "/"))
		if i >= 2500 { // steady state, after the first interval
			total++
			if !v.Allowed {
				denied++
			}
		}
		clk.Advance(step)
	}
	frac := float64(denied) / float64(total)
	if frac < 0.18 || frac > 0.22 {
		t.Fatalf("throttled %.3f of the traffic (%d of %d), want about 0.20", frac, denied, total)
	}
}

// The seed's ban: over 2,000 requests in a 1,200 s interval bans the
// client until the end of the interval and for 3,600 s after it.
func TestSeedBan(t *testing.T) {
	clk := clock.NewManual(t0)
	p := policy(t, "ban", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 2000, Period: 1200 * time.Second})
	g := newGate(t, clk, Limit{Name: "ban", Policy: p, Key: []Part{IP()}, Action: Ban, Ban: BanRule{Threshold: 2000, Interval: 1200 * time.Second, Duration: 3600 * time.Second}})
	ip := "192.0.2.1:1"
	other := "192.0.2.2:1"
	step := 1200 * time.Second / 2500
	for i := 0; i < 2500; i++ {
		v := check(g, httpReq(ip, "/"))
		if v.Allowed != (i < 2000) {
			t.Fatalf("request %d at %v: allowed %v", i, time.Duration(i)*step, v.Allowed)
		}
		if i >= 2000 && !v.Outcomes[0].Banned {
			t.Fatalf("request %d: refused but not banned", i)
		}
		clk.Advance(step)
	}
	// The interval ended at t0+1200 s; the ban holds until t0+4800 s,
	// though the client stays quiet and the rate limit has reset.
	clk.Set(t0.Add(4800*time.Second - 20*time.Millisecond))
	v := check(g, httpReq(ip, "/"))
	if v.Allowed || !v.Outcomes[0].Banned {
		t.Fatalf("just before the ban ends: allowed %v banned %v", v.Allowed, v.Outcomes[0].Banned)
	}
	if ra := v.Deciding.Decision.RetryAfter; ra <= 0 || ra > 40*time.Millisecond {
		t.Fatalf("retry after %v, want about 20ms", ra)
	}
	if !check(g, httpReq(other, "/")).Allowed {
		t.Fatal("another client was refused")
	}
	clk.Set(t0.Add(4800*time.Second + 20*time.Millisecond))
	if v := check(g, httpReq(ip, "/")); !v.Allowed {
		t.Fatalf("after the ban: refused (%+v)", v.Deciding)
	}
	// A new ban; an admin lifts it.
	for i := 0; i < 2001; i++ {
		check(g, httpReq(other, "/"))
	}
	if check(g, httpReq(other, "/")).Allowed {
		t.Fatal("second client not banned")
	}
	if err := g.Lift(context.Background(), "ban", "192.0.2.2"); err != nil {
		t.Fatal(err)
	}
	if v := check(g, httpReq(other, "/")); v.Outcomes[0].Banned {
		t.Fatal("still banned after Lift")
	}
}

// Concurrent requests crossing the threshold together ban once, for the
// right time, not once each.
func TestBanCrossingIsCountedOnce(t *testing.T) {
	clk := clock.NewManual(t0)
	p := policy(t, "b", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 1000, Period: time.Minute})
	g := newGate(t, clk, Limit{Name: "b", Policy: p, Key: []Part{IP()}, Action: Ban, Ban: BanRule{Threshold: 10, Interval: time.Minute, Duration: time.Minute}})
	var wg sync.WaitGroup
	for i := 0; i < 64; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g.Check(httpReq("192.0.2.1:1", "/"), new(Verdict))
		}()
	}
	wg.Wait()
	clk.Set(t0.Add(2*time.Minute - 20*time.Millisecond))
	if check(g, httpReq("192.0.2.1:1", "/")).Allowed {
		t.Fatal("ban ended early")
	}
	clk.Set(t0.Add(2*time.Minute + 20*time.Millisecond))
	if v := check(g, httpReq("192.0.2.1:1", "/")); !v.Allowed {
		t.Fatalf("ban held past the interval plus its duration: retry after %v", v.Deciding.Decision.RetryAfter)
	}
}

// Delay lets queued requests through at the bucket's pace and refuses
// those that would wait past MaxDelay.
func TestDelayQueues(t *testing.T) {
	clk := clock.NewManual(t0)
	p := policy(t, "d", floodgate.Rule{Algorithm: floodgate.TokenBucket, Limit: 10, Period: time.Second, Burst: 1})
	g := newGate(t, clk, Limit{Name: "d", Policy: p, Key: []Part{IP()}, Action: Delay, MaxDelay: 300 * time.Millisecond})
	type res struct {
		allowed bool
		delayed time.Duration
	}
	results := make(chan res, 6)
	for i := 0; i < 6; i++ {
		go func() {
			v := new(Verdict)
			g.Check(httpReq("192.0.2.1:1", "/"), v)
			results <- res{v.Allowed, v.Delayed}
		}()
	}
	// One passes at once, two are refused, three sleep.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got := map[time.Duration]int{}
	refused := 0
	for i := 0; i < 3; i++ {
		r := <-results
		if r.allowed {
			got[r.delayed]++
		} else {
			refused++
		}
	}
	if err := clk.WaitForSleepers(ctx, 3); err != nil {
		t.Fatal(err)
	}
	clk.Advance(300 * time.Millisecond)
	for i := 0; i < 3; i++ {
		r := <-results
		if !r.allowed {
			t.Fatal("a queued request was refused")
		}
		got[r.delayed]++
	}
	want := map[time.Duration]int{0: 1, 100 * time.Millisecond: 1, 200 * time.Millisecond: 1, 300 * time.Millisecond: 1}
	if refused != 2 || len(got) != len(want) {
		t.Fatalf("refused %d, delays %v; want 2 refused and delays %v", refused, got, want)
	}
	for d, n := range want {
		if got[d] != n {
			t.Fatalf("delays %v, want %v", got, want)
		}
	}
}

func TestShadowNeverBlocks(t *testing.T) {
	clk := clock.NewManual(t0)
	p := policy(t, "s", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 2, Period: time.Minute})
	g := newGate(t, clk, Limit{Name: "s", Policy: p, Key: []Part{IP()}, Action: Shadow})
	over := 0
	for i := 0; i < 10; i++ {
		v := check(g, httpReq("192.0.2.1:1", "/"))
		if !v.Allowed {
			t.Fatal("shadow mode refused a request")
		}
		if !v.Outcomes[0].Decision.Allowed {
			over++
		}
	}
	if over != 8 {
		t.Fatalf("shadow decisions over the limit: %d, want 8", over)
	}
}

func TestConfigErrors(t *testing.T) {
	p := policy(t, "p", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 1, Period: time.Minute})
	for _, c := range []struct {
		l    Limit
		want string
	}{
		{Limit{Policy: p}, "name"},
		{Limit{Name: "a"}, "policy"},
		{Limit{Name: "a", Policy: p, Action: Delay}, "max_delay"},
		{Limit{Name: "a", Policy: p, Action: Redirect}, "redirect"},
		{Limit{Name: "a", Policy: p, Action: Ban}, "ban"},
		{Limit{Name: "a", Policy: p, Status: 200}, "status"},
		{Limit{Name: "a", Policy: p, Key: []Part{{Kind: PartHeader}}}, "key[0]"},
		{Limit{Name: "a", Policy: p, Key: []Part{IP(), IP()}}, "used twice"},
		{Limit{Name: "a", Policy: p, Match: Match{Path: "x"}}, "match.path"},
	} {
		_, err := New(Config{Limits: []Limit{c.l}})
		if err == nil || !contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want one naming %q", c.l, err, c.want)
		}
	}
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

func TestHeaders(t *testing.T) {
	clk := clock.NewManual(t0)
	p := policy(t, "h", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 3, Period: time.Minute})
	g := newGate(t, clk, Limit{Name: "h", Policy: p, Key: []Part{IP()}})
	clk.Advance(15 * time.Second)
	for i := 0; i < 4; i++ {
		v := check(g, httpReq("192.0.2.1:1", "/"))
		h := http.Header{}
		Headers(v, true, func(k string, vals []string) { h[k] = vals })
		if got := h.Get("RateLimit-Policy"); got != `"h";q=3;w=60` {
			t.Fatalf("policy %q", got)
		}
		want := []string{`"h";r=2;t=45`, `"h";r=1;t=45`, `"h";r=0;t=45`, `"h";r=0;t=45`}[i]
		if got := h.Get("RateLimit"); got != want {
			t.Fatalf("request %d: RateLimit %q, want %q", i, got, want)
		}
		if (h.Get("Retry-After") == "45") != (i == 3) || h.Get("X-RateLimit-Limit") != "3" {
			t.Fatalf("request %d: %v", i, h)
		}
	}
}

// A request from another HTTP server, through RawHTTP, keys and matches as
// a net/http one does.
func TestRawRequest(t *testing.T) {
	clk := clock.NewManual(t0)
	p := policy(t, "k", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 100, Period: time.Minute})
	hdr := http.Header{"X-Key": {"k1"}, "Cookie": {"sid=s1"}, "X-Forwarded-For": {"203.0.113.5"}}
	raw := &RawHTTP{Method: "POST", Host: "api.example.com:8443", Path: "/v1/x", RawQuery: "a=1&b=2",
		Header: func(name string) []string { return hdr[name] }}
	g, err := New(Config{
		Store: func() floodgate.Store {
			ms, _ := memstore.New(memstore.Options{Clock: clk, SweepInterval: -1})
			t.Cleanup(func() { ms.Close() })
			return ms
		}(),
		Clock: clk, ClientIP: ClientIP{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}},
		Limits: []Limit{{Name: "k", Policy: p, Match: Match{Methods: []string{"POST"}, Hosts: []string{"*.example.com"}, PathPrefix: "/v1/"},
			Key: []Part{IP(), Header("X-Key"), Cookie("sid"), Query("b"), Method(), Path(), Host(), Route()}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	v := new(Verdict)
	g.Check(&Request{Raw: raw, Peer: "10.1.1.1:5"}, v)
	if len(v.Outcomes) != 1 || v.Outcomes[0].Key != "203.0.113.5|k1|s1|2|POST|/v1/x|api.example.com|/v1/x" {
		t.Fatalf("outcomes %+v", v.Outcomes)
	}
	raw.Method = "GET"
	g.Check(&Request{Raw: raw, Peer: "10.1.1.1:5"}, v)
	if len(v.Outcomes) != 0 {
		t.Fatal("a GET matched a POST limit")
	}
}

// The RateLimit field names one of the RateLimit-Policy items, as the
// draft wants: for a rules file's limit with several rules, for a Go
// policy with several rules, and for a ban.
func TestRateLimitNamesAPolicy(t *testing.T) {
	cfg := configOf(t, "r.yaml", `domain: d
descriptors:
  - key: user
    rate_limits:
      - {name: per_minute, unit: minute, requests_per_unit: 2, algorithm: token_bucket}
      - {name: per_hour, unit: hour, requests_per_unit: 100, algorithm: token_bucket}
`)
	clk := clock.NewManual(t0)
	ms, _ := memstore.New(memstore.Options{Clock: clk, SweepInterval: -1})
	defer ms.Close()
	two := floodgate.MustPolicy("two", floodgate.Rule{Name: "fast", Algorithm: floodgate.TokenBucket, Limit: 2, Period: time.Second},
		floodgate.Rule{Name: "slow", Algorithm: floodgate.TokenBucket, Limit: 50, Period: time.Hour})
	g, err := New(Config{Store: ms, Clock: clk, Rules: cfg, Limits: []Limit{
		{Name: "file", Domain: "d", Match: Match{PathPrefix: "/file"}, Key: []Part{Header("X-User").As("user")}},
		{Name: "go", Policy: two, Match: Match{PathPrefix: "/go"}, Key: []Part{IP()}},
		{Name: "ban", Policy: policy(t, "b", floodgate.Rule{Algorithm: floodgate.TokenBucket, Limit: 100, Period: time.Hour}), Match: Match{PathPrefix: "/ban"},
			Key: []Part{IP()}, Action: Ban, Ban: BanRule{Threshold: 1, Interval: time.Minute, Duration: time.Minute}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/file", "/go", "/ban"} {
		for i := 0; i < 3; i++ {
			v := check(g, httpReq("192.0.2.1:1", path, "X-User", "u"))
			h := http.Header{}
			Headers(v, false, func(k string, vals []string) { h[k] = vals })
			name, _, _ := strings.Cut(h.Get("RateLimit"), ";")
			if name == "" || !strings.Contains(h.Get("RateLimit-Policy"), name+";") {
				t.Fatalf("%s request %d: RateLimit %q names no item of RateLimit-Policy %q", path, i, h.Get("RateLimit"), h.Get("RateLimit-Policy"))
			}
		}
	}
}

// FromRules turns every field of an http route into the gate's limit.
func TestFromRules(t *testing.T) {
	cfg := configOf(t, "edge.yaml", `domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10}
http:
  - name: all-kinds
    match: {host: "*.example.com", path_prefix: /api/, methods: [POST]}
    key:
      - remote_address
      - path
      - method
      - host
      - {header: X-Key, missing: shared}
      - {cookie: sid, missing: skip}
      - {query: k}
      - {generic: gold, entry: tier}
    rate_limit: {unit: minute, requests_per_unit: 5}
    action: ban
    ban: {threshold: 7, interval: 1m, duration: 10m}
    cost: 2
    exempt_cidrs: [10.0.0.0/8]
  - name: ip
    key: [remote_address]
    action: shadow
`)
	ls, err := FromRules(cfg)
	if err != nil || len(ls) != 2 {
		t.Fatalf("%d limits, %v", len(ls), err)
	}
	a := ls[0]
	kinds := []PartKind{PartIP, PartPath, PartMethod, PartHost, PartHeader, PartCookie, PartQuery, PartConst}
	if a.Name != "edge/all-kinds" || a.Policy == nil || a.Domain != "edge" || a.Action != Ban || a.Ban.Threshold != 7 ||
		a.Ban.Duration != 10*time.Minute || a.Cost != 2 || len(a.ExemptNets) != 1 || len(a.Key) != len(kinds) ||
		a.Match.PathPrefix != "/api/" || len(a.Match.Methods) != 1 || len(a.Match.Hosts) != 1 {
		t.Fatalf("%+v", a)
	}
	for i, k := range kinds {
		if a.Key[i].Kind != k {
			t.Errorf("key[%d]: %v, want %v", i, a.Key[i].Kind, k)
		}
	}
	if a.Key[4].Missing != MissingShared || a.Key[5].Missing != MissingSkip || a.Key[6].Missing != MissingIP || a.Key[7].Entry != "tier" || a.Key[7].Name != "gold" {
		t.Errorf("fallbacks and entries: %+v", a.Key)
	}
	if b := ls[1]; b.Policy != nil || b.Action != Shadow || b.Key[0].Kind != PartIP {
		t.Fatalf("%+v", b)
	}
	g, err := New(Config{Limits: ls, Rules: cfg})
	if err != nil {
		t.Fatalf("the limits do not build a gate: %v", err)
	}
	g.Close()
}

// configOf parses one rules file (named name, for errors) into a Config.
func configOf(t *testing.T, name, yaml string) *rules.Config {
	t.Helper()
	d, err := rules.Parse(name, []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := rules.NewConfig(d)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// A banned key's outcome carries the ban's numbers, as its headers do:
// nothing remains of the ban's quota, whatever the limit's (what
// httplimit's Options.Render reads).
func TestBannedOutcomeSaysBan(t *testing.T) {
	clk := clock.NewManual(t0)
	p := policy(t, "b", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 1000, Period: time.Hour})
	g := newGate(t, clk, Limit{Name: "b", Policy: p, Key: []Part{IP()}, Action: Ban, Ban: BanRule{Threshold: 3, Interval: time.Minute, Duration: time.Minute}})
	for i := 1; i <= 5; i++ {
		v := check(g, httpReq("192.0.2.1:1", "/"))
		d := v.Deciding.Decision
		if i <= 3 {
			if !v.Allowed || d.Remaining != int64(1000-i) {
				t.Fatalf("request %d: allowed %v, remaining %d; want admitted, %d", i, v.Allowed, d.Remaining, 1000-i)
			}
			continue
		}
		if v.Allowed || !v.Deciding.Banned || d.Remaining != 0 || d.Limit != 3 || d.RetryAfter != 2*time.Minute || d.Reason != floodgate.ReasonLimited {
			t.Fatalf("request %d: allowed %v banned %v, decision %+v; want the ban's: 0 of 3 left, retry after 2m", i, v.Allowed, v.Deciding.Banned, d)
		}
	}
}

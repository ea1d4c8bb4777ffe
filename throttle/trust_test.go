package throttle

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"reflect"
	"sync/atomic"
	"testing"
	"time"
)

// trustedAddr is the loopback source address the tests' trusted clients
// dial from (Linux routes all of 127.0.0.0/8 to lo); public clients come
// from 127.0.0.1.
const trustedAddr = "127.0.0.2"

// fromTrusted is a MiddlewareOptions.Trusted by peer address.
func fromTrusted(r *http.Request) bool {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	return err == nil && host == trustedAddr
}

// trustedClient is an HTTP client whose connections come from
// trustedAddr.
func trustedClient(t *testing.T) *http.Client {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(trustedAddr)}}
	tr := &http.Transport{DialContext: d.DialContext}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 20 * time.Second}
}

func publicClient(t *testing.T) *http.Client {
	t.Helper()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 20 * time.Second}
}

type reply struct {
	code   int
	body   string
	reason string // a shed reply's problem-details reason
	level  string // a shed reply's problem-details criticality
}

// get sends GET url with an X-Criticality of claim (none if empty),
// asking for problem details.
func get(t *testing.T, c *http.Client, url, claim string) reply {
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Error(err)
		return reply{}
	}
	req.Header.Set("Accept", "application/problem+json")
	if claim != "" {
		req.Header.Set("X-Criticality", claim)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Error(err)
		return reply{}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	a := reply{code: resp.StatusCode, body: string(b)}
	if resp.StatusCode == 503 {
		var p struct{ Reason, Criticality string }
		if err := json.Unmarshal(b, &p); err != nil {
			t.Errorf("503 body %q: %v", b, err)
		}
		a.reason, a.level = p.Reason, p.Criticality
	}
	return a
}

// trustRig is a throttler of one slot and a queue of one request (an
// unseen route is predicted at 1 ms) behind the middleware over real
// HTTP, trusting trustedAddr; /hold blocks until release is closed, any
// other path answers the level in its context.
type trustRig struct {
	th      *Throttler
	url     string
	release chan struct{}
	held    chan struct{}
}

func newTrustRig(t *testing.T) *trustRig {
	t.Helper()
	r := &trustRig{th: New(Config{Limit: 1, MaxQueueCost: time.Millisecond}), release: make(chan struct{}), held: make(chan struct{}, 1)}
	h := r.th.Middleware(MiddlewareOptions{Trusted: fromTrusted})(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path == "/hold" {
			r.held <- struct{}{}
			<-r.release
			return
		}
		c, _ := FromContext(req.Context())
		io.WriteString(w, c.String()) //nolint:errcheck
	}))
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	t.Cleanup(func() { // before Close (cleanups run last first): a failed test's held request
		select {
		case <-r.release:
		default:
			close(r.release)
		}
	})
	r.url = srv.URL
	return r
}

func (r *trustRig) waitQueued(t *testing.T, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); r.th.Stats().Queued != n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %d queued (%+v)", n, r.th.Stats())
		}
	}
}

// TestMiddlewareUntrustedClaimAtCeiling: under a full queue, an untrusted
// client claiming CRITICAL_PLUS is treated at the ceiling (CRITICAL):
// a real CRITICAL_PLUS from a trusted source evicts it, where a believed
// claim would have refused the trusted one at the full queue; and it
// cannot evict a queued CRITICAL request, where a believed claim would
// have jumped the queue.
func TestMiddlewareUntrustedClaimAtCeiling(t *testing.T) {
	r := newTrustRig(t)
	public, trusted := publicClient(t), trustedClient(t)
	holdDone := make(chan reply, 1)
	go func() { holdDone <- get(t, public, r.url+"/hold", "") }()
	<-r.held

	// the fake CRITICAL_PLUS queues, then a trusted CRITICAL_PLUS evicts it
	fake := make(chan reply, 1)
	go func() { fake <- get(t, public, r.url+"/x", "CRITICAL_PLUS") }()
	r.waitQueued(t, 1)
	trustedPlus := make(chan reply, 1)
	go func() { trustedPlus <- get(t, trusted, r.url+"/x", "CRITICAL_PLUS") }()
	select {
	case a := <-fake:
		if a.code != 503 || a.reason != "evicted" || a.level != "CRITICAL" {
			t.Fatalf("untrusted CRITICAL_PLUS at a full queue: %+v; want 503, evicted, at CRITICAL", a)
		}
	case a := <-trustedPlus:
		t.Fatalf("the trusted CRITICAL_PLUS was answered first, %+v: the untrusted claim held the queue", a)
	}
	r.waitQueued(t, 1)
	close(r.release)
	if a := <-trustedPlus; a.code != 200 || a.body != "CRITICAL_PLUS" {
		t.Fatalf("trusted CRITICAL_PLUS: %+v; want 200 at CRITICAL_PLUS", a)
	}
	<-holdDone

	st := r.th.Stats()
	if st.Evicted[Critical] != 1 || st.Evicted[CriticalPlus] != 0 || st.Refused != [numLevels]uint64{} || st.InFlight != 0 {
		t.Fatalf("stats %+v: want one CRITICAL evicted, nothing else shed", st)
	}

	// a genuine CRITICAL queued; the fake CRITICAL_PLUS is refused (a
	// new throttler: no completions yet, so the queue holds one request)
	r = newTrustRig(t)
	go func() { holdDone <- get(t, public, r.url+"/hold", "") }()
	<-r.held
	genuine := make(chan reply, 1)
	go func() { genuine <- get(t, public, r.url+"/x", "CRITICAL") }()
	r.waitQueued(t, 1)
	if a := get(t, public, r.url+"/x", "critical-plus"); a.code != 503 || a.reason != "queue_full" || a.level != "CRITICAL" {
		t.Fatalf("untrusted CRITICAL_PLUS against a queued CRITICAL: %+v; want 503, queue_full, at CRITICAL", a)
	}
	close(r.release)
	if a := <-genuine; a.code != 200 || a.body != "CRITICAL" {
		t.Fatalf("queued CRITICAL: %+v; want 200", a)
	}
	<-holdDone
	st = r.th.Stats()
	if st.Refused[Critical] != 1 || st.Refused[CriticalPlus] != 0 || st.Evicted != [numLevels]uint64{} || st.InFlight != 0 {
		t.Fatalf("stats %+v: want one CRITICAL refused, nothing else shed", st)
	}
}

// TestMiddlewareClaimLevels over real HTTP: the level a request runs at
// (in its context) and the header its handler sees, by source, claim and
// ceiling. Untrusted: a claim lowers, never raises; garbage and no claim
// are the ceiling. Trusted: the claim as it is. Criticality overrides
// everything. Trusted is asked only for a request with the header.
func TestMiddlewareClaimLevels(t *testing.T) {
	shedPlus := func(*http.Request) Criticality { return SheddablePlus }
	var asked atomic.Int64
	trust := func(r *http.Request) bool { asked.Add(1); return fromTrusted(r) }
	type seen struct {
		level  Criticality
		set    bool
		header []string
	}
	got := make(chan seen, 1)
	handler := http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		c, ok := FromContext(r.Context())
		got <- seen{c, ok, r.Header["X-Criticality"]}
	})
	th := New(Config{Limit: 8})
	serve := func(o MiddlewareOptions) string {
		srv := httptest.NewServer(th.Middleware(o)(handler))
		t.Cleanup(srv.Close)
		return srv.URL
	}
	plain := serve(MiddlewareOptions{Trusted: trust})
	capped := serve(MiddlewareOptions{Trusted: trust, Ceiling: shedPlus})
	invalid := serve(MiddlewareOptions{Ceiling: func(*http.Request) Criticality { return 9 }})
	decided := serve(MiddlewareOptions{Trusted: trust, Ceiling: shedPlus, Criticality: func(*http.Request) Criticality { return CriticalPlus }})
	untrustedOnly := serve(MiddlewareOptions{}) // no Trusted: nobody is
	public, trusted := publicClient(t), trustedClient(t)
	for _, c := range []struct {
		name    string
		url     string
		trusted bool
		claim   string
		want    Criticality
		header  string // what the handler sees; "" for no header
	}{
		{"untrusted raises", plain, false, "CRITICAL_PLUS", Critical, "CRITICAL"},
		{"untrusted lowers", plain, false, "SHEDDABLE", Sheddable, "SHEDDABLE"},
		{"untrusted lowers, lower case", plain, false, "sheddable_plus", SheddablePlus, "SHEDDABLE_PLUS"},
		{"untrusted at the ceiling", plain, false, "CRITICAL", Critical, "CRITICAL"},
		{"untrusted garbage", plain, false, "URGENT", Critical, "CRITICAL"},
		{"untrusted numeric", plain, false, "3", Critical, "CRITICAL"},
		{"untrusted none", plain, false, "", Critical, ""},
		{"trusted raises", plain, true, "CRITICAL_PLUS", CriticalPlus, "CRITICAL_PLUS"},
		{"trusted lowers", plain, true, "SHEDDABLE", Sheddable, "SHEDDABLE"},
		{"trusted garbage", plain, true, "CRITICAL_PLUS_PLUS", Critical, "CRITICAL"},
		{"ceiling: untrusted CRITICAL", capped, false, "CRITICAL", SheddablePlus, "SHEDDABLE_PLUS"},
		{"ceiling: untrusted CRITICAL_PLUS", capped, false, "CRITICAL_PLUS", SheddablePlus, "SHEDDABLE_PLUS"},
		{"ceiling: untrusted lowers", capped, false, "SHEDDABLE", Sheddable, "SHEDDABLE"},
		{"ceiling: untrusted garbage", capped, false, "x", SheddablePlus, "SHEDDABLE_PLUS"},
		{"ceiling: untrusted none", capped, false, "", SheddablePlus, ""},
		{"ceiling: trusted raises", capped, true, "CRITICAL_PLUS", CriticalPlus, "CRITICAL_PLUS"},
		{"ceiling: trusted none", capped, true, "", SheddablePlus, ""},
		{"invalid ceiling: the default", invalid, false, "CRITICAL_PLUS", Critical, "CRITICAL"},
		{"Criticality decides", decided, false, "SHEDDABLE", CriticalPlus, "CRITICAL_PLUS"},
		{"no Trusted: a 127.0.0.2 client is untrusted too", untrustedOnly, true, "CRITICAL_PLUS", Critical, "CRITICAL"},
	} {
		cl := public
		if c.trusted {
			cl = trusted
		}
		before := asked.Load()
		if a := get(t, cl, c.url+"/", c.claim); a.code != 200 {
			t.Fatalf("%s: %+v", c.name, a)
		}
		s := <-got
		if s.level != c.want || s.set != (c.want != DefaultCriticality || c.claim != "") {
			t.Errorf("%s: level %v (in the context: %v), want %v", c.name, s.level, s.set, c.want)
		}
		if (c.header == "" && s.header != nil) || (c.header != "" && (len(s.header) != 1 || s.header[0] != c.header)) {
			t.Errorf("%s: the handler saw X-Criticality %q, want %q", c.name, s.header, c.header)
		}
		if n := asked.Load() - before; c.claim == "" && n != 0 || c.url == decided && n != 0 {
			t.Errorf("%s: Trusted asked %d times", c.name, n)
		}
	}
}

// TestMiddlewarePropagatesCappedLevel: a throttled front's handler calls
// a back through Transport, once with a request of its own on its
// context and once forwarding the incoming request (httputil.ReverseProxy):
// the back receives the level the front ran the request at, never the
// raw claim of an untrusted client; a trusted client's claim travels on.
func TestMiddlewarePropagatesCappedLevel(t *testing.T) {
	recv := make(chan []string, 4)
	back := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		recv <- r.Header["X-Criticality"]
	}))
	defer back.Close()
	tr := &Transport{Base: &http.Transport{}}
	defer tr.Base.(*http.Transport).CloseIdleConnections()
	backURL, _ := url.Parse(back.URL)
	rp := httputil.NewSingleHostReverseProxy(backURL)
	rp.Transport = tr
	th := New(Config{Limit: 8})
	front := httptest.NewServer(th.Middleware(MiddlewareOptions{Trusted: fromTrusted})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/forward" {
			rp.ServeHTTP(w, r)
			return
		}
		req, _ := http.NewRequestWithContext(r.Context(), "GET", back.URL, nil)
		resp, err := (&http.Client{Transport: tr}).Do(req)
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		resp.Body.Close()
	})))
	defer front.Close()
	public, trusted := publicClient(t), trustedClient(t)
	for _, c := range []struct {
		trusted bool
		claim   string
		want    string
	}{
		{false, "CRITICAL_PLUS", "CRITICAL"},
		{false, "junk", "CRITICAL"},
		{false, "sheddable", "SHEDDABLE"},
		{true, "CRITICAL_PLUS", "CRITICAL_PLUS"},
	} {
		cl := public
		if c.trusted {
			cl = trusted
		}
		for _, path := range []string{"/call", "/forward"} {
			if a := get(t, cl, front.URL+path, c.claim); a.code != 200 {
				t.Fatalf("%+v %s: %+v", c, path, a)
			}
			if got := <-recv; len(got) != 1 || got[0] != c.want {
				t.Errorf("trusted %v claiming %q, %s: the back received X-Criticality %q, want %q", c.trusted, c.claim, path, got, c.want)
			}
		}
	}
}

// Stamp changes a copy, never the caller's request, and allocates
// nothing for a request without the header at the default level.
func TestStamp(t *testing.T) {
	req := httptest.NewRequest("GET", "/", nil)
	if r2 := Stamp(req, "X-Criticality", Critical); r2 != req {
		t.Error("no header, default level: a copy")
	}
	if n := testing.AllocsPerRun(100, func() { Stamp(req, "X-Criticality", Critical) }); n != 0 {
		t.Errorf("%v allocations for a request left as it is", n)
	}
	req.Header["X-Criticality"] = []string{"CRITICAL_PLUS", "SHEDDABLE"}
	r2 := Stamp(req, "x-criticality", SheddablePlus)
	if got := req.Header["X-Criticality"]; len(got) != 2 || got[0] != "CRITICAL_PLUS" {
		t.Errorf("the caller's request changed: %q", got)
	}
	if got := r2.Header["X-Criticality"]; len(got) != 1 || got[0] != "SHEDDABLE_PLUS" {
		t.Errorf("the copy's header %q", got)
	}
	if c, ok := FromContext(r2.Context()); !ok || c != SheddablePlus {
		t.Errorf("the copy's context: %v %v", c, ok)
	}
	if _, ok := FromContext(req.Context()); ok {
		t.Error("the caller's context changed")
	}
	req.Header.Set("X-Criticality", "SHEDDABLE")
	if r3 := Stamp(req, "X-Criticality", Sheddable); reflect.ValueOf(r3.Header).UnsafePointer() != reflect.ValueOf(req.Header).UnsafePointer() {
		t.Error("a header already saying the level was copied")
	}
	if r5 := Stamp(req, "", SheddablePlus); r5.Header["X-Criticality"][0] != "SHEDDABLE_PLUS" {
		t.Errorf("the default header's name: %q", r5.Header["X-Criticality"])
	}
	if r4 := Stamp(req, "X-Criticality", 200); r4.Header["X-Criticality"][0] != "CRITICAL" {
		t.Errorf("an invalid level: %q", r4.Header["X-Criticality"])
	}
}

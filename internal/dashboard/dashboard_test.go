package dashboard

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate/floodgate/internal/recorder"
	"github.com/floodgate/floodgate/memstore"
	"github.com/floodgate/floodgate/rules"
	"github.com/floodgate/floodgate/service"
)

const token = "0123456789abcdef0123456789abcdef"

// testSource is a recorder and a service, as serve's.
type testSource struct {
	rec *recorder.Recorder
	svc *service.Service
}

func (s *testSource) Series(since int64) ([]recorder.Series, recorder.Latency, int64) {
	return s.rec.Since(since)
}
func (s *testSource) Tracks(since, upto int64) []recorder.TrackSeries {
	return s.rec.Tracks(since, upto)
}
func (s *testSource) Top(n int) []service.TopRule { return s.svc.TopLimited("", "", n) }
func (s *testSource) Health() Health              { return Health{Store: "memory", Ready: true} }
func (s *testSource) Rules() *Rules               { return &Rules{Limits: []Limit{}, Reload: Reload{OK: true}} }

// fakeNow is a settable clock of sessions.
type fakeNow struct {
	mu sync.Mutex
	t  time.Time
}

func (f *fakeNow) now() time.Time { f.mu.Lock(); defer f.mu.Unlock(); return f.t }
func (f *fakeNow) set(t time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.t = t
}

type fixture struct {
	srv   *httptest.Server
	dash  *Dashboard
	src   *testSource
	clock *fakeNow
}

// newFixture serves a dashboard with token tok (and the service's admin
// API) on a loopback port, TLS when tlsOn.
func newFixture(t *testing.T, tok string, tlsOn bool, opts Options) *fixture {
	t.Helper()
	d, err := rules.Parse("d.yaml", []byte("domain: d\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: hour\n      requests_per_unit: 1\n"))
	if err != nil {
		t.Fatal(err)
	}
	cfg, _ := rules.NewConfig(d)
	st := memstore.MustNew(memstore.Options{SweepInterval: -1})
	t.Cleanup(func() { st.Close() })
	svc := service.New(cfg, service.Options{Store: st, RecordDecisions: true})
	f := &fixture{src: &testSource{rec: svc.Recorder(), svc: svc}, clock: &fakeNow{t: time.Now()}}
	f.src.rec.Sample(time.Now().Unix())
	opts.Token, opts.Guard, opts.Admin, opts.Now = tok, svc.RequireToken, svc.AdminHandler(""), f.clock.now
	if opts.Interval == 0 {
		opts.Interval = 20 * time.Millisecond
	}
	f.dash = New(f.src, opts)
	h := f.dash.Mount(svc.AdminHandler(tok))
	if tlsOn {
		f.srv = httptest.NewTLSServer(h)
	} else {
		f.srv = httptest.NewServer(h)
	}
	t.Cleanup(func() { f.dash.Close(); f.srv.Close() })
	return f
}

// client is an HTTP client of f's server that keeps cookies and does not
// follow redirects.
func (f *fixture) client(t *testing.T) *http.Client {
	jar, _ := cookiejar.New(nil)
	c := *f.srv.Client() // a copy: Client returns the same one each time
	c.Jar = jar
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	c.Timeout = 30 * time.Second
	return &c
}

func (f *fixture) login(t *testing.T, c *http.Client, tok string) *http.Response {
	t.Helper()
	resp, err := c.PostForm(f.srv.URL+"/dashboard/login", url.Values{"token": {tok}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}

// get sends a request and returns its status and (for a stream, the start
// of) its body.
func get(t *testing.T, c *http.Client, method, u string, hdr map[string]string, body string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, method, u, strings.NewReader(body))
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.Header.Get("Content-Type") == "text/event-stream" {
		// the stream's first event is enough
		r := bufio.NewReader(resp.Body)
		var b strings.Builder
		for !strings.Contains(b.String(), "event: snapshot") {
			line, err := r.ReadString('\n')
			b.WriteString(line)
			if err != nil {
				break
			}
		}
		return resp.StatusCode, b.String()
	}
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// routes are every dashboard route, as a browser or script calls them.
var routes = []struct{ method, path, body string }{
	{"GET", "/dashboard/", ""},
	{"GET", "/dashboard/index.html", ""},
	{"GET", "/dashboard/app.js", ""},
	{"GET", "/dashboard/style.css", ""},
	{"GET", "/dashboard/whatif.js", ""},
	{"GET", "/dashboard/vendor/uplot/uPlot.iife.min.js", ""},
	{"GET", "/dashboard/vendor/uplot/uPlot.min.css", ""},
	{"GET", "/dashboard/vendor/uplot/LICENSE", ""},
	{"GET", "/dashboard/session", ""},
	{"GET", "/dashboard/events", ""},
	{"GET", "/dashboard/api/v1/rules", ""},
	{"GET", "/dashboard/api/v1/top", ""},
	{"POST", "/dashboard/api/v1/keys/inspect", `{"domain":"d","entries":[{"key":"user","value":"a"}]}`},
	{"HEAD", "/dashboard/", ""},
	{"GET", "/dashboard/nonexistent", ""},
}

// TestEveryRouteNeedsTheToken: without a session or the bearer token, with
// a wrong token, a forged or an expired cookie, every route answers 401
// and nothing of the page, the stream or the admin API; with the token
// or a session, each answers.
func TestEveryRouteNeedsTheToken(t *testing.T) {
	f := newFixture(t, token, false, Options{SessionTTL: time.Hour})
	anon := f.client(t)
	good := f.client(t)
	if resp := f.login(t, good, token); resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/dashboard/" {
		t.Fatalf("login: %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
	u, _ := url.Parse(f.srv.URL + "/dashboard/")
	sessionCookie := good.Jar.Cookies(u)[0]

	forged := f.client(t)
	forged.Jar.SetCookies(u, []*http.Cookie{{Name: cookieName, Value: "99999999999.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", Path: "/dashboard/"}})
	// the real cookie with its expiry pushed out: the MAC no longer fits
	exp, mac, _ := strings.Cut(sessionCookie.Value, ".")
	tampered := f.client(t)
	tampered.Jar.SetCookies(u, []*http.Cookie{{Name: cookieName, Value: exp + "9." + mac, Path: "/dashboard/"}})
	csrf := map[string]string{csrfHeader: "1"}
	for _, rt := range routes {
		for name, c := range map[string]*http.Client{"no credentials": anon, "forged cookie": forged, "tampered cookie": tampered} {
			code, body := get(t, c, rt.method, f.srv.URL+rt.path, csrf, rt.body)
			if code != http.StatusUnauthorized {
				t.Errorf("%s %s with %s: %d, want 401", rt.method, rt.path, name, code)
			}
			if strings.Contains(body, "uPlot") || strings.Contains(body, "event: snapshot") || strings.Contains(body, `"domains"`) {
				t.Errorf("%s %s with %s: leaks %q", rt.method, rt.path, name, body[:min(len(body), 80)])
			}
		}
		code, _ := get(t, anon, rt.method, f.srv.URL+rt.path, map[string]string{"Authorization": "Bearer wrong", csrfHeader: "1"}, rt.body)
		if code != http.StatusUnauthorized && code != http.StatusTooManyRequests {
			t.Errorf("%s %s with a wrong token: %d", rt.method, rt.path, code)
		}
		want := http.StatusOK
		if rt.path == "/dashboard/session" {
			want = http.StatusNoContent
		}
		if rt.path == "/dashboard/nonexistent" {
			want = http.StatusNotFound
		}
		if rt.path == "/dashboard/index.html" {
			want = http.StatusMovedPermanently // to ./
		}
		if code, body := get(t, good, rt.method, f.srv.URL+rt.path, csrf, rt.body); code != want {
			t.Errorf("%s %s with a session: %d %s, want %d", rt.method, rt.path, code, body[:min(len(body), 100)], want)
		}
	}
	// the page without a session is the login form, with no script
	code, body := get(t, anon, "GET", f.srv.URL+"/dashboard/", nil, "")
	if code != 401 || !strings.Contains(body, `action="/dashboard/login"`) || strings.Contains(body, "<script") {
		t.Errorf("login page: %d %s", code, body)
	}
	// the session expires
	f.clock.set(time.Now().Add(time.Hour + time.Second))
	for _, rt := range routes {
		if code, _ := get(t, good, rt.method, f.srv.URL+rt.path, csrf, rt.body); code != http.StatusUnauthorized {
			t.Errorf("%s %s with an expired session: %d, want 401", rt.method, rt.path, code)
		}
	}
}

// TestBearerTokenOpensEveryRoute: scripts send the admin token as the
// admin API takes it (a fresh server: the wrong tokens above are counted
// per network).
func TestBearerTokenOpensEveryRoute(t *testing.T) {
	f := newFixture(t, token, false, Options{})
	c := f.client(t)
	for _, rt := range routes {
		code, _ := get(t, c, rt.method, f.srv.URL+rt.path, map[string]string{"Authorization": "Bearer " + token, csrfHeader: "1"}, rt.body)
		if code >= 400 && rt.path != "/dashboard/nonexistent" {
			t.Errorf("%s %s with the token: %d", rt.method, rt.path, code)
		}
	}
}

// TestLoginThrottled: wrong tokens at the login form count as the admin
// API's failures; past the allowance even the right token is refused, and
// no cookie is set.
func TestLoginThrottled(t *testing.T) {
	f := newFixture(t, token, false, Options{})
	c := f.client(t)
	for i := range service.AdminFailureLimit {
		if resp := f.login(t, c, "wrong"); resp.StatusCode != 401 {
			t.Fatalf("wrong token %d: %d", i, resp.StatusCode)
		}
	}
	resp := f.login(t, c, token)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Errorf("right token after %d wrong ones: %d, Retry-After %q; want 429", service.AdminFailureLimit, resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	u, _ := url.Parse(f.srv.URL + "/dashboard/")
	if len(c.Jar.Cookies(u)) != 0 {
		t.Errorf("a refused login set a cookie")
	}
	// and the login form says why
	code, body := get(t, c, "POST", f.srv.URL+"/dashboard/login", map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, "token=x")
	if code != 429 || !strings.Contains(body, "too many wrong tokens") {
		t.Errorf("throttled login page: %d %s", code, body)
	}
}

// TestCookieAttributes: HttpOnly, SameSite=Strict, scoped to /dashboard/,
// Secure over TLS.
func TestCookieAttributes(t *testing.T) {
	for _, tlsOn := range []bool{false, true} {
		f := newFixture(t, token, tlsOn, Options{SessionTTL: 30 * time.Minute})
		resp := f.login(t, f.client(t), token)
		sc := resp.Header.Get("Set-Cookie")
		for _, want := range []string{"HttpOnly", "SameSite=Strict", "Path=/dashboard/", "Max-Age=1800"} {
			if !strings.Contains(sc, want) {
				t.Errorf("tls %v: Set-Cookie %q lacks %s", tlsOn, sc, want)
			}
		}
		if strings.Contains(sc, "Secure") != tlsOn {
			t.Errorf("tls %v: Set-Cookie %q", tlsOn, sc)
		}
		if strings.Contains(sc, token) {
			t.Errorf("the cookie holds the token: %q", sc)
		}
	}
}

// TestAPICallsNeedTheHeader: a page of another site cannot make the
// dashboard change anything: calls other than GET need the header and the
// same origin.
func TestAPICallsNeedTheHeader(t *testing.T) {
	f := newFixture(t, token, false, Options{})
	c := f.client(t)
	f.login(t, c, token)
	body := `{"domain":"d","entries":[{"key":"user","value":"a"}]}`
	for name, hdr := range map[string]map[string]string{
		"no header":     {"Content-Type": "application/json"},
		"other origin":  {csrfHeader: "1", "Origin": "https://evil.example"},
		"forged origin": {csrfHeader: "1", "Origin": "http://127.0.0.1:1"},
	} {
		if code, _ := get(t, c, "POST", f.srv.URL+"/dashboard/api/v1/keys/reset", hdr, body); code != http.StatusForbidden {
			t.Errorf("%s: %d, want 403", name, code)
		}
	}
	if code, body := get(t, c, "POST", f.srv.URL+"/dashboard/api/v1/keys/reset", map[string]string{csrfHeader: "1", "Origin": f.srv.URL}, body); code != 200 {
		t.Errorf("same origin with the header: %d %s", code, body)
	}
	// a login from another origin is refused too
	if code, _ := get(t, f.client(t), "POST", f.srv.URL+"/dashboard/login", map[string]string{"Content-Type": "application/x-www-form-urlencoded", "Origin": "https://evil.example"}, "token="+token); code != 403 {
		t.Errorf("login from another origin: %d, want 403", code)
	}
}

// TestNoTokenNoLogin: a server without an admin token guards nothing, as
// its admin API.
func TestNoTokenNoLogin(t *testing.T) {
	f := newFixture(t, "", false, Options{})
	if code, body := get(t, f.client(t), "GET", f.srv.URL+"/dashboard/", nil, ""); code != 200 || !strings.Contains(body, `id="whatif"`) || !strings.Contains(body, `src="whatif.js"`) {
		t.Errorf("page: %d", code)
	}
}

// readEvents returns the stream's events as they come.
func readEvents(t *testing.T, resp *http.Response) <-chan [2]string {
	ch := make(chan [2]string, 16)
	go func() {
		defer close(ch)
		r := bufio.NewReader(resp.Body)
		var ev, data string
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			line = strings.TrimRight(line, "\n")
			switch {
			case strings.HasPrefix(line, "event: "):
				ev = line[7:]
			case strings.HasPrefix(line, "data: "):
				data = line[6:]
			case line == "" && ev != "":
				ch <- [2]string{ev, data}
				ev, data = "", ""
			}
		}
	}()
	return ch
}

func openStream(t *testing.T, c *http.Client, u string) (*http.Response, <-chan [2]string) {
	t.Helper()
	resp, err := c.Get(u + "/dashboard/events")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != 200 {
		return resp, nil
	}
	return resp, readEvents(t, resp)
}

func next(t *testing.T, ch <-chan [2]string) ([2]string, bool) {
	t.Helper()
	select {
	case e, ok := <-ch:
		return e, ok
	case <-time.After(30 * time.Second):
		t.Fatal("no event in 30s")
		return [2]string{}, false
	}
}

// TestEventsCarryDeltas: the first snapshot carries the history, the
// next only the seconds after it.
func TestEventsCarryDeltas(t *testing.T) {
	f := newFixture(t, token, false, Options{})
	c := f.client(t)
	f.login(t, c, token)
	cnt := f.src.rec.For("k", recorder.ID{Domain: "d", Rule: "r"})
	base := time.Now().Unix() + 1
	cnt.Record(false, false, false, false)
	f.src.rec.Sample(base)
	_, ch := openStream(t, c, f.srv.URL)
	e, _ := next(t, ch)
	var s Snapshot
	if err := json.Unmarshal([]byte(e[1]), &s); err != nil || e[0] != "snapshot" {
		t.Fatalf("first event %q: %v", e, err)
	}
	if s.Time != base || len(s.Series) != 1 || s.Series[0].Counts[len(s.Series[0].Counts)-1][recorder.Refused] != 1 {
		t.Fatalf("first snapshot: %+v", s)
	}
	if s.Outcomes[recorder.Refused] != "refused" || !s.Panels.Admin || !s.Panels.Latency || s.Health.Store != "memory" || s.Rules == nil {
		t.Errorf("first snapshot: %+v", s)
	}
	cnt.Record(true, false, false, false)
	f.src.rec.Sample(base + 1)
	for {
		e, ok := next(t, ch)
		if !ok {
			t.Fatal("stream ended")
		}
		var s2 Snapshot
		json.Unmarshal([]byte(e[1]), &s2)
		if s2.Time == base {
			if len(s2.Series) != 0 {
				t.Fatalf("a snapshot with nothing new repeats %+v", s2.Series)
			}
			continue
		}
		if s2.Time != base+1 || len(s2.Series) != 1 || s2.Series[0].Start != base+1 || len(s2.Series[0].Counts) != 1 || s2.Series[0].Counts[0][recorder.Allowed] != 1 {
			t.Fatalf("next snapshot: %+v", s2)
		}
		break
	}
}

// TestEventsCarryTracks: a snapshot carries the source's tracks over the
// seconds of its rules' series, each second once; none is an empty list.
func TestEventsCarryTracks(t *testing.T) {
	f := newFixture(t, token, false, Options{})
	c := f.client(t)
	f.login(t, c, token)
	_, ch := openStream(t, c, f.srv.URL)
	e, _ := next(t, ch)
	if !strings.Contains(e[1], `"tracks":[]`) {
		t.Fatalf("a source without tracks: %s", e[1])
	}
	var n atomic.Uint64
	f.src.rec.Track("shed", []string{"CRITICAL"}, func(dst []uint64) { dst[0] = n.Load() })
	base := time.Now().Unix() + 1
	n.Add(4)
	f.src.rec.Sample(base)
	var got uint64
	for i := 0; got < 4 || i < 3; i++ { // and three more: no second again
		if got < 4 {
			i = 0
		}
		e, ok := next(t, ch)
		if !ok {
			t.Fatal("stream ended")
		}
		var s Snapshot
		json.Unmarshal([]byte(e[1]), &s)
		if len(s.Tracks) != 1 || s.Tracks[0].Name != "shed" || s.Tracks[0].Labels[0] != "CRITICAL" {
			t.Fatalf("tracks %+v", s.Tracks)
		}
		for _, c := range s.Tracks[0].Counts {
			got += uint64(c[0])
		}
		if got > 4 {
			t.Fatalf("4 shed counted %d times over: a second repeated (%+v)", got, s.Tracks)
		}
	}
}

// TestStreamEndsWithTheSession: a stream opened by a session ends when it
// expires, with an "expired" event.
func TestStreamEndsWithTheSession(t *testing.T) {
	f := newFixture(t, token, false, Options{SessionTTL: time.Hour, Interval: time.Hour})
	c := f.client(t)
	f.login(t, c, token)
	u, _ := url.Parse(f.srv.URL + "/dashboard/")
	exp, _, _ := strings.Cut(c.Jar.Cookies(u)[0].Value, ".")
	sec, _ := strconv.ParseInt(exp, 10, 64)
	f.clock.set(time.Unix(sec, 0).Add(-50 * time.Millisecond)) // 50ms left
	resp, ch := openStream(t, c, f.srv.URL)
	if ch == nil {
		t.Fatalf("stream: %d", resp.StatusCode)
	}
	if e, _ := next(t, ch); e[0] != "snapshot" {
		t.Fatalf("first event %q", e[0])
	}
	if e, _ := next(t, ch); e[0] != "expired" {
		t.Fatalf("event %q, want expired", e[0])
	}
	if _, ok := next(t, ch); ok {
		t.Fatal("the stream goes on after its session expired")
	}
}

// TestStreamsBoundedAndClosed: at most MaxStreams at once; Close ends them.
func TestStreamsBoundedAndClosed(t *testing.T) {
	f := newFixture(t, "", false, Options{MaxStreams: 2, Interval: time.Hour})
	c := f.client(t)
	_, a := openStream(t, c, f.srv.URL)
	_, b := openStream(t, c, f.srv.URL)
	next(t, a)
	next(t, b)
	if resp, _ := openStream(t, c, f.srv.URL); resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("third stream: %d, want 503", resp.StatusCode)
	}
	f.dash.Close()
	for _, ch := range []<-chan [2]string{a, b} {
		if _, ok := next(t, ch); ok {
			t.Error("a stream goes on after Close")
		}
	}
}

// withCookie is a client of f's server that sends the session cookie
// value v, as a copy of someone's cookie would be replayed.
func (f *fixture) withCookie(t *testing.T, v string) *http.Client {
	c := f.client(t)
	u, _ := url.Parse(f.srv.URL + "/dashboard/")
	c.Jar.SetCookies(u, []*http.Cookie{{Name: cookieName, Value: v, Path: "/dashboard/"}})
	return c
}

func cookieValue(t *testing.T, f *fixture, c *http.Client) string {
	t.Helper()
	u, _ := url.Parse(f.srv.URL + "/dashboard/")
	for _, k := range c.Jar.Cookies(u) {
		if k.Name == cookieName {
			return k.Value
		}
	}
	t.Fatal("no session cookie")
	return ""
}

// TestLogoutRevokesTheSession: logging out ends the session on the
// server, not only in the browser: a copy of its cookie, as first issued
// or as renewed since, opens nothing afterwards (page, API, stream); its
// open stream ends with "expired"; a logout posted from another origin
// is refused and revokes nothing; another session lives on.
func TestLogoutRevokesTheSession(t *testing.T) {
	f := newFixture(t, token, false, Options{SessionTTL: time.Hour, Interval: time.Hour})
	c := f.client(t)
	f.login(t, c, token)
	first := cookieValue(t, f, c)
	f.clock.set(time.Now().Add(time.Minute)) // a renewal with a later expiry
	if code, _ := get(t, c, "GET", f.srv.URL+"/dashboard/session", nil, ""); code != http.StatusNoContent {
		t.Fatalf("renewal: %d", code)
	}
	renewed := cookieValue(t, f, c)
	if renewed == first {
		t.Fatal("the renewal issued the same cookie")
	}
	other := f.client(t)
	f.login(t, other, token)

	_, ch := openStream(t, c, f.srv.URL)
	if e, _ := next(t, ch); e[0] != "snapshot" {
		t.Fatalf("first event %q", e[0])
	}
	// a cross-site page's logout: refused, nothing revoked
	if code, _ := get(t, c, "POST", f.srv.URL+"/dashboard/logout", map[string]string{"Origin": "https://evil.example"}, ""); code != http.StatusForbidden {
		t.Errorf("logout from another origin: %d, want 403", code)
	}
	if code, _ := get(t, f.withCookie(t, first), "GET", f.srv.URL+"/dashboard/api/v1/top", nil, ""); code != 200 {
		t.Fatalf("after a refused logout, the session: %d, want 200", code)
	}

	if code, _ := get(t, c, "POST", f.srv.URL+"/dashboard/logout", nil, ""); code != http.StatusSeeOther {
		t.Fatalf("logout: %d", code)
	}
	if e, _ := next(t, ch); e[0] != "expired" {
		t.Errorf("the open stream after logout: event %q, want expired", e[0])
	}
	if _, ok := next(t, ch); ok {
		t.Error("the stream goes on after its session logged out")
	}
	for name, v := range map[string]string{"first cookie": first, "renewed cookie": renewed} {
		rc := f.withCookie(t, v)
		for _, rt := range routes {
			code, body := get(t, rc, rt.method, f.srv.URL+rt.path, map[string]string{csrfHeader: "1"}, rt.body)
			if code != http.StatusUnauthorized {
				t.Errorf("%s %s with the %s of a logged-out session: %d, want 401", rt.method, rt.path, name, code)
			}
			if strings.Contains(body, "event: snapshot") || strings.Contains(body, `"domains"`) {
				t.Errorf("%s %s with the %s of a logged-out session leaks %q", rt.method, rt.path, name, body[:min(len(body), 80)])
			}
		}
	}
	if code, _ := get(t, other, "GET", f.srv.URL+"/dashboard/api/v1/top", nil, ""); code != 200 {
		t.Errorf("another session after the logout: %d, want 200", code)
	}
}

// TestRevokedSessionsBounded: a flood of logouts keeps at most maxRevoked
// ids; past it the key is drawn again, ending every session (their
// streams too) rather than growing; ids whose cookies have expired are
// dropped.
func TestRevokedSessionsBounded(t *testing.T) {
	clk := &fakeNow{t: time.Unix(1_800_000_000, 0)}
	s := newSessions(time.Hour, clk.now)
	login := func() session {
		rec := httptest.NewRecorder()
		s.issue(rec, httptest.NewRequest("POST", "/dashboard/login", nil), "")
		req := httptest.NewRequest("GET", "/dashboard/", nil)
		for _, c := range rec.Result().Cookies() {
			req.AddCookie(c)
		}
		ss, ok := s.check(req)
		if !ok {
			t.Fatal("a fresh cookie is not valid")
		}
		return ss
	}
	keep := login()
	for range maxRevoked {
		s.revoke(login())
	}
	if n := len(s.revoked); n != maxRevoked {
		t.Fatalf("%d ids kept, want %d", n, maxRevoked)
	}
	if ok, _ := s.live(keep); !ok {
		t.Fatal("a session never logged out died at the bound")
	}
	_, changed := s.live(keep)
	s.revoke(login()) // one more: the key is drawn again
	select {
	case <-changed:
	default:
		t.Error("the revocation did not wake the streams")
	}
	if n := len(s.revoked); n > maxRevoked {
		t.Errorf("%d ids kept past the bound %d", n, maxRevoked)
	}
	if ok, _ := s.live(keep); ok {
		t.Error("after the key was drawn again, an old session lives on")
	}
	// expired ids are dropped at the next logout
	for range 10 {
		s.revoke(login())
	}
	clk.set(clk.now().Add(2*time.Hour + time.Second))
	s.revoke(login())
	if n := len(s.revoked); n != 1 {
		t.Errorf("%d ids kept after their cookies expired, want 1", n)
	}
}

package dashboard

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"html"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// How a browser authenticates. It cannot send an Authorization header
// when it loads a page, nor with an EventSource, and a token in the URL
// would land in history, logs and Referer headers. So the page's login
// form POSTs the admin token once; the token is checked by the admin API's
// own guard (Options.Guard: the same comparison and the same throttle of
// failed attempts per client network), and the answer is a session
// cookie: HttpOnly (no script reads it), SameSite=Strict (no other site's
// page sends it, so no cross-site request forgery), Secure on TLS, scoped
// to /dashboard/, and valid for Options.SessionTTL. Its value is an
// expiry, a random session id and an HMAC-SHA256 of both under a key
// drawn at start, so live sessions take no memory, and a restart (or a
// new token) ends them all. The page renews its cookie while it is open,
// keeping its id. Logging out revokes the id on the server, not only in
// the browser: a copy of the cookie (renewed or not) is refused from then
// on, and the session's open event streams end. Revoked ids are kept
// until their cookie would have expired anyway, at most maxRevoked of
// them; past that the key is drawn again, which ends every session
// (everyone logs in again) rather than letting logouts grow memory. Requests carrying an Authorization
// header are checked by the guard as the admin API's are (scripts, tests).
//
// A request with neither a valid cookie nor an Authorization header gets
// 401 (the page's route, with the login form) and is not counted as a
// failed token: it guessed none. Calls of the admin API through
// /dashboard/api/ other than GET must carry the header
// X-Floodgate-Dashboard (a cross-site form cannot set one), and, when the
// browser sends Origin, come from the dashboard's own origin.

const (
	cookieName = "floodgate_dashboard"
	// csrfHeader must be on the page's admin calls other than GET.
	csrfHeader = "X-Floodgate-Dashboard"
	maxLogin   = 4 << 10 // bytes of a login form
	// maxRevoked bounds the ids of logged-out sessions still unexpired.
	maxRevoked = 4096
)

// session is how a request was authenticated.
type session struct {
	cookie  bool      // by the session cookie (else by bearer token, or no token is set)
	id      string    // the cookie's session id
	expires time.Time // the cookie's expiry
	gen     uint64    // the key's generation it was checked under
}

type sessions struct {
	ttl time.Duration
	now func() time.Time

	mu      sync.Mutex
	key     [32]byte
	gen     uint64           // counts the keys drawn
	revoked map[string]int64 // logged-out ids → their cookie's expiry (Unix s)
	changed chan struct{}    // closed (and replaced) at every revocation
}

func newSessions(ttl time.Duration, now func() time.Time) *sessions {
	s := &sessions{ttl: ttl, now: now, revoked: map[string]int64{}, changed: make(chan struct{})}
	rand.Read(s.key[:])
	return s
}

// mac is the cookie's HMAC of exp and id; s.mu held.
func (s *sessions) mac(exp int64, id string) []byte {
	m := hmac.New(sha256.New, s.key[:])
	io.WriteString(m, "floodgate-dashboard-session|"+strconv.FormatInt(exp, 10)+"|"+id)
	return m.Sum(nil)
}

// issue sets a session cookie on w: for session id, or a new one if id
// is empty.
func (s *sessions) issue(w http.ResponseWriter, r *http.Request, id string) {
	if id == "" {
		var b [16]byte
		rand.Read(b[:])
		id = base64.RawURLEncoding.EncodeToString(b[:])
	}
	exp := s.now().Add(s.ttl).Unix()
	s.mu.Lock()
	sum := s.mac(exp, id)
	s.mu.Unlock()
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: strconv.FormatInt(exp, 10) + "." + id + "." + base64.RawURLEncoding.EncodeToString(sum),
		Path: "/dashboard/", MaxAge: int(s.ttl.Seconds()), HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
}

// renew issues a fresh cookie, of the same session, to a request that
// came with one.
func (s *sessions) renew(w http.ResponseWriter, r *http.Request, ss session) {
	if ss.cookie {
		s.issue(w, r, ss.id)
	}
}

// check returns the request's session, if its cookie is valid, live and
// not logged out.
func (s *sessions) check(r *http.Request) (session, bool) {
	c, err := r.Cookie(cookieName)
	if err != nil {
		return session{}, false
	}
	expS, rest, ok := strings.Cut(c.Value, ".")
	id, sum, ok2 := strings.Cut(rest, ".")
	exp, err := strconv.ParseInt(expS, 10, 64)
	if !ok || !ok2 || id == "" || err != nil {
		return session{}, false
	}
	got, err := base64.RawURLEncoding.DecodeString(sum)
	if err != nil {
		return session{}, false
	}
	t := time.Unix(exp, 0)
	if !s.now().Before(t) {
		return session{}, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !hmac.Equal(got, s.mac(exp, id)) {
		return session{}, false
	}
	if _, out := s.revoked[id]; out {
		return session{}, false
	}
	return session{cookie: true, id: id, expires: t, gen: s.gen}, true
}

// live reports whether ss, once checked, still holds (not logged out, the
// key not drawn again), and returns a channel closed at the next
// revocation.
func (s *sessions) live(ss session) (bool, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !ss.cookie {
		return true, s.changed
	}
	_, out := s.revoked[ss.id]
	return !out && ss.gen == s.gen, s.changed
}

// revoke logs session ss out: its id is refused until its cookie would
// have expired. Past maxRevoked unexpired ids, the key is drawn again
// instead, which ends every session.
func (s *sessions) revoke(ss session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now().Unix()
	for id, exp := range s.revoked {
		if exp <= now {
			delete(s.revoked, id)
		}
	}
	// a renewed cookie of this session may live up to a TTL from now
	s.revoked[ss.id] = max(ss.expires.Unix(), s.now().Add(s.ttl).Unix())
	if len(s.revoked) > maxRevoked {
		rand.Read(s.key[:])
		s.gen++
		clear(s.revoked)
	}
	close(s.changed)
	s.changed = make(chan struct{})
}

// authed serves an authenticated request with f, and refuses the others.
func (d *Dashboard) authed(w http.ResponseWriter, r *http.Request, f func(http.ResponseWriter, *http.Request, session)) {
	if d.opts.Token == "" {
		f(w, r, session{})
		return
	}
	if s, ok := d.sessions.check(r); ok {
		f(w, r, s)
		return
	}
	if r.Header.Get("Authorization") != "" {
		d.opts.Guard(d.opts.Token, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { f(w, r, session{}) })).ServeHTTP(w, r)
		return
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="floodgate-admin"`)
	if p := strings.TrimPrefix(r.URL.Path, "/dashboard/"); (p == "" || p == "index.html") && r.Method == http.MethodGet {
		d.loginPage(w, http.StatusUnauthorized, "")
		return
	}
	http.Error(w, "log in at /dashboard/ (or send the admin bearer token)", http.StatusUnauthorized)
}

// login serves POST /dashboard/login: the form's token, checked by the
// guard, gets a session cookie.
func (d *Dashboard) login(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		methodNotAllowed(w, "POST")
		return
	}
	if !sameOrigin(r) {
		http.Error(w, "login from another origin refused", http.StatusForbidden)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxLogin)
	if err := r.ParseForm(); err != nil {
		d.loginPage(w, http.StatusBadRequest, "the login form could not be read: "+err.Error())
		return
	}
	if d.opts.Token == "" {
		http.Redirect(w, r, "/dashboard/", http.StatusSeeOther)
		return
	}
	r2 := r.Clone(r.Context())
	r2.Header.Set("Authorization", "Bearer "+r.PostForm.Get("token"))
	cw := &captured{header: http.Header{}}
	ok := false
	d.opts.Guard(d.opts.Token, http.HandlerFunc(func(http.ResponseWriter, *http.Request) { ok = true })).ServeHTTP(cw, r2)
	if !ok {
		msg := "wrong token"
		if cw.code == http.StatusTooManyRequests {
			w.Header().Set("Retry-After", cw.header.Get("Retry-After"))
			msg = "too many wrong tokens from this address: retry after " + cw.header.Get("Retry-After") + " s"
		}
		d.loginPage(w, cw.code, msg)
		return
	}
	d.sessions.issue(w, r, "")
	http.Redirect(w, r, "/dashboard/", http.StatusSeeOther)
}

// logout serves POST /dashboard/logout: the session is revoked on the
// server (a copy of its cookie no longer opens anything) and the cookie
// is cleared.
func (d *Dashboard) logout(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		methodNotAllowed(w, "POST")
		return
	}
	if !sameOrigin(r) {
		http.Error(w, "logout from another origin refused", http.StatusForbidden)
		return
	}
	if ss, ok := d.sessions.check(r); ok {
		d.sessions.revoke(ss)
	}
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: "", Path: "/dashboard/", MaxAge: -1, HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, "/dashboard/", http.StatusSeeOther)
}

// sameOrigin reports whether a request's Origin, when the browser sends
// one, is the dashboard's own.
func sameOrigin(r *http.Request) bool {
	o := r.Header.Get("Origin")
	if o == "" {
		return true
	}
	u, err := url.Parse(o)
	return err == nil && u.Host == r.Host
}

// api serves /dashboard/api/{path}: the admin API's path, for a request
// the dashboard has authenticated.
func (d *Dashboard) api(w http.ResponseWriter, r *http.Request, path string) {
	if d.opts.Admin == nil {
		http.Error(w, "no admin API on this server", http.StatusNotFound)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead && (r.Header.Get(csrfHeader) == "" || !sameOrigin(r)) {
		http.Error(w, "admin calls from the dashboard need the "+csrfHeader+" header and the dashboard's origin", http.StatusForbidden)
		return
	}
	r2 := r.Clone(r.Context())
	r2.URL.Path, r2.URL.RawPath = path, ""
	r2.RequestURI = ""
	r2.Header.Del("Cookie")
	r2.Header.Del("Authorization")
	d.opts.Admin.ServeHTTP(w, r2)
}

// captured is a ResponseWriter that keeps the status and headers.
type captured struct {
	header http.Header
	code   int
}

func (c *captured) Header() http.Header { return c.header }
func (c *captured) Write(b []byte) (int, error) {
	if c.code == 0 {
		c.code = http.StatusOK
	}
	return len(b), nil
}
func (c *captured) WriteHeader(code int) {
	if c.code == 0 {
		c.code = code
	}
}

// loginPage answers with the login form (no script: it works before the
// session exists), and msg above it.
func (d *Dashboard) loginPage(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	errHTML := ""
	if msg != "" {
		errHTML = `<p class="error" id="login-error">` + html.EscapeString(msg) + `</p>`
	}
	io.WriteString(w, `<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Floodgate dashboard: log in</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>body{font:15px system-ui,sans-serif;margin:4em auto;max-width:24em;color:#222}input{font:inherit;padding:.4em;width:100%;box-sizing:border-box;margin:.4em 0}button{font:inherit;padding:.4em 1.2em}.error{color:#b00}</style>
</head><body><h1>Floodgate</h1><p>The admin token of this server opens the dashboard.</p>`+errHTML+`
<form method="post" action="/dashboard/login"><label for="token">Admin token</label>
<input id="token" name="token" type="password" autocomplete="current-password" autofocus required>
<button type="submit" id="login">Log in</button></form></body></html>
`)
}

// Package dashboard serves Floodgate's live dashboard: a page of static
// assets embedded in the binary (plain JavaScript and the vendored uPlot
// charts, nothing from a CDN), a stream of server-sent events carrying a
// snapshot of the server every Interval, and the admin API the page's
// panels call, all behind the admin token (see auth.go).
//
// A server feeds it through a Source: serve has every panel's data, proxy
// the decisions, top keys and health. Routes, under /dashboard/:
//
//	GET  /dashboard/            the page (401 and a login form without a session)
//	GET  /dashboard/{asset}     its scripts, styles and uPlot
//	POST /dashboard/login       form field token → session cookie, 303 to the page
//	POST /dashboard/logout      revokes the session and clears the cookie
//	GET  /dashboard/session     renews the session cookie (204)
//	GET  /dashboard/events      text/event-stream: a Snapshot every Interval
//	*    /dashboard/api/{path}  the admin API's /{path} (Options.Admin)
package dashboard

import (
	"embed"
	"io/fs"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/floodgate/floodgate/internal/recorder"
	"github.com/floodgate/floodgate/service"
)

//go:embed assets
var assets embed.FS

// Source is what a server shows on the dashboard.
type Source interface {
	// Series returns the decisions per rule and second after since (unix
	// seconds), the decision latency, and the last second covered.
	Series(since int64) ([]recorder.Series, recorder.Latency, int64)
	// Top returns the n keys most often over each rule's limit.
	Top(n int) []service.TopRule
	// Health is the store's health.
	Health() Health
	// Rules are the loaded rules and the last reload; nil when the server
	// has none to show.
	Rules() *Rules
}

// Health is the store's health, as the dashboard shows it.
type Health struct {
	Store        string  `json:"store"`             // "memory" or "redis"
	Breaker      string  `json:"breaker,omitempty"` // "open" or "closed" (Redis)
	Calls        int64   `json:"calls,omitempty"`   // decisions asked of Redis
	Errors       int64   `json:"errors"`            // calls that failed
	Timeouts     int64   `json:"timeouts,omitempty"`
	Degraded     int64   `json:"degraded"` // decisions made by failure modes
	BreakerOpens int64   `json:"breaker_opens,omitempty"`
	TimeoutMS    float64 `json:"timeout_ms,omitempty"` // the timeout a call gets now
	LagMS        float64 `json:"lag_ms,omitempty"`     // how late this process ran lately
	Keys         int64   `json:"keys,omitempty"`       // keys held (memory)
	Bytes        int64   `json:"bytes,omitempty"`      // bytes of the key tables (memory)
	Refused      int64   `json:"refused,omitempty"`    // new keys refused at a cap (memory)
	Ready        bool    `json:"ready"`
	ReadyText    string  `json:"ready_text,omitempty"`
}

// Rules are the loaded rules, each with its source file:line, and the
// result of the last (re)load.
type Rules struct {
	Limits []Limit `json:"limits"`
	Reload Reload  `json:"reload"`
}

// Limit is a loaded rule.
type Limit struct {
	Domain string `json:"domain"`
	Name   string `json:"name"` // as GET /v1/rules and GET /v1/top name it
	File   string `json:"file"`
	Line   int    `json:"line"`
	Text   string `json:"text"` // what it limits: "10/1m token_bucket", "unlimited", ...
	Mode   string `json:"mode,omitempty"`
}

// Reload is the result of the last load of the rules.
type Reload struct {
	Time  time.Time `json:"time"`
	OK    bool      `json:"ok"`
	Error string    `json:"error,omitempty"`
}

// Options configure a dashboard.
type Options struct {
	// Token is the admin token ("" guards nothing, as the admin API).
	Token string
	// Guard wraps a handler with the admin API's bearer token check and
	// its throttle of failed attempts (service.Service.RequireToken).
	Guard func(token string, h http.Handler) http.Handler
	// Admin is the admin API the page's panels call (key inspector,
	// overrides, what if) through /dashboard/api/, without its token
	// guard (service.Service.AdminHandler("")): the dashboard has
	// authenticated each request itself, and a second guard would throttle
	// a logged-in operator for others' failures. nil hides those panels.
	Admin http.Handler
	// Server names the server on the page: "serve" or "proxy".
	Server string
	// Interval is the time between two snapshots (default 2s).
	Interval time.Duration
	// SessionTTL is how long a login lasts without renewal (default 1h);
	// the page renews it while it is open.
	SessionTTL time.Duration
	// Now is the clock of sessions (default time.Now).
	Now func() time.Time
	// MaxStreams bounds the event streams open at once (default 64).
	MaxStreams int
	// NoLatency hides the decision latency chart: the Source measures none.
	NoLatency bool
}

// Dashboard is the handler of /dashboard/.
type Dashboard struct {
	opts     Options
	src      Source
	sessions *sessions
	files    http.Handler
	streams  chan struct{} // a slot per open stream
	done     chan struct{} // closed by Close
	once     sync.Once
}

// New returns the dashboard of src.
func New(src Source, opts Options) *Dashboard {
	if opts.Interval <= 0 {
		opts.Interval = 2 * time.Second
	}
	if opts.SessionTTL <= 0 {
		opts.SessionTTL = time.Hour
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.MaxStreams <= 0 {
		opts.MaxStreams = 64
	}
	if opts.Guard == nil {
		opts.Guard = service.RequireToken
	}
	sub, _ := fs.Sub(assets, "assets")
	return &Dashboard{opts: opts, src: src, sessions: newSessions(opts.SessionTTL, opts.Now),
		files: http.StripPrefix("/dashboard/", http.FileServerFS(sub)), streams: make(chan struct{}, opts.MaxStreams),
		done: make(chan struct{})}
}

// Close ends the open event streams (a server's shutdown: http.Server
// does not cancel its handlers), and refuses new ones.
func (d *Dashboard) Close() { d.once.Do(func() { close(d.done) }) }

// Mount returns a handler serving the dashboard under /dashboard/ and
// admin for every other path.
func (d *Dashboard) Mount(admin http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/dashboard/", d)
	mux.Handle("/dashboard", http.RedirectHandler("/dashboard/", http.StatusMovedPermanently))
	mux.Handle("/", admin)
	return mux
}

// ServeHTTP serves the routes under /dashboard/.
func (d *Dashboard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	path := strings.TrimPrefix(r.URL.Path, "/dashboard/")
	h := w.Header()
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "same-origin") // no-referrer would make Chromium send Origin: null with the login form
	h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; frame-ancestors 'none'; form-action 'self'")
	switch {
	case path == "login":
		d.login(w, r)
	case path == "logout":
		d.logout(w, r)
	default:
		d.authed(w, r, func(w http.ResponseWriter, r *http.Request, s session) { d.route(w, r, path, s) })
	}
}

// route serves an authenticated request.
func (d *Dashboard) route(w http.ResponseWriter, r *http.Request, path string, s session) {
	switch {
	case path == "session":
		if r.Method != http.MethodGet {
			methodNotAllowed(w, "GET")
			return
		}
		d.sessions.renew(w, r, s)
		w.WriteHeader(http.StatusNoContent)
	case path == "events":
		if r.Method != http.MethodGet {
			methodNotAllowed(w, "GET")
			return
		}
		d.events(w, r, s)
	case strings.HasPrefix(path, "api/"):
		d.api(w, r, "/"+strings.TrimPrefix(path, "api/"))
	default:
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			methodNotAllowed(w, "GET, HEAD")
			return
		}
		if path == "" || path == "index.html" {
			d.sessions.renew(w, r, s)
			w.Header().Set("Cache-Control", "no-store")
		}
		d.files.ServeHTTP(w, r)
	}
}

func methodNotAllowed(w http.ResponseWriter, allow string) {
	w.Header().Set("Allow", allow)
	http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
}

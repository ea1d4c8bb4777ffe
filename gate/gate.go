// Package gate is the transport-neutral core of Floodgate's middleware:
// given the limits a service declares (which requests, keyed how, with
// which policy and what action over the limit), it decides a request —
// every matching limit, in one store call for all but requests matching
// dozens (see Config) — and reports what to answer.
// Packages httplimit and grpclimit put it in front of net/http handlers and
// grpc-go services; `floodgate proxy` puts it in front of any HTTP server.
//
// A gate decides on the in-process engine (the memory store, or Redis for
// a fleet), or asks a remote `floodgate serve` (or any Envoy rate limit
// service): see Remote, and package gate/remote for its gRPC client.
package gate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"path"
	"strings"
	"sync/atomic"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/internal/ratehdr"
	"github.com/floodgate/floodgate/memstore"
	"github.com/floodgate/floodgate/rules"
)

// Action is what a limit does to a request over it.
type Action uint8

// The actions.
const (
	// Deny refuses the request (HTTP 429 unless Limit.Status says
	// otherwise; gRPC RESOURCE_EXHAUSTED).
	Deny Action = iota
	// Ban refuses the request and, when the key goes over the ban
	// threshold, every request of the key for the rest of the threshold
	// interval and for the ban duration after it (Cloud Armor's
	// rate_based_ban).
	Ban
	// Delay queues the request until the limit frees a slot, up to
	// Limit.MaxDelay, and refuses it beyond (nginx's burst with delay).
	// It needs a bucket algorithm (token bucket, GCRA, leaky bucket).
	Delay
	// Redirect answers with a redirect to Limit.Redirect.
	Redirect
	// Shadow counts, logs and adds headers, and never refuses.
	Shadow
)

var actionNames = [...]string{"deny", "ban", "delay", "redirect", "shadow"}

// String returns the action's name, as rules files write it.
func (a Action) String() string {
	if int(a) < len(actionNames) {
		return actionNames[a]
	}
	return "unknown"
}

// ParseAction reads an action's name.
func ParseAction(s string) (Action, error) {
	for i, n := range actionNames {
		if s == n {
			return Action(i), nil
		}
	}
	return 0, fmt.Errorf("unknown action %q (want deny, ban, delay, redirect or shadow)", s)
}

// BanRule is a Ban action's threshold and duration: a key that sends more
// than Threshold requests within one Interval (fixed windows) is banned
// until the end of that interval plus Duration.
type BanRule struct {
	Threshold int64         // requests a key may send in one Interval, at least 1; the next one bans it
	Interval  time.Duration // the fixed window the requests are counted in, at least 1s
	Duration  time.Duration // how long a ban lasts after the end of its Interval, at least 1s
}

// Match selects the requests a limit applies to; every condition given
// must hold, and an empty Match selects every request.
type Match struct {
	// Hosts: exact names (case-insensitive, port ignored) or
	// "*.example.com" for any subdomain; an IPv6 address in brackets
	// ("[2001:db8::1]"), matched in any of its spellings.
	Hosts []string
	// PathPrefix: the path starts with it.
	PathPrefix string
	// Path: a pattern; "*" is one segment, a trailing "/**" any rest.
	// For gRPC the path is the full method, "/pkg.Service/Method".
	Path string
	// Methods: the HTTP methods (gRPC calls have none and never match a
	// Match with Methods).
	Methods []string
}

// A Limit is one limit the gate enforces.
type Limit struct {
	// Name names the limit in headers, logs and metrics; unique.
	Name string
	// Policy is the limit's rules, for the in-process engine. With
	// Domain set instead, the policy comes from the rules of that domain
	// (Config.Rules), matched by the key's descriptor entries; with
	// Config.Remote, the remote service's rules decide.
	Policy *floodgate.Policy
	// Domain, instead of Policy, names a domain of Config.Rules: the
	// limit's policy is that of the descriptor its key's entries match.
	Domain string
	// Match selects the requests the limit applies to.
	Match Match
	// Key is the limit's key: the parts joined (an empty Key is All).
	Key []Part
	// Cost is what one request consumes (default 1).
	Cost int64
	// Action over the limit (default Deny).
	Action Action
	// Status is the HTTP status of a refusal (default 429).
	Status int
	// MaxDelay bounds a Delay action's wait.
	MaxDelay time.Duration
	// Redirect is a Redirect action's target URL.
	Redirect       string
	RedirectStatus int // a Redirect action's status: 301, 302 (the default), 303, 307 or 308
	// Ban is a Ban action's threshold.
	Ban BanRule
	// ExemptKeys are keys (the parts' values joined by '|') never limited.
	ExemptKeys []string
	// ExemptNets are client networks never limited.
	ExemptNets []netip.Prefix
	// Blocked refuses every request the limit applies to, without asking
	// the store (envoyproxy/ratelimit's requests_per_unit: 0).
	Blocked bool

	blockedPolicy *floodgate.Policy // a blocked rules-file route's placeholder, for its window
}

// Config configures a Gate.
//
// A gate takes any number of limits: it finds a request's limits by host
// and leading path segments rather than trying each, so a gate of
// thousands of them (one per API endpoint, per tenant host) costs a
// request about what a gate of a few does. Rules files bound what they
// declare (rules.MaxRoutes routes a file).
//
// A request's limits are decided together, all or nothing: one refused
// means none consumes. They go to the store in one call of at most 48
// operations (a limit takes one, a Ban limit three: at least 16 limits),
// which on the memory store and on one Redis server is one atomic step
// (floodgate.DoGroup). A request matching more is decided in as many
// calls as it needs, in configuration order, every limit enforced; each
// call is atomic, and across calls all or nothing is kept by giving back
// what the earlier calls took when a later one refuses, so that
// meanwhile a concurrent request may see that capacity taken. The gate
// logs the first such request. With Remote, each call carries at most 48
// descriptors (floodgate serve takes 64), and the service's all or
// nothing holds within each call.
type Config struct {
	// Limits are the limits the gate enforces, in order; their Names are
	// unique.
	Limits []Limit
	// Store keeps the limits' state (default: a new in-memory store).
	Store floodgate.Store
	// Clock is the gate's time (default clock.Coarse).
	Clock floodgate.Clock
	// ClientIP finds and groups client addresses.
	ClientIP ClientIP
	// Rules resolves limits that name a Domain.
	Rules *rules.Config
	// Remote, when set, asks a rate limit service instead of the store
	// (gate/remote.New). Ban and Delay actions need the local engine.
	Remote Remote
	// User returns the authenticated user for the User part (default:
	// what WithUser stored).
	User func(ctx context.Context) (string, bool)
	// Route returns an HTTP request's route pattern for the Route part
	// (default: Request.Pattern, set by net/http's ServeMux for handlers
	// it routed to, else the path).
	Route func(r *http.Request) string
	// FailClosed refuses requests when the store (or remote service)
	// fails outright; by default they pass. Rules on Redis have their own
	// failure modes, which decide first (see floodgate.Rule).
	FailClosed bool
	// Logger receives shadow-mode refusals and store failures (at most one
	// line a second); default slog.Default().
	Logger *slog.Logger
}

// Gate decides requests against a set of limits. It is safe for
// concurrent use.
type Gate struct {
	cfg     Config
	limits  []*limit
	index   *routeIndex // nil: try every limit
	store   floodgate.Store
	clock   floodgate.Clock
	ownsMem *memstore.Store
	lastLog atomic.Int64
	split   atomic.Bool // a request's limits took several calls (logged once)
}

// limit is a Limit compiled.
type limit struct {
	*Limit
	parts       []compiledPart
	hosts       []string // lower-cased
	pathSegs    []string
	pathRest    bool
	methods     []string
	exempt      map[string]bool
	sfName      string
	policyItem  []string // RateLimit-Policy of the Policy alone, shared (len == cap)
	policyItems []string // its items, one per rule
	ruleNames   map[string]string
	banMarker   *floodgate.Policy
	banThresh   *floodgate.Policy
	banBurst    int64
	blockedLm   *rules.Limit // a Blocked limit's
}

// maxOps bounds the operations of one store call (a Ban limit takes
// three, any other one), and the descriptors of one call to a Remote
// service: a request needing more is decided in several calls (see
// Config). The stores take any number (the memory store's batches and
// groups, and Redis's BatchFunction, are unbounded), but Redis runs a call
// alone, its coalescer sends 64 decisions a call by default, and floodgate
// serve takes 64 descriptors a request: 48 keeps one request's call within
// those.
const maxOps = 48

// maxKeyParts bounds the parts of a limit's key.
const maxKeyParts = 8

// banGrain is the granularity of a ban's duration.
const banGrain = 10 * time.Millisecond

// New compiles cfg into a gate; it reports the first bad limit by index
// and field.
func New(cfg Config) (*Gate, error) {
	g := &Gate{cfg: cfg, store: cfg.Store, clock: cfg.Clock}
	if g.clock == nil {
		g.clock = clock.Coarse
	}
	if g.cfg.Logger == nil {
		g.cfg.Logger = slog.Default()
	}
	g.cfg.ClientIP.normalize()
	if g.store == nil && cfg.Remote == nil {
		ms, err := memstore.New(memstore.Options{Clock: g.clock})
		if err != nil {
			return nil, err
		}
		g.store, g.ownsMem = ms, ms
	}
	names := make(map[string]bool, len(cfg.Limits))
	for i := range cfg.Limits {
		l, err := g.compile(&cfg.Limits[i])
		if err != nil {
			g.Close()
			return nil, fmt.Errorf("gate: limits[%d] (%s): %w", i, cfg.Limits[i].Name, err)
		}
		if names[l.Name] {
			g.Close()
			return nil, fmt.Errorf("gate: limits[%d]: name %q used twice", i, l.Name)
		}
		names[l.Name] = true
		g.limits = append(g.limits, l)
	}
	if len(g.limits) >= indexMin {
		g.index = newRouteIndex(g.limits)
	}
	return g, nil
}

// Close releases the in-memory store the gate made for itself.
func (g *Gate) Close() {
	if g.ownsMem != nil {
		g.ownsMem.Close()
	}
}

// compile checks a Limit and derives what deciding it needs, phase by
// phase; the first error names the field.
func (g *Gate) compile(src *Limit) (*limit, error) {
	cp := *src
	l := &limit{Limit: &cp}
	if err := l.validate(); err != nil {
		return nil, err
	}
	if err := g.checkPolicy(l); err != nil {
		return nil, err
	}
	if err := g.compileAction(l); err != nil {
		return nil, err
	}
	if err := l.compileKey(); err != nil {
		return nil, err
	}
	if err := l.compileMatch(); err != nil {
		return nil, err
	}
	l.compileExempt()
	l.compileNames()
	return l, nil
}

// validate checks the limit's name, cost and status, setting defaults.
func (l *limit) validate() error {
	if l.Name == "" {
		return errors.New("name: empty")
	}
	if l.Cost == 0 {
		l.Cost = 1
	}
	if l.Cost < 0 {
		return fmt.Errorf("cost: %d is negative", l.Cost)
	}
	if l.Status == 0 {
		l.Status = http.StatusTooManyRequests
	}
	if l.Status < 400 || l.Status > 599 {
		return fmt.Errorf("status: %d is not an error status (400-599)", l.Status)
	}
	return nil
}

// checkPolicy checks that something decides the limit: the remote
// service, Blocked, its Policy, or its Domain's rules.
func (g *Gate) checkPolicy(l *limit) error {
	switch {
	case g.cfg.Remote != nil, l.Blocked:
	case l.Policy != nil:
	case l.Domain != "":
		if g.cfg.Rules == nil || g.cfg.Rules.Domain(l.Domain) == nil {
			return fmt.Errorf("domain: no rules for domain %q", l.Domain)
		}
	default:
		return errors.New("policy: none (set Policy, or Domain with Config.Rules, or Config.Remote)")
	}
	return nil
}

// actionSpec is what an action asks of a limit: the in-process engine
// (refused with Config.Remote), and its own fields, checked (and
// compiled) by fields.
type actionSpec struct {
	local  bool
	fields func(l *limit) error
}

// actionSpecs are the actions' specs, by Action.
var actionSpecs = [...]actionSpec{
	Deny:     {},
	Ban:      {local: true, fields: (*limit).compileBan},
	Delay:    {local: true, fields: (*limit).checkDelay},
	Redirect: {fields: (*limit).checkRedirect},
	Shadow:   {},
}

// compileAction checks the limit's action and the fields it reads.
func (g *Gate) compileAction(l *limit) error {
	if int(l.Action) >= len(actionSpecs) {
		return fmt.Errorf("action: unknown action %d", l.Action)
	}
	spec := actionSpecs[l.Action]
	if spec.local && g.cfg.Remote != nil {
		return fmt.Errorf("action: %s needs the in-process engine, not a remote service", l.Action)
	}
	if spec.fields == nil {
		return nil
	}
	return spec.fields(l)
}

// checkDelay checks a Delay action's MaxDelay and policy.
func (l *limit) checkDelay() error {
	if l.MaxDelay <= 0 {
		return errors.New("max_delay: a delay action needs a positive MaxDelay")
	}
	if l.Policy != nil && !l.Policy.CanDelay() {
		return fmt.Errorf("action: delay needs a bucket rule (token bucket, GCRA, leaky bucket); policy %q has windows only, which never delay: every request over it would be refused", l.Policy.Name())
	}
	return nil
}

// checkRedirect checks a Redirect action's URL and status.
func (l *limit) checkRedirect() error {
	if l.Redirect == "" {
		return errors.New("redirect: a redirect action needs a URL")
	}
	if l.RedirectStatus == 0 {
		l.RedirectStatus = http.StatusFound
	}
	switch l.RedirectStatus {
	case 301, 302, 303, 307, 308:
		return nil
	}
	return fmt.Errorf("redirect_status: %d is not a redirect", l.RedirectStatus)
}

// compileBan checks a Ban action's rule and makes its two policies.
func (l *limit) compileBan() error {
	b := l.Ban
	if b.Threshold < 1 || b.Interval < time.Second || b.Duration < time.Second {
		return errors.New("ban: threshold must be at least 1, interval and duration at least 1s")
	}
	grains := int64((b.Interval + b.Duration + banGrain - 1) / banGrain)
	var err error
	// The marker: a bucket refilling one grain per grain; a ban of k
	// grains empties k, and the key is free when it is full again.
	l.banMarker, err = floodgate.NewPolicy(l.Name+".ban", floodgate.Rule{Name: "ban", Algorithm: floodgate.TokenBucket, Limit: 1, Period: banGrain, Burst: grains})
	if err != nil {
		return fmt.Errorf("ban: %w", err)
	}
	// The threshold: a fixed window admitting one more than the
	// threshold, so that exactly one request per window (the one that
	// fills it) crosses, atomically in the store.
	l.banThresh, err = floodgate.NewPolicy(l.Name+".ban-threshold", floodgate.Rule{Name: "threshold", Algorithm: floodgate.FixedWindow, Limit: b.Threshold + 1, Period: b.Interval})
	if err != nil {
		return fmt.Errorf("ban: %w", err)
	}
	l.banBurst = grains
	return nil
}

// compileKey checks the key's parts and compiles them.
func (l *limit) compileKey() error {
	if len(l.Key) == 0 {
		l.Key = []Part{All()}
	}
	if len(l.Key) > maxKeyParts {
		return fmt.Errorf("key: %d parts; at most %d", len(l.Key), maxKeyParts)
	}
	seen := map[string]bool{}
	for i, p := range l.Key {
		if p.Kind > PartConst {
			return fmt.Errorf("key[%d]: unknown kind %d", i, p.Kind)
		}
		if (p.Kind == PartHeader || p.Kind == PartCookie || p.Kind == PartQuery) && p.Name == "" {
			return fmt.Errorf("key[%d]: a %s part needs a name", i, p.Kind)
		}
		cp := compilePart(p)
		if seen[cp.entry] {
			return fmt.Errorf("key[%d]: entry %q used twice", i, cp.entry)
		}
		seen[cp.entry] = true
		l.parts = append(l.parts, cp)
	}
	return nil
}

// compileMatch checks the Match and compiles its hosts, path and methods.
func (l *limit) compileMatch() error {
	for _, h := range l.Match.Hosts {
		l.hosts = append(l.hosts, matchHost(h))
	}
	if p := l.Match.Path; p != "" {
		if p[0] != '/' {
			return fmt.Errorf("match.path: %q does not start with /", p)
		}
		if strings.HasSuffix(p, "/**") {
			l.pathRest, p = true, strings.TrimSuffix(p, "/**")
		}
		l.pathSegs = strings.Split(p, "/")
	}
	if l.Match.PathPrefix != "" && l.Match.PathPrefix[0] != '/' {
		return fmt.Errorf("match.path_prefix: %q does not start with /", l.Match.PathPrefix)
	}
	for _, m := range l.Match.Methods {
		l.methods = append(l.methods, strings.ToUpper(m))
	}
	return nil
}

// compileExempt sets the exempt keys.
func (l *limit) compileExempt() {
	if len(l.ExemptKeys) == 0 {
		return
	}
	l.exempt = make(map[string]bool, len(l.ExemptKeys))
	for _, k := range l.ExemptKeys {
		l.exempt[k] = true
	}
}

// compileNames sets the names the RateLimit fields give the limit and
// its rules, and, with a Policy, its RateLimit-Policy item.
func (l *limit) compileNames() {
	l.sfName = sfName(l.Name)
	if l.Blocked {
		l.blockedLm = &rules.Limit{Name: l.Name, Blocked: true, Policy: l.blockedPolicy}
	}
	if l.Policy == nil {
		return
	}
	l.ruleNames = map[string]string{}
	rs := l.Policy.Rules()
	var items []string
	for _, r := range rs {
		name := l.Name
		if len(rs) > 1 {
			name += "/" + r.Name
		}
		sf := sfName(name)
		l.ruleNames[r.Name] = sf
		items = append(items, policyItem(sf, r))
	}
	l.policyItems = items
	l.policyItem = []string{strings.Join(items[:min(len(items), maxPolicyItems)], ", ")}
}

// matches reports whether the limit applies to r.
func (l *limit) matches(r *Request) bool {
	return l.match(r, hostOnly(r.host()), r.path())
}

// match reports whether the limit applies to r, whose host is host (its
// port and root dot removed: hostOnly) and path path (Request.path).
func (l *limit) match(r *Request, h, path string) bool {
	m := &l.Match
	if len(l.methods) > 0 {
		method := r.method()
		if method == "" {
			return false
		}
		ok := false
		for _, x := range l.methods {
			// "post" is no POST to HTTP, but many frameworks upper-case
			// the method and serve it as one: it must not pass POST's limit
			ok = ok || strings.EqualFold(x, method)
		}
		if !ok {
			return false
		}
	}
	if len(l.hosts) > 0 {
		ok := false
		for _, x := range l.hosts {
			if strings.HasPrefix(x, "*.") {
				ok = ok || len(h) > len(x)-1 && strings.EqualFold(h[len(h)-len(x)+1:], x[1:])
			} else {
				ok = ok || strings.EqualFold(h, x)
			}
		}
		if !ok {
			return false
		}
	}
	if m.PathPrefix != "" && !strings.HasPrefix(path, m.PathPrefix) {
		return false
	}
	if l.pathSegs != nil && !matchPath(l.pathSegs, l.pathRest, path) {
		return false
	}
	return true
}

// matchPath matches a path against pattern segments.
func matchPath(segs []string, rest bool, path string) bool {
	for i, s := range segs {
		if i > 0 {
			if path == "" || path[0] != '/' {
				return false
			}
			path = path[1:]
		}
		var seg string
		if j := strings.IndexByte(path, '/'); j >= 0 {
			seg, path = path[:j], path[j:]
		} else {
			seg, path = path, ""
		}
		if s != "*" && s != seg {
			return false
		}
	}
	if rest {
		return path == "" || path[0] == '/'
	}
	return path == ""
}

func (r *Request) host() string {
	if r.HTTP != nil {
		return r.HTTP.Host
	}
	if r.Raw != nil {
		return r.Raw.Host
	}
	if v := r.MD[":authority"]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// method is the HTTP method ("" for gRPC).
func (r *Request) method() string {
	if r.HTTP != nil {
		return r.HTTP.Method
	}
	if r.Raw != nil {
		return r.Raw.Method
	}
	return ""
}

func (r *Request) path() string {
	if r.HTTP != nil {
		return cleanPath(r.HTTP.URL.Path)
	}
	if r.Raw != nil {
		return r.Raw.Path
	}
	return r.FullMethod
}

// cleanPath returns p as a router that cleans paths serves it (net/http's
// ServeMux, http.FileServer): "//admin/x", "/z/../admin/x" and
// "/./admin/x" are "/admin/x", so they cannot pass a limit on "/admin/"; a
// trailing slash is kept. A clean path comes back as it is, unallocated.
func cleanPath(p string) string {
	if p == "" || p[0] != '/' {
		p = "/" + p
	}
	c := path.Clean(p)
	if c == "/" || p[len(p)-1] != '/' {
		return c
	}
	if len(p) == len(c)+1 && p[:len(c)] == c {
		return p // already clean, with its trailing slash
	}
	return c + "/"
}

func (r *Request) ctx() context.Context {
	if r.Ctx != nil {
		return r.Ctx
	}
	if r.HTTP != nil {
		return r.HTTP.Context()
	}
	return context.Background()
}

// clientAddr resolves (once) the request's client address.
func (g *Gate) clientAddr(r *Request) netip.Addr {
	if !r.clientSet {
		r.clientSet = true
		peer := PeerAddr(r.Peer)
		switch {
		case r.HTTP != nil:
			r.client = g.cfg.ClientIP.Resolve(peer, func(name string) []string { return r.HTTP.Header[http.CanonicalHeaderKey(name)] })
		case r.Raw != nil:
			r.client = g.cfg.ClientIP.Resolve(peer, func(name string) []string { return r.Raw.Header(http.CanonicalHeaderKey(name)) })
		default:
			r.client = g.cfg.ClientIP.Resolve(peer, func(name string) []string { return r.MD[strings.ToLower(name)] })
		}
	}
	return r.client
}

// value returns a part's value for r; ok is false when the part is absent
// and its fallback skips the limit.
func (g *Gate) value(r *Request, p *compiledPart, buf []byte) (v []byte, ok bool) {
	var s string
	found := true
	switch p.Kind {
	case PartAll:
		return append(buf, '*'), true
	case PartIP:
		return g.cfg.ClientIP.appendGroup(buf, g.clientAddr(r)), true
	case PartConst:
		return appendValue(buf, p.Name), true
	case PartHeader:
		vs := r.headerValues(p.canon, p.lower)
		found = len(vs) > 0 && vs[0] != ""
		if found {
			s = vs[0]
		}
	case PartCookie:
		s, found = cookie(r.headerValues("Cookie", "cookie"), p.Name)
		if r.HTTP == nil && r.Raw == nil {
			found = false // gRPC has no cookies
		}
	case PartQuery:
		switch {
		case r.HTTP != nil:
			s, found = query(r.HTTP.URL.RawQuery, p.Name)
		case r.Raw != nil:
			s, found = query(r.Raw.RawQuery, p.Name)
		default:
			found = false
		}
	case PartPath:
		s = r.path()
	case PartRoute:
		switch {
		case r.Raw != nil:
			s = r.Raw.Path
		case r.HTTP == nil:
			s = r.FullMethod
		case g.cfg.Route != nil:
			s = g.cfg.Route(r.HTTP)
		case r.HTTP.Pattern != "":
			s = r.HTTP.Pattern
		default:
			s = r.path() // cleaned, as Path: "//x" and "/./x" are no routes of their own
		}
	case PartMethod:
		if s = r.method(); s == "" {
			s = r.FullMethod
		}
	case PartHost:
		s = hostOnly(r.host())
	case PartUser:
		if g.cfg.User != nil {
			s, found = g.cfg.User(r.ctx())
		} else {
			s, found = UserFrom(r.ctx())
		}
	}
	if found {
		return appendValue(buf, s), true
	}
	switch p.Missing {
	case MissingShared:
		return append(buf, "-"...), true
	case MissingSkip:
		return buf, false
	}
	buf = append(buf, "ip:"...)
	return g.cfg.ClientIP.appendGroup(buf, g.clientAddr(r)), true
}

// Outcome is one limit's part of a verdict.
type Outcome struct {
	Limit *Limit // the limit that applied
	Key   string // the key: the parts' values joined by '|'
	// Decision is the store's (or a failure mode's) answer. It is the zero
	// Decision, Allowed false, when nothing was decided: a rules-file limit
	// whose entries match no limit of its domain (an exempt value
	// included), or an unlimited one.
	// Read Over, not Decision.Allowed, for whether the limit refused.
	Decision floodgate.Decision
	// Banned: the key is banned (or was just banned by this request).
	Banned bool
	// Over: the limit refuses the request (shadow limits never do, but
	// their Decision says what they would have done).
	Over bool

	l      *limit
	policy *floodgate.Policy
	skey   string // the store's key
	name   string // the rule's name as a structured-field string
	ruleLm *rules.Limit
	op     int // index of the main op, or -1
	banOp  int // index of the ban marker's peek, or -1
	thrOp  int // index of the threshold's charge, or -1
}

// Decided reports whether the limit decided the request: false when
// nothing was (a rules-file limit whose entries match no limit of its
// domain, an exempt value included, or an unlimited one), and Decision is
// then the zero Decision.
func (o *Outcome) Decided() bool {
	return o.op >= 0 || o.ruleLm != nil || o.Banned
}

// shadow reports whether the outcome's limit never refuses: a Shadow
// action, or a rule in shadow mode.
func (o *Outcome) shadow() bool {
	return o.l.Action == Shadow || o.ruleLm != nil && o.ruleLm.ShadowMode
}

// Verdict is what the gate decided for a request.
type Verdict struct {
	// Allowed: let the request through (after Delayed, already waited).
	Allowed bool
	// Deciding is the outcome that refused the request, or that the
	// headers describe when it passes (the one with the fewest remaining).
	Deciding *Outcome
	// Outcomes are the matching limits' outcomes.
	Outcomes []Outcome
	// Delayed is how long a Delay action held the request.
	Delayed time.Duration
	// Soft: a limit in soft or elastic mode let the request past its
	// soft line.
	Soft bool
	// Err is a store or remote failure (the request passed unless
	// Config.FailClosed; either way each limit that asked has the failure
	// policy's Decision, marked Degraded), or the context's error when the
	// client left while a Delay held it (Allowed false and Deciding nil).
	Err error
	// Headers from a remote service (RateLimit fields it computed).
	RemoteHeaders [][2]string

	buf [4]Outcome
}

// StoreUnavailable reports whether the request was refused because the
// store (or the remote service) could not be asked, not because a limit
// was reached: the gate failing closed on a store error
// (Config.FailClosed), or a rule failing closed
// (floodgate.Rule.OnStoreFailure) while its store could not answer.
// Deciding's Decision then has ReasonStoreUnavailable. Such a refusal is
// answered 503 Service Unavailable (gRPC UNAVAILABLE), whatever the
// limit's Status or Action, and Headers gives it Retry-After alone.
func (v *Verdict) StoreUnavailable() bool {
	return !v.Allowed && v.Deciding != nil && v.Deciding.Decision.Reason == floodgate.ReasonStoreUnavailable
}

// Degraded reports whether a failure mode rather than the store decided
// the request, or one of its limits: the store (or the remote service)
// failed and the gate's failure policy decided (Err), or a rule's
// OnStoreFailure did while its store could not answer (an outcome's
// Decision.Degraded). The request may have passed (failing open or
// local) or been refused; for metrics, a count of decisions made without
// the store.
func (v *Verdict) Degraded() bool {
	if v.Err != nil && (v.Allowed || v.Deciding != nil) {
		return true
	}
	for i := range v.Outcomes {
		if v.Outcomes[i].Decision.Degraded {
			return true
		}
	}
	return false
}

// Check decides r, waiting for Delay actions, and fills v. A Verdict may
// be reused (from a sync.Pool, say): Check resets it.
func (g *Gate) Check(r *Request, v *Verdict) {
	ctx := r.ctx()
	v.Allowed, v.Deciding, v.Delayed, v.Soft, v.Err = true, nil, 0, false, nil
	v.Outcomes, v.RemoteHeaders = v.buf[:0], v.RemoteHeaders[:0]
	if len(g.limits) == 0 {
		return
	}
	host, path := hostOnly(r.host()), r.path()
	if g.index == nil {
		for _, l := range g.limits {
			g.consider(r, v, l, host, path)
		}
	} else {
		var lb [8][]int
		lists := g.index.lookup(host, path, lb[:0])
		for i := nextCandidate(lists); i >= 0; i = nextCandidate(lists) {
			g.consider(r, v, g.limits[i], host, path)
		}
	}
	if len(v.Outcomes) > 0 {
		if g.cfg.Remote != nil {
			g.remote(ctx, v)
			if v.Err != nil {
				g.storeFailed(v, true)
			}
		} else {
			g.local(ctx, v)
		}
	}
}

// consider adds l's outcome to v if l applies to r (whose host and path
// are host and path).
func (g *Gate) consider(r *Request, v *Verdict, l *limit, host, path string) {
	if !l.match(r, host, path) {
		return
	}
	if len(l.ExemptNets) > 0 {
		a := g.clientAddr(r)
		for _, n := range l.ExemptNets {
			if n.Contains(a) {
				return
			}
		}
	}
	var kb [128]byte
	key, ok := kb[:0], true
	for i := range l.parts {
		if i > 0 {
			key = append(key, '|')
		}
		if key, ok = g.value(r, &l.parts[i], key); !ok {
			return
		}
	}
	if l.exempt != nil && l.exempt[string(key)] {
		return
	}
	v.Outcomes = append(v.Outcomes, Outcome{Limit: l.Limit, Key: string(key), l: l, op: -1, banOp: -1, thrOp: -1})
}

// local decides the outcomes on the store: in one call of at most maxOps
// operations, or, for a request matching more limits, in as many as it
// takes (see Config).
func (g *Gate) local(ctx context.Context, v *Verdict) {
	// What each outcome asks of the store: o.op opPending for a decision
	// (and a ban's two operations), -1 for none.
	nops := 0
	now := g.clock.NowMicro()
	for i := range v.Outcomes {
		o := &v.Outcomes[i]
		l := o.l
		o.policy, o.name, o.skey = l.Policy, "", o.Key
		if l.Blocked {
			o.ruleLm = l.blockedLm
			o.Decision = blockedDecision(l.blockedLm, now)
			continue
		}
		if l.Policy == nil {
			// A rules domain decides: the parts are descriptor entries.
			entries := make([]rules.Entry, len(l.parts))
			vals := splitKey(o.Key, len(l.parts))
			for j := range l.parts {
				entries[j] = rules.Entry{Key: l.parts[j].entry, Value: unescape(vals[j])}
			}
			m := g.cfg.Rules.Match(l.Domain, entries)
			if m == nil || m.Limit.Unlimited {
				continue
			}
			o.ruleLm = m.Limit
			if m.Limit.Blocked {
				o.name = sfName(m.Limit.Name)
				o.Decision = blockedDecision(m.Limit, now)
				continue
			}
			// The service's key: serve and proxy share state.
			o.policy, o.skey = m.Limit.Policy, l.Domain+"\x00"+m.Key
			o.name = sfName(m.Limit.Name)
		}
		o.op = opPending
		nops += opsOf(o)
	}
	// The operations, call by call: the outcomes in order, as many as fit
	// in maxOps; in each call the all-or-nothing members (the decisions
	// that can refuse) come last, side by side, as a Redis batch needs a
	// group's members to be.
	var opBuf [4]floodgate.Op
	var callBuf [1]opCall
	ops, calls := opBuf[:0], callBuf[:0]
	if nops > len(opBuf) {
		ops = make([]floodgate.Op, 0, nops)
	}
	for i := 0; i < len(v.Outcomes); {
		j, n := i, 0
		for ; j < len(v.Outcomes); j++ {
			k := opsOf(&v.Outcomes[j])
			if n+k > maxOps {
				break
			}
			n += k
		}
		c := opCall{start: len(ops)}
		for k := i; k < j; k++ {
			o := &v.Outcomes[k]
			if o.op != opPending {
				continue
			}
			l := o.l
			if l.banMarker != nil {
				o.banOp = len(ops)
				ops = append(ops, l.banMarker.Op(floodgate.OpPeek, o.skey, l.banBurst, 0))
				o.thrOp = len(ops)
				ops = append(ops, l.banThresh.Op(floodgate.OpCharge, o.skey, 1, 0))
			}
			switch {
			case l.Action == Delay:
				o.op = len(ops)
				ops = append(ops, o.policy.Op(floodgate.OpReserve, o.skey, l.Cost, l.MaxDelay))
			case o.shadow():
				o.op = len(ops)
				ops = append(ops, o.policy.Op(floodgate.OpAllow, o.skey, l.Cost, 0))
			}
		}
		c.members = len(ops)
		for k := i; k < j; k++ {
			if o := &v.Outcomes[k]; o.op == opPending { // the others have theirs
				o.op = len(ops)
				ops = append(ops, o.policy.Op(floodgate.OpAllow, o.skey, o.l.Cost, 0))
			}
		}
		c.end = len(ops)
		if c.end > c.start {
			calls = append(calls, c)
		}
		i = j
	}
	if len(calls) > 1 && g.split.CompareAndSwap(false, true) {
		g.cfg.Logger.Warn("floodgate: a request matched more limits than one store call takes; they are decided in several calls, each atomic, all or nothing across them by giving back (logged once)",
			"limits", len(v.Outcomes), "calls", len(calls))
	}
	var one [1]floodgate.Decision
	var decs []floodgate.Decision
	var err error
	switch len(ops) {
	case 0:
	case 1:
		one[0], err = g.store.Do(ctx, now, ops[0])
		decs = one[:]
	default:
		// The store keeps neither slice, but escape analysis cannot see
		// through the interface: give it heap copies.
		batch, out := make([]floodgate.Op, len(ops)), make([]floodgate.Decision, len(ops))
		copy(batch, ops)
		for ci := range calls {
			if err = g.decide(ctx, now, batch, out, &calls[ci]); err != nil {
				// The store failed: what the earlier calls took stands if
				// the request passes, and is given back if it does not.
				if g.cfg.FailClosed {
					g.refund(ctx, now, ops, v.Outcomes, calls[:ci], out)
				}
				break
			}
		}
		decs = out
	}
	if err != nil {
		v.Err = err
		g.logf("floodgate: the store failed; the gate's failure policy decides meanwhile", "err", err)
		g.storeFailed(v, false)
		return
	}
	var banOps []floodgate.Op
	for i := range v.Outcomes {
		o := &v.Outcomes[i]
		l := o.l
		if o.op >= 0 {
			o.Decision = decs[o.op]
		}
		if o.banOp >= 0 {
			marker, thr := &decs[o.banOp], &decs[o.thrOp]
			if !marker.Allowed {
				o.Banned = true
				o.Decision.Allowed = false
				o.Decision.RetryAfter = max(o.Decision.RetryAfter, marker.RetryAfter)
			}
			if thr.Allowed && thr.Remaining == 0 {
				// This request filled the threshold window: ban until
				// its end plus the duration, beyond any ban in force.
				until := thr.ResetAfter + l.Ban.Duration
				held := time.Duration(0)
				if !marker.Allowed {
					held = marker.RetryAfter
				}
				if until > held {
					grains := int64((until - held + banGrain - 1) / banGrain)
					banOps = append(banOps, l.banMarker.Op(floodgate.OpCharge, ops[o.banOp].Key, grains, 0))
				}
				o.Banned = true
				o.Decision.Allowed = false
				o.Decision.RetryAfter = max(o.Decision.RetryAfter, until)
			}
		}
		if !o.Decided() {
			continue
		}
		if o.Decision.Excess {
			v.Soft = true
		}
		shadow := o.shadow()
		o.Over = !o.Decision.Allowed && !shadow
		if !o.Decision.Allowed && shadow {
			g.logf("floodgate: a shadow limit would refuse a request", "limit", l.Name)
		}
		if o.Over {
			v.Allowed = false
		}
	}
	if len(banOps) > 0 {
		if err := g.store.DoBatch(context.WithoutCancel(ctx), now, banOps, make([]floodgate.Decision, len(banOps))); err != nil {
			g.logf("floodgate: recording a ban failed", "err", err)
		}
	}
	if !v.Allowed {
		// All or nothing: give back what the admitted limits took (a group
		// refused took nothing; one admitted did, if a ban, a blocked rule,
		// a delay or another call's group refuses the request).
		g.refund(ctx, now, ops, v.Outcomes, calls, decs)
	}
	v.Deciding = deciding(v.Outcomes)
	if !v.Allowed {
		return
	}
	// Delay actions: wait for the reserved slot.
	var wait time.Duration
	for i := range v.Outcomes {
		if o := &v.Outcomes[i]; o.op >= 0 && o.l.Action == Delay && o.Decision.Delay > wait {
			wait = o.Decision.Delay
		}
	}
	if wait > 0 {
		if err := g.clock.Sleep(ctx, wait); err != nil {
			// The client went away: give the slots back.
			var refunds []floodgate.Op
			for i := range v.Outcomes {
				if o := &v.Outcomes[i]; o.op >= 0 && ops[o.op].Cost > 0 {
					refunds = append(refunds, floodgate.Op{Policy: ops[o.op].Policy, Key: ops[o.op].Key, Kind: floodgate.OpRefund, Cost: ops[o.op].Cost})
				}
			}
			g.store.DoBatch(context.WithoutCancel(ctx), g.clock.NowMicro(), refunds, make([]floodgate.Decision, len(refunds))) //nolint:errcheck // best effort
			v.Allowed, v.Err, v.Deciding = false, err, nil
			return
		}
		v.Delayed = wait
	}
}

// blockedDecision is a blocked limit's refusal (requests_per_unit: 0) at
// now: remaining 0 until its window's end (a fixed window's, aligned to
// the epoch, as the service says it), or for a whole window.
func blockedDecision(lm *rules.Limit, now int64) floodgate.Decision {
	d := floodgate.Decision{Rule: lm.Name, Reason: floodgate.ReasonLimited, RetryAfter: time.Second, ResetAfter: time.Second}
	if lm.Policy == nil {
		return d // a Limit made Blocked in Go states no window
	}
	r := lm.Policy.Rules()[0]
	wait := ratehdr.Window(r)
	if pm := r.Period.Microseconds(); r.Algorithm == floodgate.FixedWindow && r.Calendar == "" && pm > 0 {
		wait = time.Duration(pm-now%pm) * time.Microsecond
	}
	d.RetryAfter, d.ResetAfter = wait, wait
	return d
}

// storeFailed completes v, decided by the gate's failure policy because
// the store (remote: the rate limit service) failed: the request passes,
// or, with Config.FailClosed, is refused for ReasonStoreUnavailable, the
// first outcome deciding, as it always has. Each limit that asked (remote:
// every one) gets that decision, marked Degraded, rather than the zero
// Decision (a refusal that never happened) its failed call left it.
func (g *Gate) storeFailed(v *Verdict, remote bool) {
	closed := g.cfg.FailClosed
	d := floodgate.Decision{Allowed: true, Degraded: true}
	if closed {
		d = floodgate.Decision{Reason: floodgate.ReasonStoreUnavailable, RetryAfter: time.Second, Degraded: true}
	}
	for i := range v.Outcomes {
		if o := &v.Outcomes[i]; remote || o.op >= 0 {
			o.Decision, o.Over = d, closed && !o.shadow()
		}
	}
	v.Allowed, v.Deciding = !closed, nil
	// a blocked limit (requests_per_unit: 0) asks no store: it refuses
	// still, as a limit, not as the store's failure
	if !remote {
		for i := range v.Outcomes {
			if o := &v.Outcomes[i]; o.op < 0 && o.ruleLm != nil && o.ruleLm.Blocked && !o.shadow() {
				o.Over = true
				v.Allowed, v.Deciding = false, o
				return
			}
		}
	}
	if closed {
		v.Deciding = &v.Outcomes[0]
		v.Deciding.Over = true
		v.Deciding.Decision = d
	}
}

// opPending marks, while local lays out the operations, an outcome whose
// decision has no place yet.
const opPending = -2

// opsOf is the number of store operations an outcome takes while local
// lays them out: one for its decision if it is pending and, for a ban,
// two more.
func opsOf(o *Outcome) int {
	switch {
	case o.op != opPending:
		return 0
	case o.l.banMarker != nil:
		return 3
	}
	return 1
}

// An opCall is one store call: the operations ops[start:end], those from
// members on the all-or-nothing group's.
type opCall struct {
	start, members, end int
	admitted            bool // the group was admitted: every member allowed
}

// grouped reports whether the call's members are a group: two or more.
func (c *opCall) grouped() bool { return c.end-c.members >= 2 }

// decide makes call c, putting ops[i]'s decision in decs[i].
func (g *Gate) decide(ctx context.Context, now int64, ops []floodgate.Op, decs []floodgate.Decision, c *opCall) error {
	batch, out := ops[c.start:c.end], decs[c.start:c.end]
	switch {
	case len(batch) == 1:
		var err error
		out[0], err = g.store.Do(ctx, now, batch[0])
		return err
	case c.grouped():
		// The limits that can refuse are all or nothing, in one atomic
		// step where the store can (floodgate.DoGroup): a request refused
		// by one never holds the others' capacity, even for a moment.
		group := make([]bool, len(batch))
		for k := c.members - c.start; k < len(group); k++ {
			group[k] = true
		}
		var err error
		c.admitted, err = floodgate.DoGroup(ctx, g.store, now, batch, group, out)
		return err
	}
	return g.store.DoBatch(ctx, now, batch, out)
}

// refund gives back what the outcomes' decisions in calls took, for a
// request refused: each admitted decision but those of a refused group
// (which took nothing), a banned key's included: a refused request spends
// no quota. decs[i] is ops[i]'s decision, as the store made it (a ban
// refuses what its limit admitted). It is best effort, as a refund can
// only be.
func (g *Gate) refund(ctx context.Context, now int64, ops []floodgate.Op, outcomes []Outcome, calls []opCall, decs []floodgate.Decision) {
	var refunds []floodgate.Op
	for i := range outcomes {
		o := &outcomes[i]
		if o.op < 0 || ops[o.op].Cost <= 0 {
			continue
		}
		c := callOf(calls, o.op)
		if c == nil || c.grouped() && o.op >= c.members && !c.admitted {
			continue
		}
		if decs[o.op].Allowed {
			refunds = append(refunds, floodgate.Op{Policy: ops[o.op].Policy, Key: ops[o.op].Key, Kind: floodgate.OpRefund, Cost: ops[o.op].Cost})
		}
	}
	if len(refunds) > 0 {
		if err := g.store.DoBatch(context.WithoutCancel(ctx), now, refunds, make([]floodgate.Decision, len(refunds))); err != nil {
			g.logf("floodgate: a refund failed", "err", err)
		}
	}
}

// callOf returns the call of calls that made ops[k], or nil.
func callOf(calls []opCall, k int) *opCall {
	for i := range calls {
		if c := &calls[i]; c.start <= k && k < c.end {
			return c
		}
	}
	return nil
}

// deciding picks the outcome the response describes: over with the
// longest wait, else the fewest remaining.
func deciding(os []Outcome) *Outcome {
	var best *Outcome
	for i := range os {
		o := &os[i]
		if !o.Decided() {
			continue
		}
		switch {
		case best == nil:
			best = o
		case o.Over != best.Over:
			if o.Over {
				best = o
			}
		case o.Over:
			if o.Decision.RetryAfter > best.Decision.RetryAfter {
				best = o
			}
		case o.Decision.Remaining < best.Decision.Remaining:
			best = o
		}
	}
	return best
}

func unescape(s string) string {
	if !strings.Contains(s, "%") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) {
			hi, lo := unhex(s[i+1]), unhex(s[i+2])
			if hi >= 0 && lo >= 0 {
				b.WriteByte(byte(hi<<4 | lo))
				i += 2
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func unhex(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'A' && c <= 'F':
		return int(c - 'A' + 10)
	}
	return -1
}

// logf logs at most one line a second.
func (g *Gate) logf(msg, k string, v any) {
	now := time.Now().UnixNano()
	last := g.lastLog.Load()
	if now-last < int64(time.Second) || !g.lastLog.CompareAndSwap(last, now) {
		return
	}
	g.cfg.Logger.Warn(msg, k, v)
}

// Lift ends a ban on key under the named limit; the key's counts are
// forgotten too, so it starts afresh.
func (g *Gate) Lift(ctx context.Context, limitName, key string) error {
	for _, l := range g.limits {
		if l.Name != limitName {
			continue
		}
		if l.banMarker == nil {
			return fmt.Errorf("gate: limit %q has no ban", limitName)
		}
		now := g.clock.NowMicro()
		ops := []floodgate.Op{
			{Policy: l.banMarker, Key: key, Kind: floodgate.OpReset},
			{Policy: l.banThresh, Key: key, Kind: floodgate.OpReset},
		}
		return g.store.DoBatch(ctx, now, ops, make([]floodgate.Decision, len(ops)))
	}
	return fmt.Errorf("gate: no limit %q", limitName)
}

// Limits returns the gate's limits.
func (g *Gate) Limits() []Limit {
	out := make([]Limit, len(g.limits))
	for i, l := range g.limits {
		out[i] = *l.Limit
	}
	return out
}

package rules

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/floodgate/floodgate"
	"go.yaml.in/yaml/v3"
)

// An HTTPRoute is one entry of a file's http section: which HTTP requests
// it applies to, how their descriptor is built, and what happens over the limit.
// `floodgate proxy` reads it; docs/RULES.md describes the section. Routes
// are immutable once parsed and shared by every Config holding their Domain.
type HTTPRoute struct {
	Name string // `name`; default "http[i]" (i = index in the list); unique within the file
	File string // the rules file
	Line int    // the line of the route's entry in the list

	// Match. All given conditions must hold; none given = every request.

	Hosts      []string      // match.host: a string or a list; exact (case-insensitive, port ignored) or "*.example.com" (any subdomain); lowercased, IPv6 addresses in brackets
	PathPrefix string        // match.path_prefix, must start with "/"
	Path       string        // match.path: a pattern, must start with "/"; "*" matches one path segment, a trailing "/**" matches any rest (including nothing); otherwise exact
	Methods    []string      // match.methods: uppercased; must be tokens
	Key        []HTTPKeyPart // `key`: the descriptor's entries, in order; at least one
	Action     string        // `action`: "deny" (default), "ban", "delay", "redirect", "shadow", "defer"
	// Status is `status`: the status of a refused request, 400..599. It
	// defaults to 429 for the actions that refuse (deny, ban and delay) and
	// is 0 for redirect and shadow, which refuse nothing.
	Status         int
	MaxDelay       time.Duration  // `max_delay` (a duration like "500ms", at most 1m): required and > 0 for action delay, refused otherwise
	Redirect       string         // `redirect`: an absolute http(s) URL or a path starting with "/", required for action redirect
	RedirectStatus int            // `redirect_status`: 301, 302 (default), 303, 307, 308; 0 unless action redirect
	Ban            HTTPBan        // `ban`: required for action ban, refused otherwise
	Defer          HTTPDefer      // `defer`: optional for action defer (defaults below), refused otherwise
	Cost           int64          // `cost`: hits per request, default 1, 1..1e9
	ExemptCIDRs    []netip.Prefix // `exempt_cidrs`: client addresses never limited (a bare IP means a /32 or /128)
	// Criticality is `criticality`: the server throttler's level for the
	// route's requests, one of CriticalityLevels (upper-cased, "-" read as
	// "_"); "" when not given. A request may claim a lower level in its
	// header, never a higher one unless it comes through a trusted proxy.
	Criticality string
	// Limit is set when the route carries its own `rate_limit` (or `rate_limits`)
	// instead of relying on the descriptors tree: the same fields and extensions as a
	// descriptor's rate_limit, parsed by the same code. Its Policy name is derived
	// from the domain and route name ("rules/<domain>#http/<name>", escaped as
	// descriptor policy names are), so it is stable across reloads and distinct
	// from descriptor limits. Its Name, unless rate_limit.name gives one, is
	// "<domain>.http.<name>" (the policy's name if a descriptor limit already
	// has that name). ShadowMode is set for action shadow. Route limits are
	// not among Domain.Limits, which are the descriptor tree's.
	//
	// When Limit is nil, the route's descriptor is matched against the
	// domain's descriptors (Config.Match), and the parser has checked that
	// the route's entry keys lead to some descriptor with a rate limit.
	Limit *Limit
}

// HTTPBan is Cloud Armor's rate_based_ban: a key that sends more than Threshold
// requests in an Interval (fixed windows) is refused for the rest of that
// interval and for Duration after it.
type HTTPBan struct {
	Threshold int64         // `threshold` >= 1
	Interval  time.Duration // `interval` >= 1s (at most 365 days)
	Duration  time.Duration // `duration` >= 1s (at most 365 days)
}

// HTTPDefer is a defer action's queue: a request over the route's limit
// is answered 202 Accepted and queued on Redis, and delivered later at the
// route's rate (package deferq). Zero fields take deferq's defaults.
type HTTPDefer struct {
	MaxQueue  int64         // `max_queue`: requests queued and not yet delivered, 1..1e7 (default 10000); beyond, 503
	MaxBody   int64         // `max_body`: bytes of a queued request's body, 0..64 MiB (default 1 MiB); beyond, 413
	ResultTTL time.Duration // `result_ttl`: how long a delivered request's response is kept for polling, 1s..7d (default 10m)
}

// An HTTPKeyPart is one entry of the route's descriptor.
type HTTPKeyPart struct {
	Kind    string // "remote_address", "header", "cookie", "query", "path", "method", "host", "generic"
	Name    string // header, cookie or query parameter name; for generic, the fixed value
	Entry   string // the descriptor entry key
	Missing string // header/cookie/query only: "ip" (default: use the client address instead), "shared" (one shared value, "" ), "skip" (the route does not apply to this request)
}

// HTTP returns the domain's http routes in file order.
func (d *Domain) HTTP() []*HTTPRoute { return append([]*HTTPRoute(nil), d.http...) }

// field names of the http section, for "unknown field" hints (the names
// the parser's tables read: TestFieldListsMatchTables)
var (
	httpFields = []string{"name", "match", "key", "action", "status", "max_delay", "redirect", "redirect_status",
		"ban", "defer", "cost", "exempt_cidrs", "criticality", "rate_limit", "rate_limits"}
	httpMatchFields = []string{"host", "path_prefix", "path", "methods"}
	httpBanFields   = []string{"threshold", "interval", "duration"}
	httpDeferFields = []string{"max_queue", "max_body", "result_ttl"}
	httpNamedKinds  = []string{"header", "cookie", "query", "generic"}
	httpBareKinds   = []string{"remote_address", "path", "method", "host"}
	httpActions     = []string{"deny", "ban", "delay", "redirect", "shadow", "defer"}
)

// Bounds of the http section's durations.
const (
	maxHTTPDelay = time.Minute
	maxBanTime   = 365 * 24 * time.Hour
)

// httpSection reads the http section. treeOK says the descriptors parsed
// without error, so routes relying on them can be checked against them.
func (p *parser) httpSection(v *yaml.Node, path string, treeOK bool) []*HTTPRoute {
	items, ok := p.seq(v, path)
	if !ok {
		return nil
	}
	var (
		routes []*HTTPRoute
		trie   *keyTrie
		names  = map[string]string{} // route name → "http[i] (line n)"
	)
	for i, it := range items {
		ip := fmt.Sprintf("%s[%d]", path, i)
		if p.over {
			return routes
		}
		if it.Kind != yaml.MappingNode {
			p.add(it.Line, ip, "want a route (a mapping with a key), got %s", kindName(it))
			continue
		}
		p.descs++
		if p.descs > maxDescriptors {
			p.add(it.Line, ip, "more than %d descriptors (http routes included) in one file", maxDescriptors)
			p.over = true
			return routes
		}
		if i == MaxRoutes {
			p.add(it.Line, ip, "more than %d http routes in one file", MaxRoutes)
			return routes
		}
		r, ok := p.httpRoute(it, ip, i)
		if prev, dup := names[r.Name]; dup {
			p.add(r.Line, join(ip, "name"), "route name %q is already taken by %s", r.Name, prev)
			ok = false
		} else {
			names[r.Name] = fmt.Sprintf("%s (line %d)", ip, r.Line)
		}
		if ok && r.Limit == nil && treeOK {
			if trie == nil {
				trie = newKeyTrie(p.dom.root)
			}
			if msg := trie.check(r.Key); msg != "" {
				p.add(r.keyLine, join(ip, "key"), "%s", msg)
				ok = false
			}
		}
		if ok {
			routes = append(routes, &r.HTTPRoute)
		}
	}
	p.nameHTTPLimits(routes)
	return routes
}

// parsedRoute is a route with the lines its checks report at.
type parsedRoute struct {
	HTTPRoute
	keyLine int
}

// httpRoute reads route i; ok is false when it had any error (all
// reported).
func (p *parser) httpRoute(m *yaml.Node, path string, i int) (*parsedRoute, bool) {
	r := &parsedRoute{HTTPRoute: HTTPRoute{Name: fmt.Sprintf("http[%d]", i), File: p.file, Line: m.Line, Cost: 1, Action: "deny"}}
	rs := &routeSpec{later: map[string]*field{}, actionLine: m.Line, actionOK: true}
	ok := p.routeFields(m, path, r, rs)
	ok = p.routeKey(r, rs.later["key"], m.Line, path) && ok
	if rs.actionOK {
		ok = p.routeAction(r, rs, path) && ok
	}
	return r, p.routeLimit(r, rs, path) && ok
}

// routeSpec is what a route's fields say that is read once they all are.
type routeSpec struct {
	later      map[string]*field // key, rate_limit(s) and actionFields, by name
	actionLine int               // the line of the action, else of the route
	actionOK   bool              // the action, if given, is known
}

// A routeReader reads one field of a route (its value not null); false if
// it was bad (reported).
type routeReader func(p *parser, r *parsedRoute, rs *routeSpec, f *field, path string) bool

// routeReaders read the route fields that need no other; routeLater keeps
// the rest for routeKey, routeAction and routeLimit.
var routeReaders = map[string]routeReader{
	"name":   (*parser).routeName,
	"action": (*parser).routeActionName,
	"match": func(p *parser, r *parsedRoute, _ *routeSpec, f *field, path string) bool {
		return p.httpMatch(f.val, path, &r.HTTPRoute)
	},
	"cost": func(p *parser, r *parsedRoute, _ *routeSpec, f *field, path string) (ok bool) {
		r.Cost, ok = p.integer(f.val, path, 1, 1e9)
		return ok
	},
	"exempt_cidrs": func(p *parser, r *parsedRoute, _ *routeSpec, f *field, path string) (ok bool) {
		r.ExemptCIDRs, ok = p.httpCIDRs(f.val, path)
		return ok
	},
	"criticality": (*parser).routeCriticality,
}

// CriticalityLevels are the levels a route's criticality names, from the
// first shed to the last (package throttle's).
var CriticalityLevels = []string{"SHEDDABLE", "SHEDDABLE_PLUS", "CRITICAL", "CRITICAL_PLUS"}

func (p *parser) routeCriticality(r *parsedRoute, _ *routeSpec, f *field, path string) bool {
	s, ok := p.str(f.val, path)
	if !ok {
		return false
	}
	c := strings.ReplaceAll(strings.ToUpper(strings.TrimSpace(s)), "-", "_")
	if !contains(CriticalityLevels, c) {
		p.add(f.val.Line, path, "unknown criticality %q (want %s)", s, strings.Join(CriticalityLevels, ", "))
		return false
	}
	r.Criticality = c
	return true
}

// routeLater reports whether a route's field is read once all are.
func routeLater(name string) bool {
	return name == "key" || name == "rate_limit" || name == "rate_limits" || actionFieldOf(name) != nil
}

// routeFields reads a route's fields, keeping those read later in rs.
func (p *parser) routeFields(m *yaml.Node, path string, r *parsedRoute, rs *routeSpec) bool {
	ok := true
	fs := p.fields(m, path)
	for i := range fs {
		f := &fs[i]
		if isNull(p.resolve(f.val)) {
			continue
		}
		switch read := routeReaders[f.name]; {
		case read != nil:
			ok = read(p, r, rs, f, join(path, f.name)) && ok
		case routeLater(f.name):
			rs.later[f.name] = f
		default:
			p.unknownRouteField(*f, path)
			ok = false
		}
	}
	return ok
}

func (p *parser) routeName(r *parsedRoute, _ *routeSpec, f *field, path string) bool {
	s, ok := p.str(f.val, path)
	switch {
	case !ok:
		return false
	case s == "":
		p.add(f.val.Line, path, "must not be empty")
		return false
	case hasCtl(s):
		p.add(f.val.Line, path, "must not hold control characters")
		return false
	}
	r.Name = s
	return true
}

func (p *parser) routeActionName(r *parsedRoute, rs *routeSpec, f *field, path string) bool {
	s, ok := p.str(f.val, path)
	if ok {
		rs.actionLine = f.val.Line
		if s = strings.ToLower(s); contains(httpActions, s) {
			r.Action = s
		} else {
			p.add(f.val.Line, path, "unknown action %q (want deny, ban, delay, redirect, shadow or defer)", s)
			ok = false
		}
	}
	rs.actionOK = ok
	return ok
}

// routeKey reads the route's key, which every route has.
func (p *parser) routeKey(r *parsedRoute, f *field, line int, path string) bool {
	if f == nil {
		p.add(line, join(path, "key"), "missing: a route needs a key: the descriptor entries its requests are counted by, such as [remote_address]")
		return false
	}
	r.keyLine = f.key.Line
	var ok bool
	r.Key, ok = p.httpKey(f, join(path, "key"))
	return ok
}

// An actionField is a route field that only some actions take.
type actionField struct {
	name    string
	actions []string // the actions that take it
	need    string   // what it gives, if those actions need it; "" if optional
	refuse  string   // why other actions refuse it (%s: the action), if not "only action X has it"
	read    func(p *parser, r *HTTPRoute, v *yaml.Node, path string) bool
}

// actionFields are the route fields only some actions take, in the order
// they are checked.
var actionFields = []actionField{
	{name: "status", actions: []string{"deny", "ban", "delay"}, read: (*parser).routeStatus,
		refuse: "action %s refuses no request, so it has no status (redirect_status is a redirect's; a deferred request gets 202, or 503 when its queue is full)"},
	{name: "max_delay", actions: []string{"delay"}, read: (*parser).routeMaxDelay,
		need: "max_delay: the longest a request waits for the limit (a duration such as \"500ms\")"},
	{name: "redirect", actions: []string{"redirect"}, read: (*parser).routeRedirect,
		need: "redirect: where to send requests over the limit (an absolute http(s) URL or a path starting with \"/\")"},
	{name: "redirect_status", actions: []string{"redirect"}, read: (*parser).routeRedirectStatus},
	{name: "ban", actions: []string{"ban"}, read: (*parser).routeBan,
		need: "ban: {threshold, interval, duration}"},
	{name: "defer", actions: []string{"defer"}, read: (*parser).routeDefer},
}

func actionFieldOf(name string) *actionField {
	for i := range actionFields {
		if actionFields[i].name == name {
			return &actionFields[i]
		}
	}
	return nil
}

// routeAction reads the fields of actionFields: what the route's action
// needs, and what it refuses.
func (p *parser) routeAction(r *parsedRoute, rs *routeSpec, path string) bool {
	ok, act := true, r.Action
	for _, af := range actionFields {
		f, takes := rs.later[af.name], contains(af.actions, act)
		switch {
		case f != nil && !takes && af.refuse != "":
			p.add(f.key.Line, join(path, f.name), af.refuse, act)
			ok = false
		case f != nil && !takes:
			p.add(f.key.Line, join(path, f.name), "only action %s has %s (this route's action is %s)", af.actions[0], f.name, act)
			ok = false
		case f != nil:
			ok = af.read(p, &r.HTTPRoute, f.val, join(path, f.name)) && ok
		case takes && af.need != "":
			p.add(rs.actionLine, join(path, af.name), "missing: action %s needs %s", act, af.need)
			ok = false
		}
	}
	if r.Status == 0 && act != "redirect" && act != "shadow" && act != "defer" {
		r.Status = 429
	}
	if act == "redirect" && r.RedirectStatus == 0 {
		r.RedirectStatus = 302
	}
	return ok
}

func (p *parser) routeStatus(r *HTTPRoute, v *yaml.Node, path string) bool {
	s, ok := p.integer(v, path, 400, 599)
	if ok {
		r.Status = int(s)
	}
	return ok
}

func (p *parser) routeMaxDelay(r *HTTPRoute, v *yaml.Node, path string) bool {
	d, ok := p.duration(v, path)
	if !ok {
		return false
	}
	if d > maxHTTPDelay {
		p.add(v.Line, path, "%v is too long (at most %v): a waiting request holds its connection", d, maxHTTPDelay)
		return false
	}
	r.MaxDelay = d
	return true
}

func (p *parser) routeRedirect(r *HTTPRoute, v *yaml.Node, path string) bool {
	s, ok := p.str(v, path)
	if !ok {
		return false
	}
	if msg := checkRedirect(s); msg != "" {
		p.add(v.Line, path, "%s", msg)
		return false
	}
	r.Redirect = s
	return true
}

func (p *parser) routeRedirectStatus(r *HTTPRoute, v *yaml.Node, path string) bool {
	s, ok := p.integer(v, path, 100, 999)
	if !ok {
		return false
	}
	if s != 301 && s != 302 && s != 303 && s != 307 && s != 308 {
		p.add(v.Line, path, "%d is not a redirect status (want 301, 302, 303, 307 or 308)", s)
		return false
	}
	r.RedirectStatus = int(s)
	return true
}

func (p *parser) routeDefer(r *HTTPRoute, v *yaml.Node, path string) bool {
	m, ok := p.mapping(v, path)
	if !ok {
		return false
	}
	for _, f := range p.fields(m, path) {
		fp := join(path, f.name)
		if isNull(p.resolve(f.val)) {
			continue
		}
		good := true
		switch f.name {
		case "max_queue":
			r.Defer.MaxQueue, good = p.integer(f.val, fp, 1, 1e7)
		case "max_body":
			r.Defer.MaxBody, good = p.integer(f.val, fp, 0, 64<<20)
		case "result_ttl":
			r.Defer.ResultTTL, good = p.durationIn(f.val, fp, time.Second, 7*24*time.Hour)
		default:
			p.unknownIn(f, path, httpDeferFields)
			good = false
		}
		ok = ok && good
	}
	return ok
}

func (p *parser) routeBan(r *HTTPRoute, v *yaml.Node, path string) (ok bool) {
	r.Ban, ok = p.httpBan(v, path)
	return ok
}

// routeLimit reads the route's own rate_limit or rate_limits, if any.
func (p *parser) routeLimit(r *parsedRoute, rs *routeSpec, path string) bool {
	rl, rls := rs.later["rate_limit"], rs.later["rate_limits"]
	switch {
	case rl != nil && rls != nil:
		p.add(rls.key.Line, join(path, "rate_limits"), "give rate_limit or rate_limits, not both")
		return false
	case rl == nil && rls == nil:
		return true
	}
	l := p.limit(rl, rls, path, nil)
	if l == nil {
		return false
	}
	// p.limit filed it among the descriptor tree's limits: it is not one.
	if n := len(p.dom.limits); n > 0 && p.dom.limits[n-1] == l {
		p.dom.limits = p.dom.limits[:n-1]
	}
	l.ShadowMode = r.Action == "shadow"
	ok := true
	if l.Policy != nil {
		pol, err := floodgate.NewPolicy(httpPolicyName(p.dom.Name, r.Name), l.Policy.Rules()...)
		if err != nil { // cannot happen: the rules were valid
			p.add(l.Line, path, "%v", err)
			return false
		}
		l.Policy = pol
		if r.Action == "delay" && !pol.CanDelay() {
			p.add(rs.actionLine, join(path, "action"), "delay needs a bucket algorithm (token_bucket, gcra, leaky_bucket) in the route's rate_limit; windows never delay, so every request over it would be refused")
			ok = false
		}
	}
	r.Limit = l
	return ok
}

// unknownRouteField reports an unknown field of a route, with a hint.
func (p *parser) unknownRouteField(f field, path string) {
	switch {
	case contains(httpMatchFields, f.name):
		p.add(f.key.Line, join(path, f.name), "unknown field %q here (it belongs in match)", f.name)
	case f.name == "hosts" || f.name == "method":
		p.add(f.key.Line, join(path, f.name), "unknown field %q here (did you mean match.%s?)", f.name, closest(f.name, httpMatchFields))
	case contains(httpBanFields, f.name):
		p.add(f.key.Line, join(path, f.name), "unknown field %q here (it belongs in ban)", f.name)
	case f.name == "shadow_mode":
		p.add(f.key.Line, join(path, f.name), "unknown field %q here (a route says action: shadow)", f.name)
	default:
		p.unknown(f, path, httpFields)
	}
}

// unknownIn reports an unknown field inside a route, with a hint.
func (p *parser) unknownIn(f field, path string, allowed []string) {
	msg := fmt.Sprintf("unknown field %q", f.name)
	if contains(httpFields, f.name) && !contains(allowed, f.name) {
		msg += " here (it is a route field)"
	} else if s := closest(f.name, allowed); s != "" {
		msg += fmt.Sprintf(" (did you mean %q?)", s)
	}
	p.add(f.key.Line, join(path, f.name), "%s", msg)
}

// httpPolicyName names a route's own policy: "rules/", the domain,
// "#http/" and the route's name, escaped as policyName escapes, so it is
// never a descriptor path's policy name (those hold no '#' but the one
// before the hash of a cut name, followed by hex digits only).
func httpPolicyName(domain, route string) string {
	var b strings.Builder
	b.WriteString("rules/")
	pathEscape(&b, domain)
	b.WriteString("#http/")
	pathEscape(&b, route)
	s := b.String()
	if len(s) > 200 {
		sum := sha256.Sum256([]byte(s))
		s = s[:120] + "#" + hex.EncodeToString(sum[:16])
	}
	return s
}

// nameHTTPLimits names the routes' own limits that rate_limit.name does
// not: "<domain>.http.<route>", or the policy's name should a limit of the
// file already have that name.
func (p *parser) nameHTTPLimits(routes []*HTTPRoute) {
	taken := map[string]bool{}
	for _, l := range p.dom.limits {
		taken[l.Name] = true
	}
	for _, r := range routes {
		if r.Limit != nil && r.Limit.NameGiven {
			taken[r.Limit.Name] = true
		}
	}
	dom := strings.ReplaceAll(strings.ReplaceAll(p.dom.Name, "%", "%25"), ".", "%2E")
	for _, r := range routes {
		l := r.Limit
		if l == nil || l.NameGiven {
			continue
		}
		l.Name = dom + ".http." + r.Name
		if taken[l.Name] {
			l.Name = httpPolicyName(p.dom.Name, r.Name)
		}
		l.stat = l.Name
	}
}

// A keyTrie is the descriptor tree by keys alone: which key sequences lead
// to a descriptor with a rate limit, whatever the values.
type keyTrie struct {
	next    map[string]*keyTrie
	limited bool
}

func newKeyTrie(root *level) *keyTrie {
	t := &keyTrie{}
	t.add(root)
	return t
}

func (t *keyTrie) add(lvl *level) {
	if lvl == nil {
		return
	}
	for key, g := range lvl.byKey {
		c := t.next[key]
		if c == nil {
			c = &keyTrie{}
			if t.next == nil {
				t.next = map[string]*keyTrie{}
			}
			t.next[key] = c
		}
		each := func(n *node) {
			if n == nil || n.exempt { // an exempt node never limits
				return
			}
			c.limited = c.limited || n.limit != nil
			c.add(n.children)
		}
		for _, n := range g.exact {
			each(n)
		}
		for _, ns := range [][]*node{g.prefixes, g.regexes, g.globs} {
			for _, n := range ns {
				each(n)
			}
		}
		each(g.keyOnly)
	}
}

// check says why no descriptor path matches a route's entry keys, or "".
func (t *keyTrie) check(key []HTTPKeyPart) string {
	entries := make([]string, len(key))
	for i, kp := range key {
		entries[i] = kp.Entry
	}
	all := strings.Join(entries, " → ")
	const fix = "give the route its own rate_limit, or add descriptors for these entries"
	cur := t
	for i, e := range entries {
		nx := cur.next[e]
		if nx == nil {
			if i == 0 {
				return fmt.Sprintf("no descriptor matches %s: no top-level descriptor has key %q (%s)", all, e, fix)
			}
			return fmt.Sprintf("no descriptor matches %s: no descriptor under %s has key %q (%s)", all, strings.Join(entries[:i], " → "), e, fix)
		}
		cur = nx
	}
	if !cur.limited {
		return fmt.Sprintf("no descriptor matches %s: no descriptor at %s has a rate_limit (%s)", all, all, fix)
	}
	return ""
}

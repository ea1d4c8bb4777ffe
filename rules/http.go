package rules

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"net/netip"
	"net/url"
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
	Action     string        // `action`: "deny" (default), "ban", "delay", "redirect", "shadow"
	// Status is `status`: the status of a refused request, 400..599. It
	// defaults to 429 for the actions that refuse (deny, ban and delay) and
	// is 0 for redirect and shadow, which refuse nothing.
	Status         int
	MaxDelay       time.Duration  // `max_delay` (a duration like "500ms", at most 1m): required and > 0 for action delay, refused otherwise
	Redirect       string         // `redirect`: an absolute http(s) URL or a path starting with "/", required for action redirect
	RedirectStatus int            // `redirect_status`: 301, 302 (default), 303, 307, 308; 0 unless action redirect
	Ban            HTTPBan        // `ban`: required for action ban, refused otherwise
	Cost           int64          // `cost`: hits per request, default 1, 1..1e9
	ExemptCIDRs    []netip.Prefix // `exempt_cidrs`: client addresses never limited (a bare IP means a /32 or /128)
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
		"ban", "cost", "exempt_cidrs", "rate_limit", "rate_limits"}
	httpMatchFields = []string{"host", "path_prefix", "path", "methods"}
	httpBanFields   = []string{"threshold", "interval", "duration"}
	httpNamedKinds  = []string{"header", "cookie", "query", "generic"}
	httpBareKinds   = []string{"remote_address", "path", "method", "host"}
	httpActions     = []string{"deny", "ban", "delay", "redirect", "shadow"}
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
			p.add(f.val.Line, path, "unknown action %q (want deny, ban, delay, redirect or shadow)", s)
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
		refuse: "action %s refuses no request, so it has no status (redirect_status is a redirect's)"},
	{name: "max_delay", actions: []string{"delay"}, read: (*parser).routeMaxDelay,
		need: "max_delay: the longest a request waits for the limit (a duration such as \"500ms\")"},
	{name: "redirect", actions: []string{"redirect"}, read: (*parser).routeRedirect,
		need: "redirect: where to send requests over the limit (an absolute http(s) URL or a path starting with \"/\")"},
	{name: "redirect_status", actions: []string{"redirect"}, read: (*parser).routeRedirectStatus},
	{name: "ban", actions: []string{"ban"}, read: (*parser).routeBan,
		need: "ban: {threshold, interval, duration}"},
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
	if r.Status == 0 && act != "redirect" && act != "shadow" {
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

// matchReaders read each field of a route's match into the route.
var matchReaders = map[string]func(p *parser, r *HTTPRoute, v *yaml.Node, path string) bool{
	"host": func(p *parser, r *HTTPRoute, v *yaml.Node, path string) (ok bool) {
		r.Hosts, ok = p.stringList(v, path, "match.host", normHost)
		return ok
	},
	"methods": func(p *parser, r *HTTPRoute, v *yaml.Node, path string) (ok bool) {
		r.Methods, ok = p.stringList(v, path, "match.methods", normMethod)
		return ok
	},
	"path_prefix": func(p *parser, r *HTTPRoute, v *yaml.Node, path string) bool {
		return p.checked(v, path, checkPrefix, &r.PathPrefix)
	},
	"path": func(p *parser, r *HTTPRoute, v *yaml.Node, path string) bool {
		return p.checked(v, path, checkPathPattern, &r.Path)
	},
}

// httpMatch reads a route's match into r.
func (p *parser) httpMatch(v *yaml.Node, path string, r *HTTPRoute) bool {
	m, ok := p.mapping(v, path)
	if !ok {
		return false
	}
	for _, f := range p.fields(m, path) {
		if isNull(p.resolve(f.val)) {
			continue
		}
		if read := matchReaders[f.name]; read != nil {
			ok = read(p, r, f.val, join(path, f.name)) && ok
		} else {
			p.unknownIn(f, path, httpMatchFields)
			ok = false
		}
	}
	return ok
}

// checked reads a string into *to unless check says what is wrong with it.
func (p *parser) checked(v *yaml.Node, path string, check func(string) string, to *string) bool {
	s, ok := p.str(v, path)
	if !ok {
		return false
	}
	if msg := check(s); msg != "" {
		p.add(v.Line, path, "%s", msg)
		return false
	}
	*to = s
	return true
}

// normMethod uppercases a match.methods entry, or says what is wrong with it.
func normMethod(s string) (string, string) {
	if !isToken(s) {
		return "", fmt.Sprintf("%q is not a method name (a token: letters, digits and !#$%%&'*+-.^_`|~)", s)
	}
	return strings.ToUpper(s), ""
}

// checkPrefix says what is wrong with a match.path_prefix, if anything.
func checkPrefix(s string) string {
	if msg := checkPath(s, "path_prefix"); msg != "" {
		return msg
	}
	if strings.Contains(s, "*") {
		return fmt.Sprintf("a prefix has no wildcards (use path: %q for a pattern)", s)
	}
	return ""
}

// stringList reads a string or a non-empty list of strings, each
// normalised by norm (which returns a message for a bad one), refusing
// duplicates. what names the field for messages.
func (p *parser) stringList(v *yaml.Node, path, what string, norm func(string) (string, string)) ([]string, bool) {
	v = p.resolve(v)
	if v == nil {
		return nil, false
	}
	items, paths := []*yaml.Node{v}, []string{path}
	if v.Kind == yaml.SequenceNode {
		var ok bool
		if items, ok = p.seq(v, path); !ok {
			return nil, false
		}
		if len(items) == 0 {
			p.add(v.Line, path, "an empty list matches nothing: leave %s out to match every request", what)
			return nil, false
		}
		paths = make([]string, len(items))
		for i := range items {
			paths[i] = fmt.Sprintf("%s[%d]", path, i)
		}
	}
	var out []string
	seen := map[string]string{}
	ok := true
	for i, it := range items {
		s, good := p.str(it, paths[i])
		if !good {
			ok = false
			continue
		}
		n, msg := norm(s)
		if msg != "" {
			p.add(it.Line, paths[i], "%s", msg)
			ok = false
			continue
		}
		if prev, dup := seen[n]; dup {
			p.add(it.Line, paths[i], "%q is listed twice (first as %s)", s, prev)
			ok = false
			continue
		}
		seen[n] = paths[i]
		out = append(out, n)
	}
	return out, ok
}

// normHost lowercases a match.host, or says what is wrong with it.
func normHost(s string) (string, string) {
	h := strings.ToLower(s)
	switch {
	case h == "":
		return "", "must not be empty"
	case h == "*" || h == "*.":
		return "", fmt.Sprintf("%q would match every host: leave match.host out instead", s)
	}
	name, wild := strings.CutPrefix(h, "*.")
	switch {
	case strings.HasPrefix(name, "["):
		return normIPv6(s, name, wild)
	case strings.Contains(name, ":"):
		if _, err := netip.ParseAddr(name); err == nil {
			return "", fmt.Sprintf("write an IPv6 address in brackets: \"[%s]\"", name)
		}
		return "", fmt.Sprintf("%q has a port: a host is matched whatever the request's port", s)
	case strings.Contains(name, "*"):
		return "", fmt.Sprintf("%q: a wildcard host is \"*.\" then a domain, as in \"*.example.com\"", s)
	case len(name) > 253:
		return "", fmt.Sprintf("a host name is at most 253 bytes, not %d", len(name))
	case !hostLabels(name):
		return "", fmt.Sprintf("%q is not a host name (dot-separated labels of letters, digits, '-' and '_')", s)
	}
	return h, ""
}

// normIPv6 reads name, "[address]", of the match.host s.
func normIPv6(s, name string, wild bool) (string, string) {
	a, err := netip.ParseAddr(strings.TrimSuffix(name[1:], "]"))
	if wild || !strings.HasSuffix(name, "]") || err != nil || !a.Is6() || a.Zone() != "" {
		return "", fmt.Sprintf("%q is not a host: an IPv6 address is written in brackets, as in \"[2001:db8::1]\", without a port", s)
	}
	return "[" + a.String() + "]", ""
}

// hostLabels reports whether name is dot-separated labels of 1 to 63
// letters, digits, '-' and '_'.
func hostLabels(name string) bool {
	for _, label := range strings.Split(name, ".") {
		if label == "" || len(label) > 63 || strings.IndexFunc(label, func(c rune) bool {
			return !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_')
		}) >= 0 {
			return false
		}
	}
	return true
}

// checkPath says what is wrong with a path (or path prefix), if anything.
func checkPath(s, what string) string {
	switch {
	case !strings.HasPrefix(s, "/"):
		return fmt.Sprintf("%q must start with \"/\"", s)
	case hasCtl(s) || strings.ContainsAny(s, " \t"):
		return fmt.Sprintf("%q holds spaces or control characters", s)
	case strings.ContainsAny(s, "?#"):
		return fmt.Sprintf("%q holds '?' or '#': a %s matches the path alone, not the query", s, what)
	}
	return ""
}

// checkPathPattern says what is wrong with a match.path, if anything.
func checkPathPattern(s string) string {
	if msg := checkPath(s, "path"); msg != "" {
		return msg
	}
	segs := strings.Split(s[1:], "/")
	for i, seg := range segs {
		switch {
		case seg == "**" && i != len(segs)-1:
			return fmt.Sprintf("%q: \"**\" may only end the pattern, as in \"/api/**\"", s)
		case seg == "**", seg == "*":
		case strings.Contains(seg, "*"):
			return fmt.Sprintf("%q: \"*\" stands for a whole segment, as in \"/users/*/posts\" (use path_prefix for a prefix)", s)
		}
	}
	return ""
}

// checkRedirect says what is wrong with a redirect target, if anything.
func checkRedirect(s string) string {
	const want = "want an absolute http(s) URL or a path starting with \"/\""
	switch {
	case s == "":
		return "must not be empty: " + want
	case hasCtl(s) || strings.ContainsAny(s, " \t\\"):
		return fmt.Sprintf("%q holds spaces, control characters or backslashes", s)
	case strings.HasPrefix(s, "//"):
		return fmt.Sprintf("%q starts with \"//\", which browsers read as another host: give an absolute URL", s)
	}
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Sprintf("%q is not a URL: %s", s, want)
	}
	if strings.HasPrefix(s, "/") {
		return ""
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" || u.Opaque != "" {
		return fmt.Sprintf("%q: %s", s, want)
	}
	if u.User != nil {
		return fmt.Sprintf("%q holds user information", s)
	}
	return ""
}

// httpBan reads a route's ban.
func (p *parser) httpBan(v *yaml.Node, path string) (HTTPBan, bool) {
	var b HTTPBan
	m, ok := p.mapping(v, path)
	if !ok {
		return b, false
	}
	seen := map[string]bool{}
	for _, f := range p.fields(m, path) {
		fp := join(path, f.name)
		if isNull(p.resolve(f.val)) {
			continue
		}
		good := true
		switch f.name {
		case "threshold":
			b.Threshold, good = p.integer(f.val, fp, 1, math.MaxUint32)
		case "interval":
			b.Interval, good = p.durationIn(f.val, fp, time.Second, maxBanTime)
		case "duration":
			b.Duration, good = p.durationIn(f.val, fp, time.Second, maxBanTime)
		default:
			p.unknownIn(f, path, httpBanFields)
			good = false
		}
		seen[f.name] = true
		ok = ok && good
	}
	for _, f := range httpBanFields {
		if !seen[f] {
			what := map[string]string{
				"threshold": "how many requests in an interval get a key banned",
				"interval":  "the window the threshold counts in, such as 1m",
				"duration":  "how long a ban lasts after its interval, such as 10m",
			}[f]
			p.add(m.Line, join(path, f), "missing: %s", what)
			ok = false
		}
	}
	return b, ok
}

// durationIn reads a duration in [lo, hi].
func (p *parser) durationIn(v *yaml.Node, path string, lo, hi time.Duration) (time.Duration, bool) {
	d, ok := p.duration(v, path)
	if !ok {
		return 0, false
	}
	if d < lo || d > hi {
		p.add(v.Line, path, "%v is out of range (%v to %v)", d, lo, hi)
		return 0, false
	}
	return d, true
}

// httpCIDRs reads exempt_cidrs.
func (p *parser) httpCIDRs(v *yaml.Node, path string) ([]netip.Prefix, bool) {
	items, ok := p.seq(v, path)
	if !ok {
		return nil, false
	}
	var out []netip.Prefix
	seen := map[netip.Prefix]string{}
	for i, it := range items {
		ip := fmt.Sprintf("%s[%d]", path, i)
		s, good := p.str(it, ip)
		if !good {
			ok = false
			continue
		}
		pfx, msg := parseCIDR(s)
		if msg == "" {
			if prev, dup := seen[pfx]; dup {
				msg = fmt.Sprintf("%q is listed twice (first as %s)", s, prev)
			}
		}
		if msg != "" {
			p.add(it.Line, ip, "%s", msg)
			ok = false
			continue
		}
		seen[pfx] = ip
		out = append(out, pfx)
	}
	return out, ok
}

// parseCIDR reads a prefix ("10.0.0.0/8") or an address (a /32 or /128).
func parseCIDR(s string) (netip.Prefix, string) {
	if !strings.Contains(s, "/") {
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" {
			return netip.Prefix{}, fmt.Sprintf("%q is not an IP address or a CIDR prefix (such as 10.0.0.0/8)", s)
		}
		a = a.Unmap()
		return netip.PrefixFrom(a, a.BitLen()), ""
	}
	pfx, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Sprintf("%q is not a CIDR prefix (such as 10.0.0.0/8 or 2001:db8::/32)", s)
	}
	if m := pfx.Masked(); m != pfx {
		return netip.Prefix{}, fmt.Sprintf("%q has bits set beyond its /%d: did you mean %q?", s, pfx.Bits(), m.String())
	}
	return pfx, ""
}

// httpKey reads a route's key: a list of parts (or a single part).
func (p *parser) httpKey(f *field, path string) ([]HTTPKeyPart, bool) {
	v := p.resolve(f.val)
	if v == nil {
		return nil, false
	}
	items, paths := []*yaml.Node{v}, []string{path}
	if v.Kind == yaml.SequenceNode {
		var ok bool
		if items, ok = p.seq(v, path); !ok {
			return nil, false
		}
		paths = make([]string, len(items))
		for i := range items {
			paths[i] = fmt.Sprintf("%s[%d]", path, i)
		}
	}
	switch {
	case len(items) == 0:
		p.add(v.Line, path, "an empty list: give at least one entry, such as [remote_address]")
		return nil, false
	}
	var out []HTTPKeyPart
	seen := map[string]string{}
	ok := true
	if len(items) > MaxRouteParts { // said, and each part still checked
		p.add(v.Line, path, "%d entries; a route's key has at most %d", len(items), MaxRouteParts)
		ok = false
	}
	for i, it := range items {
		kp, good := p.httpKeyPart(it, paths[i])
		if !good {
			ok = false
			continue
		}
		if prev, dup := seen[kp.Entry]; dup {
			p.add(it.Line, paths[i], "entry %q is already given by %s: a descriptor's entry keys differ", kp.Entry, prev)
			ok = false
			continue
		}
		seen[kp.Entry] = paths[i]
		out = append(out, kp)
	}
	return out, ok
}

// httpKeyPart reads one entry of a route's key.
func (p *parser) httpKeyPart(v *yaml.Node, path string) (HTTPKeyPart, bool) {
	switch v.Kind {
	case yaml.ScalarNode:
		return p.bareKeyPart(v, path)
	case yaml.MappingNode:
		return p.namedKeyPart(v, path)
	}
	p.add(v.Line, path, "want a key part (remote_address, path, method, host, or a mapping such as {header: X-API-Key}), got %s", kindName(v))
	return HTTPKeyPart{}, false
}

// bareKeyPart reads a key part written as a string: remote_address, path,
// method or host.
func (p *parser) bareKeyPart(v *yaml.Node, path string) (HTTPKeyPart, bool) {
	s, ok := p.str(v, path)
	if !ok {
		return HTTPKeyPart{}, false
	}
	switch {
	case contains(httpBareKinds, s):
		return HTTPKeyPart{Kind: s, Entry: s}, true
	case s == "generic":
		p.add(v.Line, path, "generic needs a value and an entry: write {generic: VALUE, entry: KEY}")
	case contains(httpNamedKinds, s):
		p.add(v.Line, path, "%s needs a name: write {%s: NAME}", s, s)
	default:
		msg := fmt.Sprintf("unknown key part %q (want remote_address, path, method, host, or a mapping: {header: NAME}, {cookie: NAME}, {query: NAME}, {generic: VALUE, entry: KEY})", s)
		if c := closest(s, append(httpBareKinds[:len(httpBareKinds):len(httpBareKinds)], httpNamedKinds...)); c != "" {
			msg = fmt.Sprintf("unknown key part %q (did you mean %q?)", s, c)
		}
		p.add(v.Line, path, "%s", msg)
	}
	return HTTPKeyPart{}, false
}

// namedKinds are the key parts written {kind: NAME}, those of
// httpNamedKinds: whether the name must be an HTTP token, the entry key
// a name gives (nil: the part needs an entry), and whether the part takes
// missing (a request may lack it).
var namedKinds = map[string]struct {
	token   bool
	entry   func(name string) string
	missing bool
}{
	"header":  {token: true, entry: strings.ToLower, missing: true},
	"cookie":  {token: true, entry: func(name string) string { return "cookie." + name }, missing: true},
	"query":   {entry: func(name string) string { return "query." + name }, missing: true},
	"generic": {},
}

// namedKeyPart reads a key part written as a mapping: {header: NAME},
// {cookie: NAME}, {query: NAME} or {generic: VALUE, entry: KEY}, with
// entry and missing.
func (p *parser) namedKeyPart(v *yaml.Node, path string) (HTTPKeyPart, bool) {
	kindF, entryF, missingF, ok := p.keyPartFields(v, path)
	if kindF == nil {
		if ok {
			p.add(v.Line, path, "missing: a key part names one of header, cookie, query or generic (or is a bare remote_address, path, method or host)")
		}
		return HTTPKeyPart{}, false
	}
	kp := HTTPKeyPart{Kind: kindF.name}
	ok = p.keyPartName(&kp, kindF, path) && ok
	ok = p.keyPartEntry(&kp, entryF, v.Line, path) && ok
	return kp, p.keyPartMissing(&kp, missingF, path) && ok
}

// keyPartFields sorts a key part's fields: its kind, entry and missing.
func (p *parser) keyPartFields(v *yaml.Node, path string) (kindF, entryF, missingF *field, ok bool) {
	ok = true
	fs := p.fields(v, path)
	for i := range fs {
		f := &fs[i]
		switch {
		case contains(httpNamedKinds, f.name) && kindF != nil:
			p.add(f.key.Line, join(path, f.name), "a key part is one of header, cookie, query or generic, and %s is given too", kindF.name)
			ok = false
		case contains(httpNamedKinds, f.name):
			kindF = f
		case f.name == "entry" && !isNull(p.resolve(f.val)):
			entryF = f
		case f.name == "missing" && !isNull(p.resolve(f.val)):
			missingF = f
		case f.name == "entry", f.name == "missing":
		case contains(httpBareKinds, f.name):
			p.add(f.key.Line, join(path, f.name), "%s takes no name: write it as a bare string, %s (its entry key is %q)", f.name, f.name, f.name)
			ok = false
		default:
			p.unknownIn(*f, path, append(httpNamedKinds[:len(httpNamedKinds):len(httpNamedKinds)], "entry", "missing"))
			ok = false
		}
	}
	return kindF, entryF, missingF, ok
}

// keyPartName reads the name of a key part (a generic part's value), and
// the entry key it gives.
func (p *parser) keyPartName(kp *HTTPKeyPart, f *field, path string) bool {
	fp := join(path, kp.Kind)
	s, ok := p.str(f.val, fp)
	if !ok {
		return false
	}
	kind := namedKinds[kp.Kind]
	switch {
	case s == "":
		p.add(f.val.Line, fp, "must not be empty")
		ok = false
	case kind.token && !isToken(s):
		p.add(f.val.Line, fp, "%q is not a %s name (a token: letters, digits and !#$%%&'*+-.^_`|~)", s, kp.Kind)
		ok = false
	case hasCtl(s):
		p.add(f.val.Line, fp, "must not hold control characters")
		ok = false
	}
	kp.Name = s
	if kind.entry != nil {
		kp.Entry = kind.entry(s)
	}
	return ok
}

// keyPartEntry reads a key part's entry, which generic needs.
func (p *parser) keyPartEntry(kp *HTTPKeyPart, f *field, line int, path string) bool {
	ep := join(path, "entry")
	if f == nil {
		if namedKinds[kp.Kind].entry == nil {
			p.add(line, ep, "missing: %s needs the entry key its value goes under", kp.Kind)
			return false
		}
		return true
	}
	s, ok := p.str(f.val, ep)
	if !ok {
		return false
	}
	if s == "" {
		p.add(f.val.Line, ep, "must not be empty")
		return false
	}
	kp.Entry = s
	return true
}

// keyPartMissing reads a key part's missing, which only the parts a
// request may lack take.
func (p *parser) keyPartMissing(kp *HTTPKeyPart, f *field, path string) bool {
	mp := join(path, "missing")
	if !namedKinds[kp.Kind].missing {
		if f != nil {
			p.add(f.key.Line, mp, "a %s value is never missing: only header, cookie and query parts have missing", kp.Kind)
			return false
		}
		return true
	}
	kp.Missing = "ip"
	if f == nil {
		return true
	}
	s, ok := p.str(f.val, mp)
	if !ok {
		return false
	}
	if s = strings.ToLower(s); s != "ip" && s != "shared" && s != "skip" {
		p.add(f.val.Line, mp, "unknown missing %q (want ip, shared or skip)", s)
		return false
	}
	kp.Missing = s
	return true
}

func hasCtl(s string) bool {
	return strings.IndexFunc(s, func(c rune) bool { return c < 0x20 || c == 0x7f }) >= 0
}

// isToken reports whether s is an HTTP token (RFC 9110): a method, header
// or cookie name.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
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

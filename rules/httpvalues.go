package rules

import (
	"fmt"
	"math"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

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

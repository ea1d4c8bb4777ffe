package gate

import (
	"context"
	"net/http"
	"net/netip"
	"path"
	"strings"
)

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

// value appends a part's value for r to buf, bounded and escaped (raw:
// as it is); ok is false when the part is absent and its fallback skips
// the limit.
func (g *Gate) value(r *Request, p *compiledPart, buf []byte, raw bool) (v []byte, ok bool) {
	switch p.Kind {
	case PartAll:
		return append(buf, '*'), true
	case PartIP:
		return g.cfg.ClientIP.appendGroup(buf, g.clientAddr(r)), true
	case PartConst:
		return appendPart(buf, p.Name, raw), true
	}
	if s, found := g.text(r, p); found {
		return appendPart(buf, s, raw), true
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

// text returns the value of a part taken from the request's text (a
// header, cookie, query parameter, path, route, method, host or user),
// and whether the request has it.
func (g *Gate) text(r *Request, p *compiledPart) (s string, found bool) {
	switch p.Kind {
	case PartHeader:
		if vs := r.headerValues(p.canon, p.lower); len(vs) > 0 && vs[0] != "" {
			return vs[0], true
		}
		return "", false
	case PartCookie:
		if r.HTTP == nil && r.Raw == nil {
			return "", false // gRPC has no cookies
		}
		return cookie(r.headerValues("Cookie", "cookie"), p.Name)
	case PartQuery:
		switch {
		case r.HTTP != nil:
			return query(r.HTTP.URL.RawQuery, p.Name)
		case r.Raw != nil:
			return query(r.Raw.RawQuery, p.Name)
		}
		return "", false
	case PartPath:
		return r.path(), true
	case PartRoute:
		return g.route(r), true
	case PartMethod:
		if s = r.method(); s == "" {
			s = r.FullMethod
		}
		return s, true
	case PartHost:
		return hostOnly(r.host()), true
	case PartUser:
		if g.cfg.User != nil {
			return g.cfg.User(r.ctx())
		}
		return UserFrom(r.ctx())
	}
	return "", true
}

// route is the Route part's value.
func (g *Gate) route(r *Request) string {
	switch {
	case r.Raw != nil:
		return r.Raw.Path
	case r.HTTP == nil:
		return r.FullMethod
	case g.cfg.Route != nil:
		return g.cfg.Route(r.HTTP)
	case r.HTTP.Pattern != "":
		return r.HTTP.Pattern
	}
	return r.path() // cleaned, as Path: "//x" and "/./x" are no routes of their own
}

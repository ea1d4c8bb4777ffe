package rules

import (
	"fmt"
	"strings"

	"go.yaml.in/yaml/v3"
)

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

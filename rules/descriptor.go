package rules

import (
	"fmt"
	"math"
	"regexp"
	"regexp/syntax"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"
)

// descriptors reads one level of descriptors into lvl.
func (p *parser) descriptors(v *yaml.Node, path string, depth int, parents []*node, lvl *level) []*node {
	items, ok := p.seq(v, path)
	if !ok {
		return nil
	}
	if depth > MaxDepth && len(items) > 0 {
		p.add(v.Line, path, "descriptors nest deeper than %d levels", MaxDepth)
		return nil
	}
	var order []*node
	for i, it := range items {
		ip := fmt.Sprintf("%s[%d]", path, i)
		if p.over {
			return order
		}
		if it.Kind != yaml.MappingNode {
			p.add(it.Line, ip, "want a descriptor (a mapping with a key), got %s", kindName(it))
			continue
		}
		p.descs++
		if p.descs > maxDescriptors {
			p.add(it.Line, ip, "more than %d descriptors in one file", maxDescriptors)
			p.over = true
			return order
		}
		if n := p.descriptor(it, ip, depth, parents, lvl); n != nil {
			order = append(order, n)
		}
	}
	// The longest prefix is tried first.
	for _, g := range lvl.byKey {
		sort.SliceStable(g.prefixes, func(i, j int) bool { return len(g.prefixes[i].value) > len(g.prefixes[j].value) })
	}
	return order
}

// descSpec is one descriptor's fields as written.
type descSpec struct {
	n                       *node
	later                   map[string]*field // all but key and the booleans, by name
	bad                     bool              // an error that drops the node (reported)
	keySet                  bool
	shadow, quota, detailed bool
}

// descBools are a descriptor's boolean fields, and where each goes.
var descBools = map[string]func(d *descSpec) *bool{
	"exempt":          func(d *descSpec) *bool { return &d.n.exempt },
	"shadow_mode":     func(d *descSpec) *bool { return &d.shadow },
	"quota_mode":      func(d *descSpec) *bool { return &d.quota },
	"detailed_metric": func(d *descSpec) *bool { return &d.detailed },
	"value_to_metric": func(d *descSpec) *bool { return &d.n.toMetric },
	"share_threshold": func(d *descSpec) *bool { return &d.n.share },
}

// valueFields are how a descriptor matches values, exclusive, and how each
// is read into the node.
var valueFields = []struct {
	name string
	read func(p *parser, n *node, v *yaml.Node, path string) bool
}{
	{"value", (*parser).descValue},
	{"value_prefix", (*parser).descPrefix},
	{"value_regex", (*parser).descRegex},
}

// exemptRefuses are the fields an exempt descriptor cannot have.
var exemptRefuses = []string{"rate_limit", "rate_limits", "descriptors", "exempt_values"}

// descriptor reads one descriptor and adds it to lvl.
func (p *parser) descriptor(m *yaml.Node, path string, depth int, parents []*node, lvl *level) *node {
	d := p.descFields(m, path)
	if !d.keySet && !d.bad {
		p.add(m.Line, join(path, "key"), "missing: every descriptor has a key")
		d.bad = true
	}
	p.descMatch(d, m.Line, path)
	p.descChecks(d, path)
	if d.bad || !p.register(lvl, d.n, path) {
		return nil
	}
	n := d.n
	if f := d.later["exempt_values"]; f != nil {
		p.exemptValues(lvl, n, f, join(path, "exempt_values"))
	}
	chain := append(parents[:len(parents):len(parents)], n)
	p.descLimit(d, path, chain)
	if f := d.later["descriptors"]; f != nil {
		n.children = &level{byKey: map[string]*keyGroup{}}
		n.order = p.descriptors(f.val, join(path, "descriptors"), depth+1, chain, n.children)
	}
	return n
}

// descFields reads a descriptor's key and booleans, and keeps the rest.
func (p *parser) descFields(m *yaml.Node, path string) *descSpec {
	d := &descSpec{n: &node{line: m.Line}, later: map[string]*field{}}
	fs := p.fields(m, path)
	for i := range fs {
		f := &fs[i]
		fp := join(path, f.name)
		if isNull(p.resolve(f.val)) && f.name != "key" {
			continue
		}
		switch b := descBools[f.name]; {
		case f.name == "key":
			p.descKey(d, f, fp)
		case b != nil:
			*b(d), _ = p.boolean(f.val, fp)
			d.later[f.name] = f
		case contains(descFields, f.name):
			d.later[f.name] = f
		default:
			p.unknown(*f, path, descFields)
		}
	}
	return d
}

func (p *parser) descKey(d *descSpec, f *field, path string) {
	s, ok := p.str(f.val, path)
	if !ok {
		d.bad = true
		return
	}
	d.n.key, d.keySet = s, s != ""
	if s == "" {
		p.add(f.val.Line, path, "must not be empty")
		d.bad = true
	}
}

// descMatch reads how the node matches values: value, value_prefix or
// value_regex, or none (every value).
func (p *parser) descMatch(d *descSpec, line int, path string) {
	given := 0
	for _, vf := range valueFields {
		if d.later[vf.name] != nil {
			given++
		}
	}
	if given > 1 {
		p.add(line, path, "value, value_prefix and value_regex exclude each other")
		d.bad = true
	}
	for _, vf := range valueFields {
		if f := d.later[vf.name]; f != nil {
			if !vf.read(p, d.n, f.val, join(path, vf.name)) {
				d.bad = true
			}
			return
		}
	}
}

func (p *parser) descValue(n *node, v *yaml.Node, path string) bool {
	s, ok := p.str(v, path)
	if !ok {
		return false
	}
	// An empty value is no value, as envoyproxy/ratelimit reads it.
	switch {
	case s == "":
		n.kind = kindKey
	case strings.Contains(s, "*"):
		n.kind, n.value, n.parts = kindGlob, s, strings.Split(s, "*")
	default:
		n.kind, n.value = kindExact, s
	}
	return true
}

func (p *parser) descPrefix(n *node, v *yaml.Node, path string) bool {
	s, ok := p.str(v, path)
	if !ok {
		return false
	}
	n.kind, n.value = kindPrefix, s
	if s == "" {
		p.add(v.Line, path, "must not be empty (a descriptor without a value matches every value)")
		return false
	}
	return true
}

func (p *parser) descRegex(n *node, v *yaml.Node, path string) bool {
	s, ok := p.str(v, path)
	if !ok {
		return false
	}
	switch {
	case s == "":
		p.add(v.Line, path, "must not be empty")
		return false
	case len(s) > MaxRegexLen:
		p.add(v.Line, path, "is %d bytes long; at most %d", len(s), MaxRegexLen)
		return false
	}
	re, err := p.regex(s)
	n.kind, n.value, n.re = kindRegex, s, re
	if err != nil {
		p.add(v.Line, path, "%s", err)
		return false
	}
	return true
}

// descChecks checks the fields that need or exclude others.
func (p *parser) descChecks(d *descSpec, path string) {
	n := d.n
	if f := d.later["share_threshold"]; n.share && n.kind != kindGlob && n.kind != kindPrefix && n.kind != kindRegex {
		p.add(f.key.Line, join(path, "share_threshold"), "needs a wildcard value (containing '*'), a value_prefix or a value_regex: it makes every value the pattern matches share one limit")
	}
	if n.exempt {
		for _, name := range exemptRefuses {
			if f := d.later[name]; f != nil {
				p.add(f.key.Line, join(path, name), "an exempt descriptor is never limited: it cannot have %s", name)
			}
		}
	}
	if rls := d.later["rate_limits"]; rls != nil && d.later["rate_limit"] != nil {
		p.add(rls.key.Line, join(path, "rate_limits"), "give rate_limit or rate_limits, not both")
		delete(d.later, "rate_limits")
	}
}

// descLimit reads the node's limit and its metadata.
func (p *parser) descLimit(d *descSpec, path string, chain []*node) {
	rl, rls, meta := d.later["rate_limit"], d.later["rate_limits"], d.later["metadata"]
	if rl == nil && rls == nil {
		if meta != nil {
			// Metadata travels with a limit; a node without one has
			// nowhere to send it, but it is still checked.
			p.metadata(meta, join(path, "metadata"))
		}
		return
	}
	n := d.n
	if n.limit = p.limit(rl, rls, path, chain); n.limit == nil {
		return
	}
	n.limit.ShadowMode, n.limit.QuotaMode, n.limit.DetailedMetric = d.shadow, d.quota, d.detailed
	if meta != nil {
		n.limit.Metadata = p.metadata(meta, join(path, "metadata"))
	}
}

// register adds n to lvl unless a node with its key and value is there.
func (p *parser) register(lvl *level, n *node, path string) bool {
	g := lvl.byKey[n.key]
	if g == nil {
		g = &keyGroup{}
		lvl.byKey[n.key] = g
	}
	var dup *node
	switch n.kind {
	case kindKey:
		dup = g.keyOnly
	case kindExact:
		dup = g.exact[n.value]
	default:
		dup = g.patterns[string(rune('0'+n.kind))+n.value]
	}
	if dup != nil {
		if dup.synth {
			p.add(n.line, path, "duplicate descriptor: %s is listed in exempt_values at line %d", n.describe(), dup.line)
		} else {
			p.add(n.line, path, "duplicate descriptor: %s is already defined at line %d", n.describe(), dup.line)
		}
		return false
	}
	g.add(n)
	return true
}

// describe says a node's key and value for messages.
func (n *node) describe() string {
	what := fmt.Sprintf("key %q", n.key)
	switch n.kind {
	case kindExact, kindGlob:
		what += fmt.Sprintf(" value %q", n.value)
	case kindPrefix:
		what += fmt.Sprintf(" value_prefix %q", n.value)
	case kindRegex:
		what += fmt.Sprintf(" value_regex %q", n.value)
	}
	return what
}

// add files n in g by how it matches.
func (g *keyGroup) add(n *node) {
	switch n.kind {
	case kindKey:
		g.keyOnly = n
	case kindExact:
		if g.exact == nil {
			g.exact = map[string]*node{}
		}
		g.exact[n.value] = n
	case kindPrefix:
		g.prefixes = append(g.prefixes, n) // sorted when the level is complete
	case kindRegex:
		g.regexes = append(g.regexes, n)
	case kindGlob:
		g.globs = append(g.globs, n)
	}
	if n.kind >= kindPrefix {
		if g.patterns == nil {
			g.patterns = map[string]*node{}
		}
		g.patterns[string(rune('0'+n.kind))+n.value] = n
	}
}

// exemptValues adds an exempt exact sibling of n for each listed value.
func (p *parser) exemptValues(lvl *level, n *node, f *field, path string) {
	vals, ok := p.seq(f.val, path)
	if !ok {
		return
	}
	if n.kind == kindExact {
		p.add(f.key.Line, path, "needs a descriptor that matches many values (no value, a wildcard, value_prefix or value_regex)")
		return
	}
	for i, v := range vals {
		vp := fmt.Sprintf("%s[%d]", path, i)
		s, ok := p.str(v, vp)
		if !ok {
			continue
		}
		p.descs++
		if p.descs > maxDescriptors {
			p.add(v.Line, vp, "more than %d descriptors in one file", maxDescriptors)
			p.over = true
			return
		}
		if s == "" {
			p.add(v.Line, vp, "must not be empty")
			continue
		}
		probe := &node{parts: n.parts, re: n.re, kind: n.kind, value: n.value}
		if n.kind != kindKey && !probe.matches(s) {
			p.add(v.Line, vp, "%q does not match this descriptor's %s", s, n.matchField())
			continue
		}
		if p.register(lvl, &node{key: n.key, kind: kindExact, value: s, exempt: true, synth: true, line: v.Line}, vp) {
			n.exempts = append(n.exempts, s)
		}
	}
}

func (n *node) matches(v string) bool {
	switch n.kind {
	case kindExact:
		return v == n.value
	case kindPrefix:
		return strings.HasPrefix(v, n.value)
	case kindRegex:
		return n.re.MatchString(v)
	case kindGlob:
		return globMatch(n.parts, v)
	}
	return true
}

func (n *node) matchField() string {
	switch n.kind {
	case kindPrefix:
		return "value_prefix"
	case kindRegex:
		return "value_regex"
	}
	return "value"
}

// regex compiles a value_regex, anchored at both ends, unless its program
// is larger than MaxRegexInsts or takes the file's programs beyond
// MaxFileRegex: a request's value is matched against every value_regex of
// its level in turn, in time that grows with the programs' size and the
// value's length, and compiled programs take memory. The size is learnt
// from regexp/syntax before the full compilation (whose memory grows with
// it).
func (p *parser) regex(s string) (*regexp.Regexp, error) {
	src := `^(?:` + s + `)$`
	re, err := syntax.Parse(src, syntax.Perl)
	if err != nil {
		return nil, fmt.Errorf("invalid RE2 regular expression: %s", strings.TrimPrefix(err.Error(), "error parsing regexp: "))
	}
	prog, err := syntax.Compile(re.Simplify())
	if err != nil {
		return nil, fmt.Errorf("invalid RE2 regular expression: %s", err)
	}
	switch n := len(prog.Inst); {
	case n > MaxRegexInsts:
		return nil, fmt.Errorf("compiles to %d instructions; at most %d (write fewer or smaller counted repetitions such as {1,30})", n, MaxRegexInsts)
	case p.rxInsts+n > MaxFileRegex:
		return nil, fmt.Errorf("the file's value_regex compile to more than %d instructions in all; use value_prefix or exact values for some", MaxFileRegex)
	default:
		p.rxInsts += n
	}
	return regexp.Compile(src)
}

// metadata converts a metadata mapping to plain Go values: map[string]any,
// []any, string, int64, float64, bool and nil. What one limit's metadata
// holds, aliases expanded, is bounded by MaxMetadata, since it is copied
// into every response that matches the limit.
func (p *parser) metadata(f *field, path string) map[string]any {
	m, ok := p.mapping(f.val, path)
	if !ok {
		return nil
	}
	p.meta = maxMetadata
	v, ok := p.plain(m, path, 0)
	if !ok {
		return nil
	}
	return v.(map[string]any)
}

func (p *parser) plain(v *yaml.Node, path string, depth int) (any, bool) {
	if depth > maxYAMLDepth {
		p.add(v.Line, path, "nests deeper than %d levels", maxYAMLDepth)
		return nil, false
	}
	if !p.visit(v) {
		return nil, false
	}
	if v = p.resolve(v); v == nil {
		return nil, false
	}
	if p.meta -= 16 + len(v.Value); p.meta < 0 {
		p.add(v.Line, path, "metadata is more than %d bytes once aliases are expanded", maxMetadata)
		return nil, false
	}
	switch v.Kind {
	case yaml.MappingNode:
		out := map[string]any{}
		for _, f := range p.fields(v, path) {
			x, ok := p.plain(f.val, join(path, f.name), depth+1)
			if !ok {
				return nil, false
			}
			out[f.name] = x
		}
		return out, true
	case yaml.SequenceNode:
		out := make([]any, 0, len(v.Content))
		for i, e := range v.Content {
			x, ok := p.plain(e, fmt.Sprintf("%s[%d]", path, i), depth+1)
			if !ok {
				return nil, false
			}
			out = append(out, x)
		}
		return out, true
	case yaml.ScalarNode:
		return p.plainScalar(v, path)
	}
	p.add(v.Line, path, "unsupported YAML")
	return nil, false
}

// plainScalar converts a scalar by its tag, as plain does.
func (p *parser) plainScalar(v *yaml.Node, path string) (any, bool) {
	if len(v.Value) > MaxStringLen {
		p.add(v.Line, path, "is %d bytes long; at most %d", len(v.Value), MaxStringLen)
		return nil, false
	}
	var (
		b bool
		i int64
		f float64
	)
	switch v.ShortTag() {
	case "!!null":
		return nil, true
	case "!!bool":
		if v.Decode(&b) == nil {
			return b, true
		}
	case "!!int":
		if v.Decode(&i) == nil {
			return i, true
		}
		if v.Decode(&f) == nil {
			return f, true
		}
	case "!!float":
		if v.Decode(&f) != nil {
			break
		}
		if math.IsNaN(f) || math.IsInf(f, 0) {
			p.add(v.Line, path, "NaN and infinities cannot be sent as metadata")
			return nil, false
		}
		return f, true
	}
	return v.Value, true
}

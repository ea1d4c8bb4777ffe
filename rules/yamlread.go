package rules

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

type parser struct {
	errList
	visited int  // YAML nodes visited
	over    bool // the visit budget is spent
	rxInsts int  // instructions of the file's value_regex so far
	meta    int  // metadata budget left of the limit being read
	descs   int
	opts    Options
	dom     *Domain
	top     []*node
	fail    failDefaults
}

type failDefaults struct {
	mode    string
	percent int64
	line    int
}

// field is one key of a YAML mapping.
type field struct {
	name string
	key  *yaml.Node
	val  *yaml.Node
}

// visit counts a node against the budget.
func (p *parser) visit(n *yaml.Node) bool {
	p.visited++
	if p.visited > maxYAMLNodes {
		if !p.over {
			p.over = true
			p.add(n.Line, "", "the file expands (aliases included) to more than %d YAML nodes", maxYAMLNodes)
		}
		return false
	}
	return true
}

// resolve follows aliases.
func (p *parser) resolve(n *yaml.Node) *yaml.Node {
	for i := 0; n != nil && n.Kind == yaml.AliasNode; i++ {
		if i > 100 || !p.visit(n) {
			return nil
		}
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool {
	return n == nil || n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if isNull(n) {
			return "null"
		}
		return fmt.Sprintf("%q", n.Value)
	}
	return "something else"
}

// fields returns a mapping's keys in order, merge keys ("<<") expanded,
// checking duplicates. depth counts merge nesting.
func (p *parser) fields(n *yaml.Node, path string) []field {
	var out []field
	seen := map[string]*yaml.Node{}
	p.collect(n, path, &out, seen, false, 0)
	return out
}

func (p *parser) collect(n *yaml.Node, path string, out *[]field, seen map[string]*yaml.Node, merged bool, depth int) {
	if depth > 10 {
		p.add(n.Line, path, "merge keys (<<) nest too deep")
		return
	}
	var merges []*yaml.Node
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if !p.visit(k) || !p.visit(v) {
			return
		}
		k = p.resolve(k)
		switch {
		case k == nil:
			return
		case k.Kind != yaml.ScalarNode || isNull(k):
			p.add(k.Line, path, "a field name must be a string, not %s", kindName(k))
		case k.Value == "<<" && k.Style&(yaml.SingleQuotedStyle|yaml.DoubleQuotedStyle) == 0:
			merges = append(merges, v)
		case seen[k.Value] != nil:
			if !merged {
				p.add(k.Line, join(path, k.Value), "given twice (first at line %d)", seen[k.Value].Line)
			}
		default:
			seen[k.Value] = k
			*out = append(*out, field{name: k.Value, key: k, val: v})
		}
	}
	for _, m := range merges {
		maps, ok := p.mergeMaps(m)
		if !ok {
			return
		}
		for _, mm := range maps {
			if mm.Kind != yaml.MappingNode {
				p.add(mm.Line, path, "a merge key (<<) must name mappings")
				continue
			}
			p.collect(mm, path, out, seen, true, depth+1)
		}
	}
}

// mergeMaps is what a merge key's value names: a mapping or a list of them
// (aliases resolved, each checked by the caller).
func (p *parser) mergeMaps(m *yaml.Node) ([]*yaml.Node, bool) {
	if m = p.resolve(m); m == nil {
		return nil, false
	}
	switch m.Kind {
	case yaml.MappingNode:
		return []*yaml.Node{m}, true
	case yaml.SequenceNode:
		var maps []*yaml.Node
		for _, e := range m.Content {
			if e = p.resolve(e); e != nil {
				maps = append(maps, e)
			}
		}
		return maps, true
	}
	return nil, true
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

// unknown reports a field that has no place here, with a hint.
func (p *parser) unknown(f field, path string, allowed []string) {
	msg := fmt.Sprintf("unknown field %q", f.name)
	switch {
	case contains(ruleFields, f.name) && !contains(allowed, f.name):
		msg += " here (it belongs in rate_limit)"
	case contains(descFields, f.name) && !contains(allowed, f.name):
		msg += " here (it is a descriptor field)"
	case contains(rootFields, f.name) && !contains(allowed, f.name):
		msg += " here (it is a top-level field)"
	default:
		if s := closest(f.name, allowed); s != "" {
			msg += fmt.Sprintf(" (did you mean %q?)", s)
		}
	}
	p.add(f.key.Line, join(path, f.name), "%s", msg)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// closest returns the allowed name nearest to s by edit distance, if near.
func closest(s string, allowed []string) string {
	if len(s) > 64 {
		return ""
	}
	best, bestD := "", 3
	norm := strings.ToLower(strings.NewReplacer("-", "_", " ", "_").Replace(s))
	for _, a := range allowed {
		if d := editDistance(norm, a); d < bestD || d == bestD && best == "" && d < 3 {
			best, bestD = a, d
		}
		if strings.ReplaceAll(a, "_", "") == strings.ReplaceAll(norm, "_", "") {
			return a
		}
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			c := 1
			if a[i-1] == b[j-1] {
				c = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+c)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// str reads a string scalar (any scalar but null); ok is false (and an
// error reported) for anything else.
func (p *parser) str(v *yaml.Node, path string) (string, bool) {
	v = p.resolve(v)
	if v == nil {
		return "", false
	}
	if v.Kind != yaml.ScalarNode || isNull(v) {
		p.add(v.Line, path, "want a string, got %s", kindName(v))
		return "", false
	}
	if len(v.Value) > MaxStringLen {
		p.add(v.Line, path, "is %d bytes long; at most %d", len(v.Value), MaxStringLen)
		return "", false
	}
	return v.Value, true
}

// quoted reports whether v is a string by its style or an explicit
// !!str tag, whatever its text: '5' is no number and "yes" no boolean. (A
// plain yes is tagged !!str by yaml.v3, which reads YAML 1.2; it is still
// a boolean here, as in YAML 1.1.)
func quoted(v *yaml.Node) bool {
	return v.Style&(yaml.SingleQuotedStyle|yaml.DoubleQuotedStyle|yaml.LiteralStyle|yaml.FoldedStyle) != 0 ||
		v.Style&yaml.TaggedStyle != 0 && v.Tag == "!!str"
}

// boolean reads true or false, and YAML 1.1's spellings of them (yes, no,
// on, off, y, n, in lower, title or upper case), as envoyproxy/ratelimit's
// YAML parser (yaml.v2) accepts them.
func (p *parser) boolean(v *yaml.Node, path string) (bool, bool) {
	v = p.resolve(v)
	if v == nil {
		return false, false
	}
	if v.Kind == yaml.ScalarNode && !quoted(v) {
		switch v.Value {
		case "true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON", "y", "Y":
			return true, true
		case "false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF", "n", "N":
			return false, true
		}
	}
	p.add(v.Line, path, "want true or false, got %s", kindName(v))
	return false, false
}

// integer reads a whole number in [lo, hi], written as envoyproxy/ratelimit's
// YAML parser (yaml.v2, YAML 1.1) reads it: decimal with optional '_'
// separators, 0x hexadecimal, 0b binary, 0o or a leading 0 octal (010 is
// 8), and a number with a fraction or an exponent whose value is whole
// (5.0, 1e3). A fraction (5.5, which yaml.v2 would cut to 5) is an error.
func (p *parser) integer(v *yaml.Node, path string, lo, hi int64) (int64, bool) {
	v = p.resolve(v)
	if v == nil {
		return 0, false
	}
	if v.Kind != yaml.ScalarNode || quoted(v) || isNull(v) {
		p.add(v.Line, path, "want a whole number, got %s", kindName(v))
		return 0, false
	}
	n, err := parseYAMLInt(v.Value)
	if err != nil {
		if errors.Is(err, strconv.ErrRange) {
			p.add(v.Line, path, "%s is out of range (%d to %d)", v.Value, lo, hi)
		} else if errors.Is(err, errFraction) {
			p.add(v.Line, path, "%s is not a whole number", v.Value)
		} else {
			p.add(v.Line, path, "want a whole number, got %s", kindName(v))
		}
		return 0, false
	}
	if n < lo || n > hi {
		p.add(v.Line, path, "%d is out of range (%d to %d)", n, lo, hi)
		return 0, false
	}
	return n, true
}

var errFraction = errors.New("a fraction")

// parseYAMLInt reads a plain scalar as YAML 1.1 reads an integer (see
// integer).
func parseYAMLInt(s string) (int64, error) {
	plain := strings.ReplaceAll(s, "_", "")
	if n, err := strconv.ParseInt(plain, 0, 64); err == nil || errors.Is(err, strconv.ErrRange) {
		return n, err // base 0: 0x, 0b, 0o and a leading 0 (octal), as yaml.v2
	}
	if strings.ContainsAny(plain, "xXbBoO") || !strings.ContainsAny(plain, "0123456789") {
		return 0, strconv.ErrSyntax
	}
	// 08, 5.0, 1e3: a float, as yaml.v2 resolves them, if it is whole.
	f, err := strconv.ParseFloat(plain, 64)
	switch {
	case err != nil:
		if errors.Is(err, strconv.ErrRange) {
			return 0, strconv.ErrRange
		}
		return 0, err
	case math.IsInf(f, 0) || math.IsNaN(f):
		return 0, strconv.ErrSyntax
	case f != math.Trunc(f):
		return 0, errFraction
	case f >= 1<<63 || f < -(1<<63):
		return 0, strconv.ErrRange
	}
	return int64(f), nil
}

// seq reads a list.
func (p *parser) seq(v *yaml.Node, path string) ([]*yaml.Node, bool) {
	v = p.resolve(v)
	if v == nil {
		return nil, false
	}
	if isNull(v) {
		return nil, true
	}
	if v.Kind != yaml.SequenceNode {
		p.add(v.Line, path, "want a list, got %s", kindName(v))
		return nil, false
	}
	out := make([]*yaml.Node, 0, len(v.Content))
	for _, e := range v.Content {
		if !p.visit(e) {
			return nil, false
		}
		if e = p.resolve(e); e == nil {
			return nil, false
		}
		out = append(out, e)
	}
	return out, true
}

// mapping checks v is a mapping.
func (p *parser) mapping(v *yaml.Node, path string) (*yaml.Node, bool) {
	v = p.resolve(v)
	if v == nil {
		return nil, false
	}
	if v.Kind != yaml.MappingNode {
		p.add(v.Line, path, "want a mapping, got %s", kindName(v))
		return nil, false
	}
	return v, true
}

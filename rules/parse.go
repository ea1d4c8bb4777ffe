package rules

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"regexp"
	"regexp/syntax"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
)

// Limits on what one rules file may hold, so hostile input costs bounded
// work.
const (
	MaxFileSize    = 4 << 20 // bytes in one rules file
	MaxDepth       = 32      // nested descriptor levels (and entries in a matched request descriptor)
	MaxDescriptors = 50000   // descriptors in one file, exempt_values included
	MaxStringLen   = 4096    // bytes in a key, value, value_prefix, name or metadata string
	MaxRegexLen    = 1024    // bytes in a value_regex
	MaxRegexInsts  = 500     // instructions a value_regex compiles to
	MaxFileRegex   = 4000    // instructions all of a file's value_regex compile to
	MaxMetadata    = 16384   // bytes of one limit's metadata, aliases expanded (strings, plus 16 a value)
	MaxYAMLNodes   = 2000000 // YAML nodes visited, aliases expanded
	MaxRoutes      = 4096    // http routes in one file (a gate takes any number of files' routes)
	MaxRouteParts  = 8       // parts of an http route's key (the gate's bound)
	maxYAMLDepth   = 200     // YAML nesting (metadata included)
)

// The limits as enforced; tests lower them.
var (
	maxDescriptors = MaxDescriptors
	maxYAMLNodes   = MaxYAMLNodes
	maxMetadata    = MaxMetadata
)

// field names by place, for "unknown field" hints (the names the parser's
// tables read: TestFieldListsMatchTables)
var (
	rootFields = []string{"domain", "descriptors", "all_or_nothing", "failure_mode", "local_percent", "http"}
	descFields = []string{"key", "value", "value_prefix", "value_regex", "exempt", "exempt_values",
		"rate_limit", "rate_limits", "descriptors", "shadow_mode", "quota_mode", "detailed_metric",
		"value_to_metric", "share_threshold", "metadata"}
	ruleFields = []string{"unit", "requests_per_unit", "unit_multiplier", "unlimited", "name", "replaces",
		"window", "calendar", "time_zone", "week_start", "algorithm", "burst", "refill", "granularity",
		"mode", "soft_percent", "elastic_ceiling", "count_rejected", "failure_mode", "local_percent",
		"tier", "budget"}
)

// Options change how files are read, for settings envoyproxy/ratelimit
// takes from its environment rather than its files.
type Options struct {
	// CalendarMonth makes unit: month a calendar month in UTC (from the 1st,
	// 00:00 UTC, to the next), as envoyproxy/ratelimit does with
	// USE_CALENDAR_MONTH_RATE_LIMIT=true, rather than 30 days from the epoch.
	CalendarMonth bool
}

// Parse reads one rules file: one domain. The error lists every problem
// found, each as "file:line: field: message" (see Error), joined with
// errors.Join. Parse never panics.
func Parse(file string, data []byte) (*Domain, error) {
	return ParseWith(file, data, Options{})
}

// ParseWith is Parse with options.
func ParseWith(file string, data []byte, opts Options) (d *Domain, err error) {
	defer func() {
		if r := recover(); r != nil {
			d, err = nil, &Error{File: file, Msg: fmt.Sprintf("internal error while parsing: %v", r)}
		}
	}()
	return parse(file, data, opts)
}

// parse is ParseWith without the safety net, for the fuzz test.
func parse(file string, data []byte, opts Options) (*Domain, error) {
	p := &parser{errList: errList{file: file}, opts: opts}
	if len(data) > MaxFileSize {
		p.add(0, "", "file is %d bytes; at most %d", len(data), MaxFileSize)
		return nil, p.err()
	}
	root, line, msg := decodeYAML(data)
	if msg != "" {
		if line == 0 { // the YAML parser names no line for bad bytes
			if l, what := badByte(data); l > 0 {
				line, msg = l, msg+" ("+what+"; rules files are UTF-8 text)"
			}
		}
		p.add(line, "", "%s", msg)
		return nil, p.err()
	}
	if n := oddTag(root, 0); n != nil {
		// !!binary would be read as its base64 text, and a local tag
		// (!foo) means something to another program only
		p.add(n.Line, "", "YAML tag %s is not supported here (rules are plain strings, numbers, booleans, lists and maps)", n.Tag)
		return nil, p.err()
	}
	d := p.domain(root)
	if d != nil {
		d.order = p.top
	}
	if err := p.err(); err != nil {
		return nil, err
	}
	return d, nil
}

// plainTags are the tags a rules file may give explicitly.
var plainTags = map[string]bool{"!!str": true, "!!int": true, "!!float": true, "!!bool": true, "!!null": true, "!!map": true, "!!seq": true, "!!merge": true, "!": true}

// oddTag returns the first node under n with an explicit tag other than
// the plain ones, or nil. Aliases are not followed (their anchors are
// walked where they stand); depth is bounded as decodeYAML bounds it.
func oddTag(n *yaml.Node, depth int) *yaml.Node {
	if n == nil || depth > 10_000 {
		return nil
	}
	if n.Style&yaml.TaggedStyle != 0 && !plainTags[n.Tag] {
		return n
	}
	if n.Kind == yaml.AliasNode {
		return nil
	}
	for _, c := range n.Content {
		if o := oddTag(c, depth+1); o != nil {
			return o
		}
	}
	return nil
}

// badByte finds the first byte of data that is no UTF-8 text (an invalid
// sequence, or a control character other than tab, newline and carriage
// return), returning its line and a description; 0 if there is none. A
// file starting with a UTF-16 byte order mark is left to the YAML parser.
func badByte(data []byte) (line int, what string) {
	if bytes.HasPrefix(data, []byte{0xFE, 0xFF}) || bytes.HasPrefix(data, []byte{0xFF, 0xFE}) {
		return 0, ""
	}
	line, col := 1, 1
	for i := 0; i < len(data); {
		r, size := utf8.DecodeRune(data[i:])
		switch {
		case r == utf8.RuneError && size <= 1:
			return line, fmt.Sprintf("byte 0x%02X at column %d is not UTF-8", data[i], col)
		case r < 0x20 && r != '\t' && r != '\n' && r != '\r', r == 0x7F:
			return line, fmt.Sprintf("control character 0x%02X at column %d", r, col)
		case r == '\n':
			line, col = line+1, 0
		}
		i += size
		col++
	}
	return 0, ""
}

var yamlLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// decodeYAML parses one YAML document. An empty file is an empty mapping.
// Empty documents after it (a trailing "---") are ignored; a second
// document with content is an error.
func decodeYAML(data []byte) (root *yaml.Node, line int, msg string) {
	defer func() {
		if r := recover(); r != nil {
			root, line, msg = nil, 0, fmt.Sprintf("invalid YAML: %v", r)
		}
	}()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return &yaml.Node{Kind: yaml.MappingNode, Line: 1}, 0, ""
		}
		line, msg := yamlErrLine(err)
		return nil, line, msg
	}
	for {
		var extra yaml.Node
		err := dec.Decode(&extra)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			line, msg := yamlErrLine(err)
			return nil, line, msg
		}
		if !emptyDocument(&extra) {
			return nil, extra.Line, "a second YAML document: a rules file holds one domain"
		}
	}
	if doc.Kind == yaml.DocumentNode && len(doc.Content) == 1 {
		return doc.Content[0], 0, ""
	}
	return &doc, 0, ""
}

// emptyDocument reports whether doc, a document after the first, holds
// nothing: a trailing "---" followed by nothing, or by comments and blank
// lines only, as Helm and concatenated files end. envoyproxy/ratelimit
// reads the first document and ignores the rest; here a later document
// with content (even an explicit null, "~") is refused, an empty one is not.
func emptyDocument(doc *yaml.Node) bool {
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 {
		return false
	}
	n := doc.Content[0]
	return n.Kind == yaml.ScalarNode && n.Tag == "!!null" && n.Value == "" && n.Style == 0 && n.Anchor == ""
}

func yamlErrLine(err error) (int, string) {
	s := err.Error()
	if m := yamlLine.FindStringSubmatch(s); m != nil {
		n, _ := strconv.Atoi(m[1])
		return n, "invalid YAML: " + m[2]
	}
	return 0, "invalid YAML: " + strings.TrimPrefix(s, "yaml: ")
}

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

// domain reads the file's top level.
func (p *parser) domain(root *yaml.Node) *Domain {
	root, ok := p.mapping(root, "")
	if !ok {
		return nil
	}
	d := &Domain{File: p.file, root: &level{byKey: map[string]*keyGroup{}}}
	p.dom = d
	later := p.rootFields(root, d)
	p.fileLocalPercent(later["local_percent"])
	p.domainName(d, later["domain"], root.Line)
	errsBefore := len(p.errs) + p.extra
	if f := later["descriptors"]; f != nil {
		p.top = p.descriptors(f.val, "descriptors", 1, nil, d.root)
	}
	p.nameLimits()
	if f := later["http"]; f != nil {
		// Routes without a limit of their own are checked against the
		// descriptors, unless those had errors.
		d.http = p.httpSection(f.val, "http", len(p.errs)+p.extra == errsBefore)
	}
	return d
}

// rootFields reads all_or_nothing and failure_mode, and returns the other
// top-level fields by name (domain even when null).
func (p *parser) rootFields(root *yaml.Node, d *Domain) map[string]*field {
	later := map[string]*field{}
	fs := p.fields(root, "")
	for i := range fs {
		f := &fs[i]
		if isNull(p.resolve(f.val)) {
			if f.name == "domain" {
				later[f.name] = f
			}
			continue
		}
		switch f.name {
		case "all_or_nothing":
			d.AllOrNothing, _ = p.boolean(f.val, f.name)
		case "failure_mode":
			p.fileFailureMode(f)
		case "domain", "descriptors", "local_percent", "http":
			later[f.name] = f
		default:
			p.unknown(*f, "", rootFields)
		}
	}
	return later
}

// fileFailureMode reads the file's failure_mode, its rules' default.
func (p *parser) fileFailureMode(f *field) {
	s, ok := p.str(f.val, f.name)
	if !ok {
		return
	}
	if s = strings.ToLower(s); s == "open" || s == "closed" || s == "local" {
		p.fail.mode, p.fail.line = s, f.val.Line
	} else {
		p.add(f.val.Line, f.name, "unknown failure mode %q (want open, closed or local)", s)
	}
}

// fileLocalPercent reads the file's local_percent, which failure_mode:
// local needs.
func (p *parser) fileLocalPercent(f *field) {
	if f == nil {
		if p.fail.mode == "local" {
			p.add(p.fail.line, "failure_mode", "local needs local_percent (1 to 100): the share of the limit each instance allows on its own")
		}
		return
	}
	if v, ok := p.integer(f.val, "local_percent", 1, 100); ok {
		p.fail.percent = v
		if p.fail.mode != "local" {
			p.add(f.val.Line, "local_percent", "needs failure_mode: local")
		}
	}
}

// domainName reads the domain's name, which every file gives.
func (p *parser) domainName(d *Domain, f *field, line int) {
	if f == nil || isNull(p.resolve(f.val)) {
		p.add(line, "domain", "missing: every rules file names its domain")
		return
	}
	if s, ok := p.str(f.val, "domain"); ok {
		if s == "" {
			p.add(f.val.Line, "domain", "must not be empty")
		}
		d.Name = s
	}
}

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

package rules

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
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
	// Spare, if set, is the live spare-capacity signal of the elastic
	// mode (floodgate.Rule.Spare): a rate_limit may then say
	// mode: elastic with elastic_ceiling, and admits up to the ceiling
	// while Spare reports true (a server throttler's
	// throttle.Throttler.Spare: floodgate proxy gives its own). Without
	// it, mode: elastic is refused, as a file cannot give the signal.
	Spare func() bool
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

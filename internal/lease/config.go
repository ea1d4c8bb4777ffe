package lease

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// An Error is one problem in a resources file: where and which field. Its
// text is "file:line: field: message", e.g.
//
//	resources.yaml:7: resources[1].refresh_interval: 60s is not shorter than lease_length (60s)
//
// ParseConfig returns every Error it finds joined with errors.Join.
type Error struct {
	File  string // the file's name, as given to ParseConfig
	Line  int    // 1-based; 0 when the problem has no line
	Field string // e.g. "resources[1].refresh_interval"; "" for the file as a whole
	Msg   string // what is wrong
}

// Error returns "file:line: field: message", leaving out a missing line or field.
func (e *Error) Error() string {
	s := e.File
	if e.Line > 0 {
		s += ":" + strconv.Itoa(e.Line)
	}
	if e.Field != "" {
		s += ": " + e.Field
	}
	return s + ": " + e.Msg
}

// Limits of a resources file.
const (
	MaxConfigBytes = 4 << 20 // the largest file
	MaxResources   = 10_000  // the most resources
	maxNodes       = 200_000 // YAML nodes, aliases expanded
	maxErrors      = 50
	maxDuration    = 24 * time.Hour
)

var rootFields = []string{"resources"}

var resourceFields = []string{"id", "capacity", "safe_capacity", "algorithm", "static_capacity",
	"lease_length", "refresh_interval", "learning_mode"}

var algorithms = []Algorithm{None, Static, ProportionalShare, FairShare}

type cparser struct {
	file    string
	errs    []error
	extra   int
	visited int
}

func (p *cparser) add(line int, field, format string, args ...any) {
	if len(p.errs) >= maxErrors {
		p.extra++
		return
	}
	p.errs = append(p.errs, &Error{File: p.file, Line: line, Field: field, Msg: fmt.Sprintf(format, args...)})
}

func (p *cparser) err() error {
	if len(p.errs) == 0 {
		return nil
	}
	sort.SliceStable(p.errs, func(i, j int) bool { return p.errs[i].(*Error).Line < p.errs[j].(*Error).Line })
	if p.extra > 0 {
		p.errs = append(p.errs, &Error{File: p.file, Msg: fmt.Sprintf("%d more errors not shown", p.extra)})
	}
	return errors.Join(p.errs...)
}

// ParseConfig reads a resources file's content; name is the file's name in
// messages. Every error reads "name:line: field: message" (an *Error), all
// of them joined; the Config is nil if there is any.
//
//	resources:
//	  - id: "db/*"
//	    capacity: 1000
//	    algorithm: fair_share
//	    lease_length: 60s
//	    refresh_interval: 5s
//	  - id: "*"            # the mandatory default, last
//	    capacity: 100
func ParseConfig(name string, data []byte) (*Config, error) {
	p := &cparser{file: name}
	if len(data) > MaxConfigBytes {
		p.add(0, "", "the file is %d bytes; at most %d", len(data), MaxConfigBytes)
		return nil, p.err()
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		p.add(yamlLine(err), "", "%s", yamlMsg(err))
		return nil, p.err()
	}
	if len(doc.Content) == 0 {
		p.add(0, "", "the file is empty: want a mapping with a resources list")
		return nil, p.err()
	}
	cfg := p.root(doc.Content[0])
	if err := p.err(); err != nil {
		return nil, err
	}
	return cfg, nil
}

// LoadConfig reads and parses the resources file at file.
func LoadConfig(file string) (*Config, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data := make([]byte, MaxConfigBytes+1)
	n, err := readFull(f, data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return ParseConfig(file, data[:n])
}

func readFull(f *os.File, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := f.Read(buf[n:])
		n += m
		if err != nil {
			if err.Error() == "EOF" {
				return n, nil
			}
			return n, err
		}
	}
	return n, nil
}

var yamlLineRe = "line "

// yamlLine finds the line in a yaml.v3 syntax error ("yaml: line 3: ...").
func yamlLine(err error) int {
	s := err.Error()
	i := strings.Index(s, yamlLineRe)
	if i < 0 {
		return 0
	}
	s = s[i+len(yamlLineRe):]
	j := 0
	for j < len(s) && s[j] >= '0' && s[j] <= '9' {
		j++
	}
	n, _ := strconv.Atoi(s[:j])
	return n
}

func yamlMsg(err error) string {
	s := strings.TrimPrefix(err.Error(), "yaml: ")
	if l := yamlLine(err); l > 0 {
		s = strings.TrimPrefix(s, fmt.Sprintf("line %d: ", l))
	}
	return "YAML syntax: " + s
}

// resolve follows aliases, counting nodes against the budget.
func (p *cparser) resolve(n *yaml.Node) *yaml.Node {
	for i := 0; n != nil && n.Kind == yaml.AliasNode; i++ {
		if i > 100 {
			return nil
		}
		n = n.Alias
	}
	p.visited++
	if p.visited > maxNodes {
		if p.visited == maxNodes+1 {
			p.add(n.Line, "", "the file expands (aliases included) to more than %d YAML nodes", maxNodes)
		}
		return nil
	}
	return n
}

type cfield struct {
	name     string
	key, val *yaml.Node
}

// fields returns a mapping's fields, merge keys (<<) expanded, duplicates
// reported.
func (p *cparser) fields(n *yaml.Node, path string) []cfield {
	var out []cfield
	seen := map[string]int{}
	var walk func(n *yaml.Node, merged bool, depth int)
	walk = func(n *yaml.Node, merged bool, depth int) {
		if depth > 10 {
			p.add(n.Line, path, "merge keys (<<) nest too deep")
			return
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := p.resolve(n.Content[i]), n.Content[i+1]
			switch {
			case k == nil:
				return
			case k.Kind != yaml.ScalarNode:
				p.add(k.Line, path, "a field name must be a string")
			case k.Value == "<<" && k.Style&(yaml.SingleQuotedStyle|yaml.DoubleQuotedStyle) == 0:
				for _, m := range p.mergeMaps(v) {
					walk(m, true, depth+1)
				}
			case seen[k.Value] != 0:
				if !merged {
					p.add(k.Line, join(path, k.Value), "given twice (first at line %d)", seen[k.Value])
				}
			default:
				seen[k.Value] = k.Line
				out = append(out, cfield{k.Value, k, v})
			}
		}
	}
	walk(n, false, 0)
	return out
}

func (p *cparser) mergeMaps(v *yaml.Node) []*yaml.Node {
	v = p.resolve(v)
	if v == nil {
		return nil
	}
	var ms []*yaml.Node
	switch v.Kind {
	case yaml.MappingNode:
		ms = append(ms, v)
	case yaml.SequenceNode:
		for _, e := range v.Content {
			if e = p.resolve(e); e != nil && e.Kind == yaml.MappingNode {
				ms = append(ms, e)
			} else if e != nil {
				p.add(e.Line, "", "a merge key (<<) must name mappings")
			}
		}
	default:
		p.add(v.Line, "", "a merge key (<<) must name mappings")
	}
	return ms
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

func (p *cparser) unknown(f cfield, path string, allowed []string) {
	msg := fmt.Sprintf("unknown field %q", f.name)
	if s := closest(f.name, allowed); s != "" {
		msg += fmt.Sprintf(" (did you mean %q?)", s)
	} else {
		msg += fmt.Sprintf(" (want one of %s)", strings.Join(allowed, ", "))
	}
	p.add(f.key.Line, join(path, f.name), "%s", msg)
}

// closest returns the allowed name nearest to s, if near.
func closest(s string, allowed []string) string {
	norm := strings.ToLower(strings.NewReplacer("-", "_", " ", "_").Replace(s))
	best, bestD := "", 3
	for _, a := range allowed {
		if strings.ReplaceAll(a, "_", "") == strings.ReplaceAll(norm, "_", "") {
			return a
		}
		if d := editDistance(norm, a); d < bestD {
			best, bestD = a, d
		}
	}
	return best
}

func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return 99
	}
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

func kindName(n *yaml.Node) string {
	switch {
	case n.Kind == yaml.MappingNode:
		return "a mapping"
	case n.Kind == yaml.SequenceNode:
		return "a list"
	case n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null":
		return "null"
	case n.Kind == yaml.ScalarNode:
		return strconv.Quote(n.Value)
	}
	return "something else"
}

// root reads the top-level mapping.
func (p *cparser) root(n *yaml.Node) *Config {
	if n = p.resolve(n); n == nil {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		p.add(n.Line, "", "want a mapping with a resources list, got %s", kindName(n))
		return nil
	}
	var list *yaml.Node
	for _, f := range p.fields(n, "") {
		if f.name == "resources" {
			list = f.val
		} else {
			p.unknown(f, "", rootFields)
		}
	}
	if list == nil {
		p.add(n.Line, "resources", "missing: want a list of resources, the \"*\" default last")
		return nil
	}
	return p.resources(list)
}

// resources reads the list and checks it as a whole.
func (p *cparser) resources(n *yaml.Node) *Config {
	if n = p.resolve(n); n == nil {
		return nil
	}
	if n.Kind != yaml.SequenceNode || len(n.Content) == 0 {
		p.add(n.Line, "resources", "want a non-empty list of resources (the \"*\" default last), got %s", kindName(n))
		return nil
	}
	if len(n.Content) > MaxResources {
		p.add(n.Line, "resources", "%d resources; at most %d", len(n.Content), MaxResources)
		return nil
	}
	cfg := &Config{}
	all := make([]Resource, 0, len(n.Content))
	for i, e := range n.Content {
		path := fmt.Sprintf("resources[%d]", i)
		if e = p.resolve(e); e == nil {
			return nil
		}
		r, ok := p.resource(e, path)
		if r.Pos == "" {
			r.Pos = fmt.Sprintf("%s:%d", p.file, e.Line)
		}
		all = append(all, r)
		if ok {
			cfg.Resources = append(cfg.Resources, r)
		}
	}
	p.checkList(all, n.Content)
	return cfg
}

// checkList checks the ids across the list: no duplicate, none shadowed
// by an earlier pattern, the "*" default present and last.
func (p *cparser) checkList(all []Resource, nodes []*yaml.Node) {
	seen := map[string]string{}
	star := -1
	for i, r := range all {
		line := lineOf(r.Pos)
		path := fmt.Sprintf("resources[%d].id", i)
		if r.ID == "" {
			continue
		}
		if first, ok := seen[r.ID]; ok {
			p.add(line, path, "duplicate id %q (first at %s)", r.ID, first)
			continue
		}
		seen[r.ID] = r.Pos
		if r.ID == "*" && star < 0 {
			star = i
		}
		for _, q := range all[:i] {
			if q.ID != "" && q.ID != r.ID && q.ID != "*" && !hasMeta(r.ID) && match(q.ID, r.ID) {
				p.add(line, path, "%q is never used: %q (%s) comes first and matches it", r.ID, q.ID, q.Pos)
				break
			}
		}
	}
	last := len(all) - 1
	switch {
	case star < 0 && all[last].ID == "":
		// the last entry has no readable id: reported already
	case star < 0:
		p.add(nodes[last].Line, "resources", "no \"*\" default: the last resource must have id \"*\" (it serves every resource no other id matches)")
	case star != last:
		p.add(lineOf(all[star].Pos), fmt.Sprintf("resources[%d].id", star),
			"the \"*\" default must be the last resource (%d follow it and would never be used)", last-star)
	}
}

func hasMeta(s string) bool { return strings.ContainsAny(s, `*?[\`) }

func lineOf(pos string) int {
	i := strings.LastIndexByte(pos, ':')
	n, _ := strconv.Atoi(pos[i+1:])
	return n
}

// rfields is what one resource entry gave, before the cross-field checks.
type rfields struct {
	r     Resource
	lines map[string]int
}

// resource reads one entry.
func (p *cparser) resource(n *yaml.Node, path string) (Resource, bool) {
	if n.Kind != yaml.MappingNode {
		p.add(n.Line, path, "want a mapping (id, capacity, algorithm, ...), got %s", kindName(n))
		return Resource{}, false
	}
	before := len(p.errs) + p.extra
	rf := rfields{r: Resource{Pos: fmt.Sprintf("%s:%d", p.file, n.Line)}, lines: map[string]int{}}
	for _, f := range p.fields(n, path) {
		p.resourceField(&rf, f, path)
	}
	p.checkResource(&rf, n.Line, path)
	return rf.r, len(p.errs)+p.extra == before
}

func (p *cparser) resourceField(rf *rfields, f cfield, path string) {
	fp := join(path, f.name)
	rf.lines[f.name] = f.key.Line
	r := &rf.r
	switch f.name {
	case "id":
		r.ID = p.id(f.val, fp)
	case "capacity":
		r.Capacity = p.amount(f.val, fp)
	case "safe_capacity":
		r.SafeCapacity = p.amount(f.val, fp)
	case "static_capacity":
		r.StaticCapacity = p.amount(f.val, fp)
	case "algorithm":
		r.Algorithm = p.algorithm(f.val, fp)
	case "lease_length":
		r.LeaseLength = p.duration(f.val, fp)
	case "refresh_interval":
		r.RefreshInterval = p.duration(f.val, fp)
	case "learning_mode":
		r.LearningMode = p.duration(f.val, fp)
	default:
		delete(rf.lines, f.name)
		p.unknown(f, path, resourceFields)
	}
}

// checkResource checks the fields together and fills in the defaults.
func (p *cparser) checkResource(rf *rfields, line int, path string) {
	r, has := &rf.r, func(f string) bool { return rf.lines[f] != 0 }
	at := func(f string) int {
		if l := rf.lines[f]; l != 0 {
			return l
		}
		return line
	}
	if !has("id") {
		p.add(line, join(path, "id"), "missing: want the resource's id (exact, a glob such as \"db/*\", or \"*\")")
	}
	if !has("capacity") {
		p.add(line, join(path, "capacity"), "missing: want the resource's total capacity (a number >= 0)")
	}
	if r.Algorithm == "" {
		r.Algorithm = FairShare
	}
	switch {
	case r.Algorithm == Static && !(r.StaticCapacity > 0):
		p.add(at("static_capacity"), join(path, "static_capacity"), "algorithm static needs static_capacity > 0 (each client's cap)")
	case r.Algorithm != Static && has("static_capacity"):
		p.add(at("static_capacity"), join(path, "static_capacity"), "only for algorithm static (this one is %s)", r.Algorithm)
	}
	if has("safe_capacity") && r.SafeCapacity > r.Capacity {
		p.add(at("safe_capacity"), join(path, "safe_capacity"), "%v is more than capacity (%v)", r.SafeCapacity, r.Capacity)
	}
	if r.LeaseLength == 0 {
		r.LeaseLength = DefaultLeaseLength
	}
	if r.RefreshInterval == 0 {
		r.RefreshInterval = min(DefaultRefreshInterval, (r.LeaseLength / 2).Truncate(time.Millisecond))
	}
	if r.RefreshInterval >= r.LeaseLength {
		p.add(at("refresh_interval"), join(path, "refresh_interval"), "%v is not shorter than lease_length (%v): a client must refresh before its lease expires", r.RefreshInterval, r.LeaseLength)
	}
	if r.LearningMode == 0 {
		r.LearningMode = r.LeaseLength
	}
	if r.LearningMode < r.LeaseLength {
		p.add(at("learning_mode"), join(path, "learning_mode"), "%v is shorter than lease_length (%v): a new master could over-grant while the old master's leases last", r.LearningMode, r.LeaseLength)
	}
}

func (p *cparser) scalar(n *yaml.Node, path, want string) (*yaml.Node, bool) {
	if n = p.resolve(n); n == nil {
		return nil, false
	}
	if n.Kind != yaml.ScalarNode || n.ShortTag() == "!!null" {
		p.add(n.Line, path, "want %s, got %s", want, kindName(n))
		return nil, false
	}
	return n, true
}

func (p *cparser) id(n *yaml.Node, path string) string {
	n, ok := p.scalar(n, path, "a resource id")
	switch {
	case !ok:
		return ""
	case n.Value == "":
		p.add(n.Line, path, "empty: want a resource id, a glob or \"*\"")
	case len(n.Value) > MaxResourceLen:
		p.add(n.Line, path, "is %d bytes long; at most %d", len(n.Value), MaxResourceLen)
	default:
		if _, err := path2Match(n.Value); err != nil {
			p.add(n.Line, path, "%q is not a valid glob (path.Match syntax): %v", n.Value, err)
		}
	}
	return n.Value
}

func path2Match(pattern string) (bool, error) { return path.Match(pattern, "") }

// amount reads a number in [0, MaxCapacity].
func (p *cparser) amount(n *yaml.Node, path string) float64 {
	n, ok := p.scalar(n, path, "a number")
	if !ok {
		return 0
	}
	quoted := n.Style&(yaml.SingleQuotedStyle|yaml.DoubleQuotedStyle) != 0
	f, err := strconv.ParseFloat(strings.ReplaceAll(n.Value, "_", ""), 64)
	switch {
	case quoted || err != nil && !errors.Is(err, strconv.ErrRange) || math.IsNaN(f):
		p.add(n.Line, path, "want a number, got %s", kindName(n))
	case f < 0:
		p.add(n.Line, path, "%s is negative: want a number >= 0", n.Value)
	case f > MaxCapacity || math.IsInf(f, 0) || err != nil:
		p.add(n.Line, path, "%s is too large: at most %g", n.Value, float64(MaxCapacity))
	default:
		return f
	}
	return 0
}

func (p *cparser) algorithm(n *yaml.Node, path string) Algorithm {
	n, ok := p.scalar(n, path, "an algorithm")
	if !ok {
		return ""
	}
	for _, a := range algorithms {
		if string(a) == n.Value {
			return a
		}
	}
	names := make([]string, len(algorithms))
	for i, a := range algorithms {
		names[i] = string(a)
	}
	msg := fmt.Sprintf("unknown algorithm %q (want %s)", n.Value, strings.Join(names, ", "))
	if s := closest(n.Value, names); s != "" {
		msg = fmt.Sprintf("unknown algorithm %q (did you mean %q?)", n.Value, s)
	}
	p.add(n.Line, path, "%s", msg)
	return ""
}

// duration reads a Go duration ("60s", "1m30s") in (0, 24h].
func (p *cparser) duration(n *yaml.Node, path string) time.Duration {
	n, ok := p.scalar(n, path, "a duration such as \"5s\"")
	if !ok {
		return 0
	}
	d, err := time.ParseDuration(n.Value)
	switch {
	case err != nil:
		hint := ""
		if _, e := strconv.ParseFloat(n.Value, 64); e == nil {
			hint = fmt.Sprintf(" (a unit is needed: %ss?)", n.Value)
		}
		p.add(n.Line, path, "want a duration such as \"5s\" or \"1m\", got %s%s", kindName(n), hint)
	case d <= 0:
		p.add(n.Line, path, "%s: want a duration > 0", n.Value)
	case d < 10*time.Millisecond && strings.HasSuffix(path, "lease_length"):
		p.add(n.Line, path, "%s: at least 10ms", n.Value)
	case d > maxDuration:
		p.add(n.Line, path, "%s: at most %v", n.Value, maxDuration)
	case d%time.Millisecond != 0:
		p.add(n.Line, path, "%s: want whole milliseconds", n.Value)
	default:
		return d
	}
	return 0
}

// match reports whether the resource pattern matches id.
func match(pattern, id string) bool {
	if pattern == id || pattern == "*" {
		return true
	}
	ok, err := path.Match(pattern, id)
	return err == nil && ok
}

package rules

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/floodgate/floodgate"
)

// An Entry is one entry of a request descriptor: ("remote_address",
// "10.0.0.1"), say.
type Entry struct {
	Key   string `json:"key"`   // the entry's key: "remote_address"
	Value string `json:"value"` // its value: "10.0.0.1"
}

// A Config is the rules of every domain. It is immutable once built and
// safe for concurrent use; a reload builds a new one.
type Config struct {
	domains map[string]*Domain
	order   []*Domain // by name
}

// A Domain is one rules file: a domain's descriptor tree. Domains are
// immutable once parsed, so one Domain may serve in several Configs (a
// reload that keeps a file's previous version, say).
type Domain struct {
	// Name is the file's domain, as Envoy sends it.
	Name string
	// AllOrNothing (the extension all_or_nothing: true) asks the service to
	// admit all descriptors of a request together: when one is over its
	// limit, nothing is consumed from the others either.
	AllOrNothing bool
	File         string // the file's name, as given to Parse

	root   *level
	order  []*node  // top-level descriptors in file order (for JSON)
	limits []*Limit // in file order

	http []*HTTPRoute // the http section in file order (http.go)
}

// A Match is the limit that applies to one request descriptor.
type Match struct {
	// Limit is the matched descriptor node's limit.
	Limit *Limit
	// Key is the store key of this descriptor under Limit.Policy: the
	// matched entries as the request gave them, escaped and joined as
	// "key=value|key2=value2" ('%', '=' and '|' inside keys and values are
	// percent-escaped), so a node without a value or with a pattern limits
	// each distinct value separately. At a node with share_threshold the
	// entry's value is replaced by the node's pattern, so every value the
	// pattern matches shares one counter. The policy's name identifies the
	// domain and the rule path, so the key need not.
	Key string
	// StatKey is the statistics key envoyproxy/ratelimit would report this
	// descriptor under ("domain.key_value.key2"): the configured path,
	// with the request's values where detailed_metric or value_to_metric
	// ask for them.
	StatKey string
}

// A Limit is what a descriptor node's rate_limit (or rate_limits) says.
type Limit struct {
	// Name is rate_limit.name when given (NameGiven), else the descriptor
	// path as envoyproxy/ratelimit names its statistics:
	// "domain.key_value.key2" (a '.' in the domain is written %2E). In the
	// rare file where two paths would read alike (keys or values holding
	// '.' or '_'), those limits are named by their policy's name instead,
	// so derived names are unique.
	Name      string
	NameGiven bool // Name is rate_limit.name, which replaces can refer to
	// Policy holds every rule of the descriptor, applied all or nothing;
	// nil when Unlimited. Its name is derived from the domain and the
	// descriptor path alone, so it is stable across reloads (state is kept)
	// and unique per path.
	Policy    *floodgate.Policy
	Unlimited bool // unlimited: true: matched, but never limited
	// Blocked is requests_per_unit: 0, which envoyproxy/ratelimit answers
	// OVER_LIMIT every time (its "black list" example). The service must
	// deny without asking the store; Policy then holds a placeholder of
	// one request per window, so code that overlooks Blocked cannot crash.
	Blocked        bool
	ShadowMode     bool // over-limit decisions are reported as OK (counted, never blocking)
	QuotaMode      bool // over-limit decisions are admitted and reported in the response metadata
	DetailedMetric bool // detailed_metric: statistics per request value
	ValueToMetric  bool // some node on the path has value_to_metric
	ShareThreshold bool // some node on the path has share_threshold
	// Replaces names the limits (by their rate_limit.name) this one drops
	// when both apply to one request.
	Replaces []string
	// Unit is "second", "minute", "hour", "day", "week", "month" or "year"
	// when the first rule's window is exactly one such unit (a week being 7
	// days, a month 30 and a year 365, as envoyproxy/ratelimit counts them);
	// "" otherwise (calendar windows, 90s, ...).
	Unit string
	// MultipliedUnit and UnitMultiplier say the first rule's window as
	// Envoy's unit_multiplier does: UnitMultiplier × MultipliedUnit, with
	// the largest unit that divides the window ("" and 0 for calendar and
	// sub-second windows). For a one-unit window they are Unit and 1.
	MultipliedUnit  string
	UnitMultiplier  uint32        // the window in MultipliedUnits (0 for calendar and sub-second windows)
	RequestsPerUnit uint32        // the first rule's limit; 0 when Blocked
	Window          time.Duration // the first rule's window (nominal for calendar windows: 24h, 7×24h, 30×24h)
	// Metadata is the descriptor's metadata mapping as plain Go values
	// (maps, lists, strings, numbers, booleans, nil), sent back in the
	// response's dynamic_metadata; nil when it has none.
	Metadata map[string]any
	// Line is the line of the limit's rate_limit (or rate_limits) in File.
	Line int
	// File is the rules file, as given to Parse.
	File string
	// Domain is the name of the limit's domain.
	Domain string

	path  []*node // the descriptor path, root first
	stat  string  // the constant part of the stat key
	rules []ruleInfo
}

// ruleInfo is how a rule was written, for JSON.
type ruleInfo struct {
	Name        string  `json:"name"`
	Algorithm   string  `json:"algorithm"`
	Limit       int64   `json:"requests_per_unit"`
	Unit        string  `json:"unit,omitempty"`
	Window      string  `json:"window,omitempty"`
	Calendar    string  `json:"calendar,omitempty"`
	TimeZone    string  `json:"time_zone,omitempty"`
	WeekStart   string  `json:"week_start,omitempty"`
	Burst       int64   `json:"burst,omitempty"`
	Refill      string  `json:"refill,omitempty"`
	Granularity string  `json:"granularity,omitempty"`
	Mode        string  `json:"mode,omitempty"`
	SoftPercent int64   `json:"soft_percent,omitempty"`
	CountReject bool    `json:"count_rejected,omitempty"`
	FailureMode string  `json:"failure_mode,omitempty"`
	LocalPct    int64   `json:"local_percent,omitempty"`
	Tier        string  `json:"tier,omitempty"`
	Budget      float64 `json:"budget,omitempty"` // a fraction of the limit
}

// matchKind is how a descriptor node matches a request entry's value.
type matchKind uint8

const (
	kindKey    matchKind = iota // no value: every value, each limited separately
	kindExact                   // value
	kindPrefix                  // value_prefix
	kindRegex                   // value_regex
	kindGlob                    // a value holding '*'
)

// A node is one configured descriptor.
type node struct {
	key      string
	kind     matchKind
	value    string   // the exact value, prefix, regex source or glob pattern
	parts    []string // kindGlob: the pattern split at '*'
	re       *regexp.Regexp
	exempt   bool
	synth    bool // made from a parent's exempt_values
	share    bool // share_threshold
	toMetric bool // value_to_metric
	line     int
	limit    *Limit
	children *level
	order    []*node // children in file order (for JSON)
	exempts  []string
}

// A level is the descriptors at one depth under one parent.
type level struct {
	byKey map[string]*keyGroup
}

// keyGroup is the nodes of one key at one level, in matching order.
type keyGroup struct {
	exact    map[string]*node
	prefixes []*node // longest prefix first
	regexes  []*node // file order
	globs    []*node // file order
	keyOnly  *node
	patterns map[string]*node // prefix, regex and glob nodes by kind and value, to refuse duplicates
}

// find returns the node that matches e at this level: the exact value,
// then the longest value_prefix, then the first value_regex, then the
// first wildcard value (file order), then the node without a value.
func (l *level) find(e *Entry) *node {
	if l == nil {
		return nil
	}
	g := l.byKey[e.Key]
	if g == nil {
		return nil
	}
	if n := g.exact[e.Value]; n != nil {
		return n
	}
	for _, n := range g.prefixes {
		if strings.HasPrefix(e.Value, n.value) {
			return n
		}
	}
	for _, n := range g.regexes {
		if n.re.MatchString(e.Value) {
			return n
		}
	}
	for _, n := range g.globs {
		if globMatch(n.parts, e.Value) {
			return n
		}
	}
	return g.keyOnly
}

// globMatch reports whether v matches a pattern split at its '*'s, each '*'
// matching any run of bytes, the pattern anchored at both ends (as
// envoyproxy/ratelimit's wildcardMatch does).
func globMatch(parts []string, v string) bool {
	if len(parts) == 1 {
		return parts[0] == v
	}
	first, last := parts[0], parts[len(parts)-1]
	if len(v) < len(first)+len(last) || !strings.HasPrefix(v, first) || !strings.HasSuffix(v, last) {
		return false
	}
	rest := v[len(first) : len(v)-len(last)]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(rest, p)
		if i < 0 {
			return false
		}
		rest = rest[i+len(p):]
	}
	return true
}

// NewConfig gathers domains into a Config. Two domains of one name are an
// error.
func NewConfig(domains ...*Domain) (*Config, error) {
	c := &Config{domains: make(map[string]*Domain, len(domains))}
	for i, d := range domains {
		if d == nil {
			return nil, fmt.Errorf("rules: domains[%d] is nil", i)
		}
		if prev := c.domains[d.Name]; prev != nil {
			return nil, fmt.Errorf("rules: domain %q is defined twice: in %s and in %s", d.Name, prev.File, d.File)
		}
		c.domains[d.Name] = d
		c.order = append(c.order, d)
	}
	sort.Slice(c.order, func(i, j int) bool { return c.order[i].Name < c.order[j].Name })
	return c, nil
}

// Domain returns the named domain, or nil.
func (c *Config) Domain(name string) *Domain {
	if c == nil {
		return nil
	}
	return c.domains[name]
}

// Domains returns every domain, by name.
func (c *Config) Domains() []*Domain {
	if c == nil {
		return nil
	}
	return append([]*Domain(nil), c.order...)
}

// Limits returns the domain's limits in file order.
func (d *Domain) Limits() []*Limit { return append([]*Limit(nil), d.limits...) }

// Match returns the limit for one request descriptor of domain, or nil when
// no limit applies: an unknown domain, no matching path, a path whose last
// node has no rate_limit, an exempt value, or a descriptor with more or
// fewer entries than the matched path is deep.
//
// Matching walks the descriptor tree one entry at a time, as
// envoyproxy/ratelimit does: at each level the entry's key selects the
// nodes, and the first that matches wins (exact value, longest
// value_prefix, first value_regex, first wildcard value, then the node
// without a value). The walk never backtracks: once an exact node
// matches, a wildcard sibling is not tried for the next entries.
func (c *Config) Match(domain string, entries []Entry) *Match {
	if c == nil || len(entries) == 0 || len(entries) > MaxDepth {
		return nil
	}
	d := c.domains[domain]
	if d == nil {
		return nil
	}
	var path [MaxDepth]*node
	lvl := d.root
	for i := range entries {
		n := lvl.find(&entries[i])
		if n == nil || n.exempt {
			return nil
		}
		path[i] = n
		lvl = n.children
	}
	last := path[len(entries)-1]
	if last.limit == nil {
		return nil
	}
	l := last.limit
	return &Match{Limit: l, Key: storeKey(path[:len(entries)], entries), StatKey: l.statKey(path[:len(entries)], entries)}
}

// storeKey is Match.Key.
func storeKey(path []*node, entries []Entry) string {
	var b strings.Builder
	n := 0
	for i := range entries {
		n += len(entries[i].Key) + len(entries[i].Value) + 2
	}
	b.Grow(n)
	for i := range entries {
		if i > 0 {
			b.WriteByte('|')
		}
		escapeTo(&b, entries[i].Key)
		b.WriteByte('=')
		if path[i].share {
			b.WriteByte('*') // never the first byte of an escaped value: a shared counter
			escapeTo(&b, path[i].value)
		} else {
			escapeTo(&b, entries[i].Value)
		}
	}
	return b.String()
}

const hexDigits = "0123456789ABCDEF"

// ParseKey reads a store key (Match.Key) back into the entries it was made
// of; false if key is no such key. A share_threshold level's value reads
// back as its pattern, which matches itself for wildcards and prefixes.
func ParseKey(key string) ([]Entry, bool) {
	if key == "" {
		return nil, false
	}
	var out []Entry
	for part := range strings.SplitSeq(key, "|") {
		k, v, ok := strings.Cut(part, "=")
		if !ok {
			return nil, false
		}
		v = strings.TrimPrefix(v, "*") // a shared counter's mark
		k, okk := unescape(k)
		v, okv := unescape(v)
		if !okk || !okv || k == "" {
			return nil, false
		}
		out = append(out, Entry{Key: k, Value: v})
	}
	return out, true
}

// unescape undoes escapeTo.
func unescape(s string) (string, bool) {
	if !strings.ContainsAny(s, "%=|*") {
		return s, true
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '%':
			if i+2 >= len(s) {
				return "", false
			}
			hi, lo := strings.IndexByte(hexDigits, s[i+1]), strings.IndexByte(hexDigits, s[i+2])
			if hi < 0 || lo < 0 {
				return "", false
			}
			b.WriteByte(byte(hi<<4 | lo))
			i += 2
		case '=', '|', '*':
			return "", false
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), true
}

// escapeTo writes s with '%', '=', '|' and '*' percent-escaped.
func escapeTo(b *strings.Builder, s string) {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '%', '=', '|', '*':
			b.WriteByte('%')
			b.WriteByte(hexDigits[c>>4])
			b.WriteByte(hexDigits[c&15])
		default:
			b.WriteByte(c)
		}
	}
}

// statKey is Match.StatKey: envoyproxy/ratelimit's statistics key. Without
// detailed_metric it is the configured path ("domain.key_value.key2",
// a wildcard node showing its pattern), with the request's value at nodes
// with value_to_metric; with detailed_metric on the limit it is the
// request's entries ("domain.key_value.key2_value2"), share_threshold nodes
// showing their pattern.
func (l *Limit) statKey(path []*node, entries []Entry) string {
	if !l.DetailedMetric && !l.ValueToMetric {
		return l.stat
	}
	var b strings.Builder
	b.WriteString(l.Domain)
	for i := range entries {
		n, e := path[i], &entries[i]
		b.WriteByte('.')
		b.WriteString(e.Key)
		switch {
		case l.DetailedMetric && n.share:
			b.WriteString("_" + n.statValue())
		case l.DetailedMetric:
			b.WriteString("_" + e.Value)
		case n.kind == kindExact:
			b.WriteString("_" + e.Value)
		case n.share || !n.toMetric:
			if v := n.statValue(); v != "" {
				b.WriteString("_" + v)
			}
		case e.Value != "":
			b.WriteString("_" + e.Value)
		}
	}
	return b.String()
}

// statValue is how a node's value appears in statistics keys.
func (n *node) statValue() string {
	switch n.kind {
	case kindPrefix:
		return n.value + "*"
	case kindRegex:
		return "~" + n.value
	}
	return n.value
}

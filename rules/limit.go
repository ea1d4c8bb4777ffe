package rules

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/floodgate/floodgate"
	"go.yaml.in/yaml/v3"
)

// The units of envoyproxy/ratelimit, and their windows as it computes
// them (utils.UnitToDivider): fixed windows aligned to the Unix epoch, a
// week being 7 days (so weeks start on Thursdays, 00:00 UTC, the epoch's
// weekday), a month 30 days and a year 365 days. A "month" window is thus
// not a calendar month; floodgate's calendar: month gives that.
var units = []struct {
	name string
	d    time.Duration
}{
	{"year", 365 * 24 * time.Hour},
	{"month", 30 * 24 * time.Hour},
	{"week", 7 * 24 * time.Hour},
	{"day", 24 * time.Hour},
	{"hour", time.Hour},
	{"minute", time.Minute},
	{"second", time.Second},
}

func unitWindow(name string) (time.Duration, bool) {
	for _, u := range units {
		if u.name == name {
			return u.d, true
		}
	}
	return 0, false
}

// unitOf names a window of exactly one unit.
func unitOf(w time.Duration) string {
	for _, u := range units {
		if u.d == w {
			return u.name
		}
	}
	return ""
}

// multipliedUnit says w as n × the largest unit that divides it.
func multipliedUnit(w time.Duration) (string, uint32) {
	for _, u := range units {
		if w > 0 && w%u.d == 0 && w/u.d <= math.MaxUint32 {
			return u.name, uint32(w / u.d)
		}
	}
	return "", 0
}

var weekdays = map[string]time.Weekday{
	"sunday": time.Sunday, "monday": time.Monday, "tuesday": time.Tuesday, "wednesday": time.Wednesday,
	"thursday": time.Thursday, "friday": time.Friday, "saturday": time.Saturday,
	"sun": time.Sunday, "mon": time.Monday, "tue": time.Tuesday, "wed": time.Wednesday,
	"thu": time.Thursday, "fri": time.Friday, "sat": time.Saturday,
}

// spec is one rate_limit (or rate_limits entry) as written.
type spec struct {
	path   string
	line   int
	lines  map[string]int // field → line of its value
	set    map[string]bool
	failed bool

	unit        string
	unitWin     time.Duration
	rpu         int64
	mult        int64
	unlimited   bool
	name        string
	replaces    []string
	window      time.Duration
	calendar    string
	tz          *time.Location
	tzName      string
	weekStart   time.Weekday
	algorithm   string
	burst       int64
	refill      string
	granularity time.Duration
	mode        string
	softPercent int64
	countRej    bool
	failMode    string
	localPct    int64
}

func (s *spec) has(f string) bool { return s.set[f] }

// lineOf returns the line of field f, else of the mapping.
func (s *spec) lineOf(f string) int {
	if l, ok := s.lines[f]; ok {
		return l
	}
	return s.line
}

// readSpec reads a rate_limit mapping.
func (p *parser) readSpec(v *yaml.Node, path string) *spec {
	m, ok := p.mapping(v, path)
	if !ok {
		return nil
	}
	s := &spec{path: path, line: m.Line, lines: map[string]int{}, set: map[string]bool{}}
	emptyUnit := 0 // the line of unit: "", if given
	for _, f := range p.fields(m, path) {
		fp := join(path, f.name)
		val := p.resolve(f.val)
		if val == nil {
			s.failed = true
			continue
		}
		if !contains(ruleFields, f.name) {
			p.unknown(f, path, ruleFields)
			s.failed = true
			continue
		}
		if isNull(val) {
			continue
		}
		s.lines[f.name] = f.key.Line
		s.set[f.name] = true
		ok := true
		switch f.name {
		case "unit":
			var u string
			if u, ok = p.str(val, fp); ok {
				s.unit = strings.ToLower(u)
				if u == "" {
					// Read once unlimited is known, below: an empty unit
					// is absent when unlimited, as envoyproxy/ratelimit
					// takes it, and unknown otherwise.
					emptyUnit = val.Line
					break
				}
				if s.unitWin, ok = unitWindow(s.unit); !ok {
					p.add(val.Line, fp, "unknown unit %q (want second, minute, hour, day, week, month or year)", u)
				}
			}
		case "requests_per_unit":
			s.rpu, ok = p.integer(val, fp, 0, math.MaxUint32)
		case "unit_multiplier":
			s.mult, ok = p.integer(val, fp, 1, math.MaxUint32)
		case "unlimited":
			s.unlimited, ok = p.boolean(val, fp)
		case "name":
			s.name, ok = p.str(val, fp)
			if ok && s.name == "" {
				p.add(val.Line, fp, "must not be empty")
				ok = false
			}
		case "replaces":
			var items []*yaml.Node
			if items, ok = p.seq(val, fp); ok {
				for i, it := range items {
					ip := fmt.Sprintf("%s[%d]", fp, i)
					name, good := p.replacesEntry(it, ip)
					if !good {
						ok = false
						continue
					}
					s.replaces = append(s.replaces, name)
				}
			}
		case "window":
			s.window, ok = p.duration(val, fp)
		case "calendar":
			var c string
			if c, ok = p.str(val, fp); ok {
				s.calendar = strings.ToLower(c)
				if s.calendar != "day" && s.calendar != "week" && s.calendar != "month" {
					p.add(val.Line, fp, "unknown calendar %q (want day, week or month)", c)
					ok = false
				}
			}
		case "time_zone":
			var z string
			if z, ok = p.str(val, fp); ok {
				loc, err := loadLocation(z)
				if err != nil {
					p.add(val.Line, fp, "unknown time zone %q (want an IANA name such as Europe/Paris, or UTC)", z)
					ok = false
				}
				s.tz, s.tzName = loc, z
			}
		case "week_start":
			var w string
			if w, ok = p.str(val, fp); ok {
				var found bool
				if s.weekStart, found = weekdays[strings.ToLower(w)]; !found {
					p.add(val.Line, fp, "unknown weekday %q (want monday, tuesday, ... sunday)", w)
					ok = false
				}
			}
		case "algorithm":
			s.algorithm, ok = p.str(val, fp)
		case "burst":
			s.burst, ok = p.integer(val, fp, 1, 1<<51)
		case "refill":
			s.refill, ok = p.str(val, fp)
		case "granularity":
			s.granularity, ok = p.duration(val, fp)
		case "mode":
			var md string
			if md, ok = p.str(val, fp); ok {
				s.mode = strings.ToLower(md)
				switch s.mode {
				case "hard", "soft":
				case "elastic":
					p.add(val.Line, fp, "elastic mode needs a live spare-capacity signal, which a rules file cannot give; use hard or soft (elastic rules are built in Go with floodgate.Rule.Spare)")
					ok = false
				default:
					p.add(val.Line, fp, "unknown mode %q (want hard or soft)", md)
					ok = false
				}
			}
		case "soft_percent":
			s.softPercent, ok = p.integer(val, fp, 1, 10000)
		case "elastic_ceiling":
			p.add(val.Line, fp, "elastic mode is not available in rules files (it needs a live spare-capacity signal); use mode: soft with soft_percent")
			ok = false
		case "count_rejected":
			s.countRej, ok = p.boolean(val, fp)
		case "failure_mode":
			var fm string
			if fm, ok = p.str(val, fp); ok {
				s.failMode = strings.ToLower(fm)
				if s.failMode != "open" && s.failMode != "closed" && s.failMode != "local" {
					p.add(val.Line, fp, "unknown failure mode %q (want open, closed or local)", fm)
					ok = false
				}
			}
		case "local_percent":
			s.localPct, ok = p.integer(val, fp, 1, 100)
		}
		if !ok {
			s.failed = true
		}
	}
	if emptyUnit > 0 {
		if s.unlimited {
			delete(s.set, "unit")
			delete(s.lines, "unit")
		} else {
			p.add(emptyUnit, join(path, "unit"), "unknown unit \"\" (want second, minute, hour, day, week, month or year)")
			s.failed = true
		}
	}
	return s
}

// zones caches loaded time zones (only valid names, so it stays small): a
// reload then gives rules the same *time.Location, and policies of
// unchanged rules keep the same layout.
var zones sync.Map

// loadLocation is time.LoadLocation for names a rules file may give.
func loadLocation(z string) (*time.Location, error) {
	if z == "" || len(z) > 64 || strings.Contains(z, "..") || strings.HasPrefix(z, "/") || strings.ContainsAny(z, "\\\x00") {
		return nil, errors.New("invalid")
	}
	if z == "Local" { // the server's own zone: the same file would mean different days on different hosts
		return nil, errors.New("Local is the server's own zone; name the zone (an IANA name such as Europe/Paris)")
	}
	if l, ok := zones.Load(z); ok {
		return l.(*time.Location), nil
	}
	l, err := time.LoadLocation(z)
	if err != nil {
		return nil, err
	}
	zones.Store(z, l)
	return l, nil
}

func (p *parser) replacesEntry(v *yaml.Node, path string) (string, bool) {
	m, ok := p.mapping(v, path)
	if !ok {
		return "", false
	}
	name, good := "", false
	for _, f := range p.fields(m, path) {
		if f.name != "name" {
			p.unknown(f, path, []string{"name"})
			return "", false
		}
		if isNull(p.resolve(f.val)) {
			continue
		}
		if name, good = p.str(f.val, join(path, "name")); !good {
			return "", false
		}
	}
	if name == "" {
		p.add(m.Line, join(path, "name"), "should not be empty: replaces names the limit it replaces")
		return "", false
	}
	return name, true
}

func (p *parser) duration(v *yaml.Node, path string) (time.Duration, bool) {
	s, ok := p.str(v, path)
	if !ok {
		return 0, false
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		p.add(v.Line, path, "want a positive duration such as \"90s\", \"15m\" or \"36h\", got %q", s)
		return 0, false
	}
	return d, true
}

// limit reads a node's rate_limit or rate_limits into a Limit.
func (p *parser) limit(rl, rls *field, path string, chain []*node) *Limit {
	var specs []*spec
	var fieldPath string
	var line int
	if rl != nil {
		fieldPath, line = join(path, "rate_limit"), rl.key.Line
		s := p.readSpec(rl.val, fieldPath)
		if s == nil {
			return nil
		}
		specs = append(specs, s)
	} else {
		fieldPath, line = join(path, "rate_limits"), rls.key.Line
		items, ok := p.seq(rls.val, fieldPath)
		if !ok {
			return nil
		}
		if len(items) == 0 {
			p.add(line, fieldPath, "an empty list: give at least one rule")
			return nil
		}
		if len(items) > 16 {
			p.add(line, fieldPath, "%d rules; a descriptor holds at most 16", len(items))
			return nil
		}
		for i, it := range items {
			s := p.readSpec(it, fmt.Sprintf("%s[%d]", fieldPath, i))
			if s == nil {
				return nil
			}
			specs = append(specs, s)
		}
	}
	failed := false
	for _, s := range specs {
		failed = failed || s.failed
	}
	if failed {
		return nil
	}

	l := &Limit{File: p.file, Line: line, Domain: p.dom.Name, path: chain}
	first := specs[0]
	l.Name, l.NameGiven = first.name, first.name != ""
	l.Replaces = first.replaces
	for _, s := range specs[1:] {
		if s.has("replaces") {
			p.add(s.lineOf("replaces"), join(s.path, "replaces"), "belongs in the first entry of rate_limits (its name and replaces name the whole limit)")
			failed = true
		}
		if s.unlimited {
			p.add(s.lineOf("unlimited"), join(s.path, "unlimited"), "an unlimited descriptor has a single rate_limit")
			failed = true
		}
	}
	for _, r := range l.Replaces {
		if l.NameGiven && r == l.Name {
			p.add(first.lineOf("replaces"), join(first.path, "replaces"), "replaces should not contain the name of the same limit (%q)", r)
			failed = true
		}
	}
	for _, n := range chain {
		l.ShareThreshold = l.ShareThreshold || n.share
		l.ValueToMetric = l.ValueToMetric || n.toMetric
	}
	l.stat = statPath(p.dom.Name, chain)

	if first.unlimited {
		if rls != nil {
			p.add(first.lineOf("unlimited"), join(first.path, "unlimited"), "an unlimited descriptor has a single rate_limit")
			return nil
		}
		if first.has("unit") {
			p.add(first.lineOf("unit"), join(first.path, "unit"), "should not specify rate limit unit when unlimited")
			return nil
		}
		for _, f := range ruleFields {
			switch f {
			case "unit", "unlimited", "name", "replaces", "requests_per_unit":
				continue
			}
			if first.has(f) {
				p.add(first.lineOf(f), join(first.path, f), "an unlimited limit has no %s", f)
				failed = true
			}
		}
		if failed {
			return nil
		}
		l.Unlimited = true
		p.dom.limits = append(p.dom.limits, l)
		return l
	}

	var rules []floodgate.Rule
	names := map[string]int{}
	for _, s := range specs {
		r, info, ok := p.rule(s, rls != nil)
		if !ok {
			failed = true
			continue
		}
		if r.Name == "" {
			base := info.Unit
			switch {
			case base != "":
			case info.Calendar != "":
				base = "calendar_" + info.Calendar
			default:
				base = info.Window
			}
			names[base]++
			r.Name = base
			if names[base] > 1 {
				r.Name = fmt.Sprintf("%s#%d", base, names[base])
			}
			info.Name = r.Name
		}
		rules = append(rules, r)
		l.rules = append(l.rules, info)
	}
	if failed {
		return nil
	}
	if first.rpu == 0 {
		if rls != nil {
			p.add(first.lineOf("requests_per_unit"), join(first.path, "requests_per_unit"), "must be positive in rate_limits (a single rate_limit with requests_per_unit: 0 blocks every request)")
			return nil
		}
		l.Blocked = true
	}
	for _, s := range specs[1:] {
		if s.rpu == 0 {
			p.add(s.lineOf("requests_per_unit"), join(s.path, "requests_per_unit"), "must be positive in rate_limits")
			failed = true
		}
	}
	if failed {
		return nil
	}
	pol, err := floodgate.NewPolicy(policyName(p.dom.Name, chain), rules...)
	if err != nil {
		p.ruleError(err, specs, fieldPath, line)
		return nil
	}
	l.Policy = pol
	w := rules[0].Period
	if rules[0].Calendar != "" {
		switch rules[0].Calendar {
		case floodgate.CalendarDay:
			w = 24 * time.Hour
		case floodgate.CalendarWeek:
			w = 7 * 24 * time.Hour
		case floodgate.CalendarMonth:
			w = 30 * 24 * time.Hour
		}
		if l.rules[0].Unit == "month" { // unit: month as a calendar month (Options.CalendarMonth)
			l.Unit, l.MultipliedUnit, l.UnitMultiplier = "month", "month", 1
		}
	} else {
		l.Unit = unitOf(w)
		l.MultipliedUnit, l.UnitMultiplier = multipliedUnit(w)
	}
	l.Window = w
	if !l.Blocked {
		l.RequestsPerUnit = uint32(first.rpu)
	}
	p.dom.limits = append(p.dom.limits, l)
	return l
}

// rule turns a spec into an engine rule, validating it on its own.
func (p *parser) rule(s *spec, list bool) (floodgate.Rule, ruleInfo, bool) {
	var info ruleInfo
	fail := func(f, format string, args ...any) (floodgate.Rule, ruleInfo, bool) {
		p.add(s.lineOf(f), join(s.path, f), format, args...)
		return floodgate.Rule{}, info, false
	}
	if !s.has("requests_per_unit") {
		return fail("requests_per_unit", "missing: how many requests each window admits (requests_per_unit: 0 blocks every request)")
	}
	switch {
	case s.has("unit") && s.has("window"):
		return fail("window", "give unit or window, not both")
	case s.has("calendar") && (s.has("unit") || s.has("window")):
		return fail("calendar", "a calendar window replaces unit and window: give one of them")
	case !s.has("unit") && !s.has("window") && !s.has("calendar"):
		if s.has("unlimited") {
			return fail("unit", "missing: with unlimited: false the limit needs a unit (second, minute, hour, day, week, month or year)")
		}
		return fail("unit", "missing: a rate_limit needs a unit (second, minute, hour, day, week, month or year) or unlimited: true")
	case s.has("unit_multiplier") && !s.has("unit"):
		return fail("unit_multiplier", "needs a unit")
	case s.has("time_zone") && !s.has("calendar"):
		return fail("time_zone", "only calendar windows have a time zone")
	case s.has("week_start") && s.calendar != "week":
		return fail("week_start", "only calendar: week windows have a first weekday")
	case s.has("soft_percent") && s.mode != "soft":
		return fail("soft_percent", "needs mode: soft")
	case s.mode == "soft" && !s.has("soft_percent"):
		return fail("mode", "soft needs soft_percent: how far beyond the limit to admit, in percent")
	}
	fm := s.failMode
	if fm == "" {
		fm = p.fail.mode
	}
	var pct int64
	switch {
	case s.has("local_percent") && fm != "local":
		return fail("local_percent", "needs failure_mode: local")
	case fm == "local":
		pct = s.localPct
		if !s.has("local_percent") {
			pct = p.fail.percent
		}
		if pct == 0 {
			return fail("failure_mode", "local needs local_percent (1 to 100): the share of the limit each instance allows on its own")
		}
	}
	r := floodgate.Rule{
		Name:          s.name,
		Algorithm:     floodgate.FixedWindow,
		Limit:         s.rpu,
		Burst:         s.burst,
		Refill:        floodgate.Refill(s.refill),
		Granularity:   s.granularity,
		CountRejected: s.countRej,
		SoftPercent:   s.softPercent,
	}
	if r.Limit == 0 {
		r.Limit = 1 // the placeholder of a blocked limit
	}
	if !list {
		r.Name = "" // a single rate_limit's name names the limit, not the rule
	}
	if s.has("algorithm") {
		r.Algorithm = floodgate.Algorithm(s.algorithm)
	}
	if s.mode == "soft" {
		r.Mode = floodgate.Soft
	}
	switch {
	case s.has("unit") && s.unit == "month" && p.opts.CalendarMonth:
		// envoyproxy/ratelimit's USE_CALENDAR_MONTH_RATE_LIMIT: calendar
		// months in UTC.
		if s.mult > 1 {
			return fail("unit_multiplier", "calendar months (Options.CalendarMonth) cannot be multiplied")
		}
		if s.has("algorithm") && r.Algorithm != floodgate.FixedWindow {
			return fail("algorithm", "unit: month is a calendar month here (Options.CalendarMonth), which only fixed_window follows")
		}
		r.Calendar, r.Location = floodgate.CalendarMonth, time.UTC
		info.Unit, info.Calendar = "month", "month"
	case s.has("unit"):
		mult := s.mult
		if mult == 0 {
			mult = 1
		}
		if s.unitWin > time.Duration(math.MaxInt64)/time.Duration(mult) {
			return fail("unit_multiplier", "makes the window too long")
		}
		r.Period = s.unitWin * time.Duration(mult)
		info.Unit = s.unit
		if mult > 1 {
			info.Unit, info.Window = "", r.Period.String()
		}
	case s.has("window"):
		r.Period = s.window
		info.Window = s.window.String()
		if u := unitOf(s.window); u != "" {
			info.Unit, info.Window = u, ""
		}
	default:
		r.Calendar = floodgate.Calendar(s.calendar)
		r.Location = s.tz
		r.WeekStart = s.weekStart
		info.Calendar, info.TimeZone = s.calendar, s.tzName
		if s.has("week_start") {
			info.WeekStart = strings.ToLower(s.weekStart.String())
		}
		if s.has("algorithm") && r.Algorithm != floodgate.FixedWindow {
			return fail("calendar", "only fixed_window windows follow the calendar")
		}
	}
	r.OnStoreFailure = floodgate.FailureMode(fm)
	r.LocalPercent = pct

	info.Name = r.Name
	info.Algorithm = string(r.Algorithm)
	info.Limit = s.rpu
	info.Burst = s.burst
	info.Refill = s.refill
	if s.granularity > 0 {
		info.Granularity = s.granularity.String()
	}
	info.Mode = s.mode
	info.SoftPercent = s.softPercent
	info.CountReject = s.countRej
	info.FailureMode = fm
	info.LocalPct = pct

	// Validate the rule on its own, so each rule's problem is reported at
	// its own lines.
	if _, err := floodgate.NewPolicy("check", r); err != nil {
		p.ruleError(err, []*spec{s}, s.path, s.line)
		return floodgate.Rule{}, info, false
	}
	return r, info, true
}

// engineField maps a floodgate.RuleError field to the rules-file field.
var engineField = map[string]string{
	"limit":            "requests_per_unit",
	"burst":            "burst",
	"refill":           "refill",
	"algorithm":        "algorithm",
	"calendar":         "calendar",
	"granularity":      "granularity",
	"soft_percent":     "soft_percent",
	"soft":             "soft_percent",
	"elastic_ceiling":  "mode",
	"elastic":          "mode",
	"spare":            "mode",
	"mode":             "mode",
	"local_percent":    "local_percent",
	"on_store_failure": "failure_mode",
	"count_rejected":   "count_rejected",
	"name":             "name",
}

// ruleError reports a floodgate.RuleError at the field it names.
func (p *parser) ruleError(err error, specs []*spec, path string, line int) {
	var re *floodgate.RuleError
	if !errors.As(err, &re) {
		p.add(line, path, "%v", err)
		return
	}
	s := specs[0]
	// "rules[i]" names the i-th rule; otherwise a rule name.
	var i int
	if _, e := fmt.Sscanf(re.Rule, "rules[%d]", &i); e == nil && i >= 0 && i < len(specs) {
		s = specs[i]
	} else {
		for _, x := range specs {
			if x.name == re.Rule {
				s = x
			}
		}
	}
	f, ok := engineField[re.Field]
	if re.Field == "period" {
		f, ok = "unit", true
		switch {
		case s.has("window"):
			f = "window"
		case s.has("unit_multiplier"):
			f = "unit_multiplier"
		}
	}
	if !ok {
		f = re.Field
	}
	if re.Field == "rules" {
		p.add(line, path, "%s", re.Msg)
		return
	}
	msg := re.Msg
	if f == "requests_per_unit" && strings.HasPrefix(msg, "must be positive") {
		msg = "must be positive"
	}
	if f == "requests_per_unit" && s.has("burst") && s.burst > s.rpu && strings.Contains(msg, "burst") {
		f = "burst" // the larger number is the one to change
	}
	p.add(s.lineOf(f), join(s.path, f), "%s", msg)
}

// statPath is envoyproxy/ratelimit's statistics key for a descriptor path:
// "domain.key_value.key2".
func statPath(domain string, chain []*node) string {
	var b strings.Builder
	b.WriteString(domain)
	for _, n := range chain {
		b.WriteByte('.')
		b.WriteString(n.key)
		if v := n.statValue(); v != "" {
			b.WriteString("_" + v)
		}
	}
	return b.String()
}

// readableName is a limit's default name: its statistics path, with any
// '.' in the domain escaped so domain and path cannot be confused.
func readableName(domain string, chain []*node) string {
	return statPath(strings.ReplaceAll(strings.ReplaceAll(domain, "%", "%25"), ".", "%2E"), chain)
}

// policyName names a path's policy: "rules/" then the domain and each node,
// escaped so that distinct paths never share a name. Names longer than 200
// bytes are cut and end in a hash of the whole.
func policyName(domain string, chain []*node) string {
	var b strings.Builder
	b.WriteString("rules/")
	pathEscape(&b, domain)
	for _, n := range chain {
		b.WriteByte('/')
		pathEscape(&b, n.key)
		switch n.kind {
		case kindExact, kindGlob:
			b.WriteByte('=')
		case kindPrefix:
			b.WriteString("^=")
		case kindRegex:
			b.WriteString("~=")
		}
		if n.kind != kindKey {
			pathEscape(&b, n.value)
		}
	}
	s := b.String()
	if len(s) > 200 {
		sum := sha256.Sum256([]byte(s))
		s = s[:120] + "#" + hex.EncodeToString(sum[:16])
	}
	return s
}

func pathEscape(b *strings.Builder, s string) {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c == 0x7f || strings.IndexByte("%/=^~#", c) >= 0 {
			fmt.Fprintf(b, "%%%02X", c)
			continue
		}
		b.WriteByte(c)
	}
}

// nameLimits gives each limit without a name its readable path, or its
// policy's name where two paths read alike.
func (p *parser) nameLimits() {
	byName := map[string][]*Limit{}
	for _, l := range p.dom.limits {
		if !l.NameGiven {
			byName[readableName(l.Domain, l.path)] = append(byName[readableName(l.Domain, l.path)], l)
		}
	}
	for name, ls := range byName {
		for _, l := range ls {
			l.Name = name
			if len(ls) > 1 {
				l.Name = policyName(l.Domain, l.path)
			}
		}
	}
}

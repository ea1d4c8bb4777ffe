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
	specs, fieldPath, line := p.limitSpecs(rl, rls, path)
	if specs == nil {
		return nil
	}
	list, first := rls != nil, specs[0]
	l := &Limit{File: p.file, Line: line, Domain: p.dom.Name, path: chain}
	l.Name, l.NameGiven = first.name, first.name != ""
	l.Replaces = first.replaces
	headOK := p.limitHead(l, specs)
	for _, n := range chain {
		l.ShareThreshold = l.ShareThreshold || n.share
		l.ValueToMetric = l.ValueToMetric || n.toMetric
	}
	l.stat = statPath(p.dom.Name, chain)

	if first.unlimited {
		if !p.unlimited(first, list) || !headOK {
			return nil
		}
		l.Unlimited = true
		p.dom.limits = append(p.dom.limits, l)
		return l
	}
	rules, ok := p.limitRules(l, specs, list)
	if !ok || !headOK || !p.blocked(l, specs, list) {
		return nil
	}
	pol, err := floodgate.NewPolicy(policyName(p.dom.Name, chain), rules...)
	if err != nil {
		p.ruleError(err, specs, fieldPath, line)
		return nil
	}
	l.Policy = pol
	limitWindow(l, rules[0])
	if !l.Blocked {
		l.RequestsPerUnit = uint32(first.rpu)
	}
	p.dom.limits = append(p.dom.limits, l)
	return l
}

// limitSpecs reads rate_limit, or each entry of rate_limits, and the path
// and line of the field; nil if any is bad (reported).
func (p *parser) limitSpecs(rl, rls *field, path string) (specs []*spec, fieldPath string, line int) {
	if rl != nil {
		fieldPath, line = join(path, "rate_limit"), rl.key.Line
		s := p.readSpec(rl.val, fieldPath)
		if s == nil || s.failed {
			return nil, "", 0
		}
		return []*spec{s}, fieldPath, line
	}
	fieldPath, line = join(path, "rate_limits"), rls.key.Line
	items, ok := p.seq(rls.val, fieldPath)
	switch {
	case !ok:
		return nil, "", 0
	case len(items) == 0:
		p.add(line, fieldPath, "an empty list: give at least one rule")
		return nil, "", 0
	case len(items) > 16:
		p.add(line, fieldPath, "%d rules; a descriptor holds at most 16", len(items))
		return nil, "", 0
	}
	for i, it := range items {
		s := p.readSpec(it, fmt.Sprintf("%s[%d]", fieldPath, i))
		if s == nil {
			return nil, "", 0
		}
		specs = append(specs, s)
	}
	for _, s := range specs {
		if s.failed {
			return nil, "", 0
		}
	}
	return specs, fieldPath, line
}

// limitHead checks what names the whole limit, said in the first entry of
// rate_limits only: replaces (and name), and unlimited.
func (p *parser) limitHead(l *Limit, specs []*spec) bool {
	ok := true
	for _, s := range specs[1:] {
		if s.has("replaces") {
			p.add(s.lineOf("replaces"), join(s.path, "replaces"), "belongs in the first entry of rate_limits (its name and replaces name the whole limit)")
			ok = false
		}
		if s.unlimited {
			p.add(s.lineOf("unlimited"), join(s.path, "unlimited"), "an unlimited descriptor has a single rate_limit")
			ok = false
		}
	}
	first := specs[0]
	for _, r := range l.Replaces {
		if l.NameGiven && r == l.Name {
			p.add(first.lineOf("replaces"), join(first.path, "replaces"), "replaces should not contain the name of the same limit (%q)", r)
			ok = false
		}
	}
	return ok
}

// unlimitedTakes are the rate_limit fields an unlimited limit may have
// (unit only when empty).
var unlimitedTakes = []string{"unit", "unlimited", "name", "replaces", "requests_per_unit"}

// unlimited checks an unlimited limit's single rate_limit.
func (p *parser) unlimited(s *spec, list bool) bool {
	if list {
		p.add(s.lineOf("unlimited"), join(s.path, "unlimited"), "an unlimited descriptor has a single rate_limit")
		return false
	}
	if s.has("unit") {
		p.add(s.lineOf("unit"), join(s.path, "unit"), "should not specify rate limit unit when unlimited")
		return false
	}
	ok := true
	for _, f := range ruleFields {
		if s.has(f) && !contains(unlimitedTakes, f) {
			p.add(s.lineOf(f), join(s.path, f), "an unlimited limit has no %s", f)
			ok = false
		}
	}
	return ok
}

// limitRules turns each spec into a rule, naming those without a name.
func (p *parser) limitRules(l *Limit, specs []*spec, list bool) ([]floodgate.Rule, bool) {
	var rules []floodgate.Rule
	names := map[string]int{}
	ok := true
	for _, s := range specs {
		r, info, good := p.rule(s, list)
		if !good {
			ok = false
			continue
		}
		if r.Name == "" {
			r.Name = ruleName(info, names)
			info.Name = r.Name
		}
		rules = append(rules, r)
		l.rules = append(l.rules, info)
	}
	return rules, ok
}

// ruleName names a rule by its window ("minute", "calendar_day", "1m30s"),
// "#2" added for a second rule of that window, and so on.
func ruleName(info ruleInfo, names map[string]int) string {
	base := info.Unit
	switch {
	case base != "":
	case info.Calendar != "":
		base = "calendar_" + info.Calendar
	default:
		base = info.Window
	}
	names[base]++
	if names[base] > 1 {
		return fmt.Sprintf("%s#%d", base, names[base])
	}
	return base
}

// blocked reads requests_per_unit: 0, which blocks every request in a
// single rate_limit and is refused in rate_limits.
func (p *parser) blocked(l *Limit, specs []*spec, list bool) bool {
	first := specs[0]
	if first.rpu == 0 {
		if list {
			p.add(first.lineOf("requests_per_unit"), join(first.path, "requests_per_unit"), "must be positive in rate_limits (a single rate_limit with requests_per_unit: 0 blocks every request)")
			return false
		}
		l.Blocked = true
	}
	ok := true
	for _, s := range specs[1:] {
		if s.rpu == 0 {
			p.add(s.lineOf("requests_per_unit"), join(s.path, "requests_per_unit"), "must be positive in rate_limits")
			ok = false
		}
	}
	return ok
}

// limitWindow states a limit's window as its first rule r has it.
func limitWindow(l *Limit, r floodgate.Rule) {
	w := r.Period
	if r.Calendar == "" {
		l.Unit = unitOf(w)
		l.MultipliedUnit, l.UnitMultiplier = multipliedUnit(w)
		l.Window = w
		return
	}
	switch r.Calendar {
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
	l.Window = w
}

// A problem is a rules-file field and what is wrong with it; the zero
// problem is none.
type problem struct{ field, msg string }

// rule turns a spec into an engine rule, validating it on its own.
func (p *parser) rule(s *spec, list bool) (floodgate.Rule, ruleInfo, bool) {
	var info ruleInfo
	fail := func(pb problem) (floodgate.Rule, ruleInfo, bool) {
		p.add(s.lineOf(pb.field), join(s.path, pb.field), "%s", pb.msg)
		return floodgate.Rule{}, info, false
	}
	if pb := specProblem(s); pb.field != "" {
		return fail(pb)
	}
	fm, pct, pb := p.failureMode(s)
	if pb.field != "" {
		return fail(pb)
	}
	r := floodgate.Rule{
		Name:           s.name,
		Algorithm:      floodgate.FixedWindow,
		Limit:          max(s.rpu, 1), // 1: the placeholder of a blocked limit
		Burst:          s.burst,
		Refill:         floodgate.Refill(s.refill),
		Granularity:    s.granularity,
		CountRejected:  s.countRej,
		SoftPercent:    s.softPercent,
		OnStoreFailure: floodgate.FailureMode(fm),
		LocalPercent:   pct,
		Tier:           floodgate.Tier(s.tier),
		Budget:         s.budget,
	}
	if !list {
		r.Name = "" // a single rate_limit's name names the limit, not the rule
	}
	if s.has("algorithm") {
		r.Algorithm = floodgate.Algorithm(s.algorithm)
	}
	switch s.mode {
	case "soft":
		r.Mode = floodgate.Soft
	case "elastic":
		r.Mode, r.ElasticCeiling, r.Spare = floodgate.Elastic, s.elastic, p.opts.Spare
	}
	if pb := p.ruleWindow(s, &r, &info); pb.field != "" {
		return fail(pb)
	}
	describeRule(&info, r, s)

	// Validate the rule on its own, so each rule's problem is reported at
	// its own lines.
	if _, err := floodgate.NewPolicy("check", r); err != nil {
		p.ruleError(err, []*spec{s}, s.path, s.line)
		return floodgate.Rule{}, info, false
	}
	return r, info, true
}

// specNeeds are the rate_limit fields allowed only where another field
// has some value, in the order they are checked.
var specNeeds = []struct {
	field string
	with  func(*spec) bool
	msg   string
}{
	{"unit_multiplier", func(s *spec) bool { return s.has("unit") }, "needs a unit"},
	{"time_zone", func(s *spec) bool { return s.has("calendar") }, "only calendar windows have a time zone"},
	{"week_start", func(s *spec) bool { return s.calendar == "week" }, "only calendar: week windows have a first weekday"},
	{"soft_percent", func(s *spec) bool { return s.mode == "soft" }, "needs mode: soft"},
	{"elastic_ceiling", func(s *spec) bool { return s.mode == "elastic" }, "needs mode: elastic"},
	{"budget", func(s *spec) bool { return s.tier == "write_back" }, "needs tier: write_back"},
}

// specProblem is the first problem of s's fields together: what is
// missing, what excludes what, and specNeeds.
func specProblem(s *spec) problem {
	unit, window, calendar := s.has("unit"), s.has("window"), s.has("calendar")
	switch {
	case !s.has("requests_per_unit"):
		return problem{"requests_per_unit", "missing: how many requests each window admits (requests_per_unit: 0 blocks every request)"}
	case unit && window:
		return problem{"window", "give unit or window, not both"}
	case calendar && (unit || window):
		return problem{"calendar", "a calendar window replaces unit and window: give one of them"}
	case !unit && !window && !calendar && s.has("unlimited"):
		return problem{"unit", "missing: with unlimited: false the limit needs a unit (second, minute, hour, day, week, month or year)"}
	case !unit && !window && !calendar:
		return problem{"unit", "missing: a rate_limit needs a unit (second, minute, hour, day, week, month or year) or unlimited: true"}
	}
	for _, n := range specNeeds {
		if s.has(n.field) && !n.with(s) {
			return problem{n.field, n.msg}
		}
	}
	if s.mode == "soft" && !s.has("soft_percent") {
		return problem{"mode", "soft needs soft_percent: how far beyond the limit to admit, in percent"}
	}
	if s.mode == "elastic" && !s.has("elastic_ceiling") {
		return problem{"mode", "elastic needs elastic_ceiling: the most admitted while the server has spare capacity (above the limit)"}
	}
	if s.tier == "write_back" && !s.has("budget") {
		return problem{"tier", "write_back needs budget: the overshoot accepted, as a percentage of the limit such as 1%"}
	}
	return problem{}
}

// failureMode is a rule's failure mode, its own or the file's, and its
// share in local mode.
func (p *parser) failureMode(s *spec) (string, int64, problem) {
	fm := s.failMode
	if fm == "" {
		fm = p.fail.mode
	}
	if fm != "local" {
		if s.has("local_percent") {
			return fm, 0, problem{"local_percent", "needs failure_mode: local"}
		}
		return fm, 0, problem{}
	}
	pct := s.localPct
	if !s.has("local_percent") {
		pct = p.fail.percent
	}
	if pct == 0 {
		return fm, 0, problem{"failure_mode", "local needs local_percent (1 to 100): the share of the limit each instance allows on its own"}
	}
	return fm, pct, problem{}
}

// ruleWindow sets r's window from s's unit, window or calendar.
func (p *parser) ruleWindow(s *spec, r *floodgate.Rule, info *ruleInfo) problem {
	switch {
	case s.has("unit") && s.unit == "month" && p.opts.CalendarMonth:
		// envoyproxy/ratelimit's USE_CALENDAR_MONTH_RATE_LIMIT: calendar
		// months in UTC.
		if s.mult > 1 {
			return problem{"unit_multiplier", "calendar months (Options.CalendarMonth) cannot be multiplied"}
		}
		if s.has("algorithm") && r.Algorithm != floodgate.FixedWindow {
			return problem{"algorithm", "unit: month is a calendar month here (Options.CalendarMonth), which only fixed_window follows"}
		}
		r.Calendar, r.Location = floodgate.CalendarMonth, time.UTC
		info.Unit, info.Calendar = "month", "month"
	case s.has("unit"):
		mult := time.Duration(max(s.mult, 1))
		if s.unitWin > time.Duration(math.MaxInt64)/mult {
			return problem{"unit_multiplier", "makes the window too long"}
		}
		r.Period = s.unitWin * mult
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
		r.Calendar, r.Location, r.WeekStart = floodgate.Calendar(s.calendar), s.tz, s.weekStart
		info.Calendar, info.TimeZone = s.calendar, s.tzName
		if s.has("week_start") {
			info.WeekStart = strings.ToLower(s.weekStart.String())
		}
		if s.has("algorithm") && r.Algorithm != floodgate.FixedWindow {
			return problem{"calendar", "only fixed_window windows follow the calendar"}
		}
	}
	return problem{}
}

// describeRule completes info, a rule as written, from r and s.
func describeRule(info *ruleInfo, r floodgate.Rule, s *spec) {
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
	info.FailureMode = string(r.OnStoreFailure)
	info.LocalPct = r.LocalPercent
	info.Tier = s.tier
	info.Budget = s.budget
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
	"elastic_ceiling":  "elastic_ceiling",
	"elastic":          "mode",
	"spare":            "mode",
	"mode":             "mode",
	"local_percent":    "local_percent",
	"on_store_failure": "failure_mode",
	"count_rejected":   "count_rejected",
	"name":             "name",
	"tier":             "tier",
	"budget":           "budget",
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

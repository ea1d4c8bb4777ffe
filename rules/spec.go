package rules

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// spec is one rate_limit (or rate_limits entry) as written.
type spec struct {
	path   string
	line   int
	lines  map[string]int // field → line of its value
	set    map[string]bool
	failed bool

	emptyUnit   int // the line of unit: "", if given
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
	elastic     int64 // elastic_ceiling
	countRej    bool
	failMode    string
	localPct    int64
	tier        string
	budget      float64 // a fraction of the limit
}

func (s *spec) has(f string) bool { return s.set[f] }

// lineOf returns the line of field f, else of the mapping.
func (s *spec) lineOf(f string) int {
	if l, ok := s.lines[f]; ok {
		return l
	}
	return s.line
}

// A specReader reads one rate_limit field's value (not null) into s; false
// if it was bad (and reported).
type specReader func(p *parser, s *spec, v *yaml.Node, path string) bool

// specReaders read the fields of ruleFields.
var specReaders = map[string]specReader{
	"unit":              (*parser).specUnit,
	"requests_per_unit": specInt(0, math.MaxUint32, func(s *spec) *int64 { return &s.rpu }),
	"unit_multiplier":   specInt(1, math.MaxUint32, func(s *spec) *int64 { return &s.mult }),
	"unlimited":         specBool(func(s *spec) *bool { return &s.unlimited }),
	"name":              (*parser).specName,
	"replaces":          (*parser).specReplaces,
	"window":            specDuration(func(s *spec) *time.Duration { return &s.window }),
	"calendar":          specChoice("calendar", []string{"day", "week", "month"}, func(s *spec) *string { return &s.calendar }),
	"time_zone":         (*parser).specZone,
	"week_start":        (*parser).specWeekStart,
	"algorithm":         specString(func(s *spec) *string { return &s.algorithm }),
	"burst":             specInt(1, 1<<51, func(s *spec) *int64 { return &s.burst }),
	"refill":            specString(func(s *spec) *string { return &s.refill }),
	"granularity":       specDuration(func(s *spec) *time.Duration { return &s.granularity }),
	"mode":              (*parser).specMode,
	"soft_percent":      specInt(1, 10000, func(s *spec) *int64 { return &s.softPercent }),
	"elastic_ceiling":   (*parser).specElastic,
	"count_rejected":    specBool(func(s *spec) *bool { return &s.countRej }),
	"failure_mode":      specChoice("failure mode", []string{"open", "closed", "local"}, func(s *spec) *string { return &s.failMode }),
	"local_percent":     specInt(1, 100, func(s *spec) *int64 { return &s.localPct }),
	"tier":              specChoice("tier", []string{"exact", "local_share", "write_back"}, func(s *spec) *string { return &s.tier }),
	"budget":            (*parser).specBudget,
}

// readSpec reads a rate_limit mapping.
func (p *parser) readSpec(v *yaml.Node, path string) *spec {
	m, ok := p.mapping(v, path)
	if !ok {
		return nil
	}
	s := &spec{path: path, line: m.Line, lines: map[string]int{}, set: map[string]bool{}}
	for _, f := range p.fields(m, path) {
		val := p.resolve(f.val)
		read := specReaders[f.name]
		switch {
		case val == nil:
			s.failed = true
		case read == nil:
			p.unknown(f, path, ruleFields)
			s.failed = true
		case isNull(val):
		default:
			s.lines[f.name] = f.key.Line
			s.set[f.name] = true
			if !read(p, s, val, join(path, f.name)) {
				s.failed = true
			}
		}
	}
	if s.emptyUnit > 0 {
		// An empty unit is absent when unlimited, as envoyproxy/ratelimit
		// takes it, and unknown otherwise.
		if s.unlimited {
			delete(s.set, "unit")
			delete(s.lines, "unit")
		} else {
			p.add(s.emptyUnit, join(path, "unit"), "unknown unit \"\" (want second, minute, hour, day, week, month or year)")
			s.failed = true
		}
	}
	return s
}

func specInt(lo, hi int64, at func(*spec) *int64) specReader {
	return func(p *parser, s *spec, v *yaml.Node, path string) (ok bool) {
		*at(s), ok = p.integer(v, path, lo, hi)
		return ok
	}
}

func specBool(at func(*spec) *bool) specReader {
	return func(p *parser, s *spec, v *yaml.Node, path string) (ok bool) {
		*at(s), ok = p.boolean(v, path)
		return ok
	}
}

func specString(at func(*spec) *string) specReader {
	return func(p *parser, s *spec, v *yaml.Node, path string) (ok bool) {
		*at(s), ok = p.str(v, path)
		return ok
	}
}

func specDuration(at func(*spec) *time.Duration) specReader {
	return func(p *parser, s *spec, v *yaml.Node, path string) (ok bool) {
		*at(s), ok = p.duration(v, path)
		return ok
	}
}

// specChoice reads a string, lowercased, one of want.
func specChoice(what string, want []string, at func(*spec) *string) specReader {
	return func(p *parser, s *spec, v *yaml.Node, path string) bool {
		c, ok := p.str(v, path)
		if !ok {
			return false
		}
		if *at(s) = strings.ToLower(c); !contains(want, *at(s)) {
			p.add(v.Line, path, "unknown %s %q (want %s)", what, c, orList(want))
			return false
		}
		return true
	}
}

// orList says "a, b or c".
func orList(s []string) string {
	if len(s) < 2 {
		return strings.Join(s, "")
	}
	return strings.Join(s[:len(s)-1], ", ") + " or " + s[len(s)-1]
}

func (p *parser) specUnit(s *spec, v *yaml.Node, path string) bool {
	u, ok := p.str(v, path)
	if !ok {
		return false
	}
	s.unit = strings.ToLower(u)
	if u == "" {
		s.emptyUnit = v.Line // read once unlimited is known
		return true
	}
	if s.unitWin, ok = unitWindow(s.unit); !ok {
		p.add(v.Line, path, "unknown unit %q (want second, minute, hour, day, week, month or year)", u)
	}
	return ok
}

func (p *parser) specName(s *spec, v *yaml.Node, path string) bool {
	name, ok := p.str(v, path)
	s.name = name
	if ok && name == "" {
		p.add(v.Line, path, "must not be empty")
		return false
	}
	return ok
}

func (p *parser) specReplaces(s *spec, v *yaml.Node, path string) bool {
	items, ok := p.seq(v, path)
	if !ok {
		return false
	}
	for i, it := range items {
		name, good := p.replacesEntry(it, fmt.Sprintf("%s[%d]", path, i))
		if !good {
			ok = false
			continue
		}
		s.replaces = append(s.replaces, name)
	}
	return ok
}

func (p *parser) specZone(s *spec, v *yaml.Node, path string) bool {
	z, ok := p.str(v, path)
	if !ok {
		return false
	}
	loc, err := loadLocation(z)
	if err != nil {
		p.add(v.Line, path, "unknown time zone %q (want an IANA name such as Europe/Paris, or UTC)", z)
		ok = false
	}
	s.tz, s.tzName = loc, z
	return ok
}

func (p *parser) specWeekStart(s *spec, v *yaml.Node, path string) bool {
	w, ok := p.str(v, path)
	if !ok {
		return false
	}
	if s.weekStart, ok = weekdays[strings.ToLower(w)]; !ok {
		p.add(v.Line, path, "unknown weekday %q (want monday, tuesday, ... sunday)", w)
	}
	return ok
}

func (p *parser) specMode(s *spec, v *yaml.Node, path string) bool {
	md, ok := p.str(v, path)
	if !ok {
		return false
	}
	switch s.mode = strings.ToLower(md); s.mode {
	case "hard", "soft":
		return true
	case "elastic":
		if p.opts.Spare != nil {
			return true
		}
		p.add(v.Line, path, "%s", noSpare)
	default:
		p.add(v.Line, path, "unknown mode %q (want hard, soft or elastic)", md)
	}
	return false
}

// noSpare says why elastic mode is refused without Options.Spare.
const noSpare = "elastic mode needs a live spare-capacity signal, which a rules file cannot give: floodgate proxy gives its server throttler's (--throttle-max-inflight or --throttle-adaptive), Go code rules.Options.Spare; else use hard or soft"

func (p *parser) specElastic(s *spec, v *yaml.Node, path string) bool {
	if p.opts.Spare == nil {
		p.add(v.Line, path, "%s", noSpare)
		return false
	}
	n, ok := p.integer(v, path, 2, 1<<51)
	s.elastic = n
	return ok
}

// specBudget reads a write-back budget written as a percentage of the
// limit ("1%", "0.5%"), above 0 and at most 50%.
func (p *parser) specBudget(s *spec, v *yaml.Node, path string) bool {
	if v.Kind != yaml.ScalarNode || isNull(v) {
		p.add(v.Line, path, "want a percentage of the limit such as 1%%, got %s", kindName(v))
		return false
	}
	num, ok := strings.CutSuffix(strings.TrimSpace(v.Value), "%")
	f, err := strconv.ParseFloat(strings.TrimSpace(num), 64)
	if !ok || err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		p.add(v.Line, path, "want a percentage of the limit such as 1%%, got %q", v.Value)
		return false
	}
	if f <= 0 || f > 50 {
		p.add(v.Line, path, "%s is out of range (above 0%% and at most 50%%)", v.Value)
		return false
	}
	s.budget = f / 100
	return true
}

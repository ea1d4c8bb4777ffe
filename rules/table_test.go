package rules

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"
)

// actionSamples are a valid value of each field of actionFields, and how
// the parsed route shows it.
var actionSamples = map[string]struct {
	yaml string
	got  func(r *HTTPRoute) bool
}{
	"status":          {"503", func(r *HTTPRoute) bool { return r.Status == 503 }},
	"max_delay":       {"100ms", func(r *HTTPRoute) bool { return r.MaxDelay == 100*time.Millisecond }},
	"redirect":        {"/busy", func(r *HTTPRoute) bool { return r.Redirect == "/busy" }},
	"redirect_status": {"307", func(r *HTTPRoute) bool { return r.RedirectStatus == 307 }},
	"ban":             {"{threshold: 5, interval: 1m, duration: 2m}", func(r *HTTPRoute) bool { return r.Ban == HTTPBan{5, time.Minute, 2 * time.Minute} }},
	"defer":           {"{max_queue: 7, max_body: 0, result_ttl: 1m}", func(r *HTTPRoute) bool { return r.Defer == HTTPDefer{7, 0, time.Minute} }},
}

// actionRoute is a file whose one route has action act, the fields act
// needs (but skip), and then extra lines from line 8 on.
func actionRoute(act, skip string, extra ...string) string {
	src := "domain: d\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 5}\nhttp:\n  - key: [remote_address]\n    action: " + act + "\n"
	for _, l := range extra {
		src += "    " + l + "\n"
	}
	for _, af := range actionFields {
		if af.need != "" && af.name != skip && slices.Contains(af.actions, act) {
			src += "    " + af.name + ": " + actionSamples[af.name].yaml + "\n"
		}
	}
	return src
}

// TestActionFieldTable checks the parser against actionFields: each field
// is accepted, and read, with each action the table gives it, refused at
// its line with every other action, and missing at the action's line when
// an action that needs it lacks it.
func TestActionFieldTable(t *testing.T) {
	for _, af := range actionFields {
		sample, ok := actionSamples[af.name]
		if !ok {
			t.Fatalf("no sample value for %s", af.name)
		}
		for _, act := range httpActions {
			src := actionRoute(act, af.name, af.name+": "+sample.yaml) // the field at line 8
			d, err := Parse("f.yaml", []byte(src))
			if slices.Contains(af.actions, act) {
				if err != nil {
					t.Errorf("%s with action %s: %v", af.name, act, err)
				} else if r := d.HTTP()[0]; !sample.got(r) {
					t.Errorf("%s with action %s: not read: %+v", af.name, act, r)
				}
				continue
			}
			want := fmt.Sprintf("f.yaml:8: http[0].%s: ", af.name)
			if err == nil || strings.Contains(err.Error(), "\n") || !strings.HasPrefix(err.Error(), want) || !regexp.MustCompile(`\baction (is )?`+act+`\b`).MatchString(err.Error()) {
				t.Errorf("%s with action %s: got %v, want one error %q... naming the action", af.name, act, err, want)
			}
		}
		for _, act := range af.actions {
			if af.need == "" {
				continue
			}
			_, err := Parse("f.yaml", []byte(actionRoute(act, af.name)))
			want := fmt.Sprintf("f.yaml:7: http[0].%s: missing: action %s needs %s", af.name, act, af.need)
			if err == nil || err.Error() != want {
				t.Errorf("action %s without %s: got %v, want %q", act, af.name, err, want)
			}
		}
	}
}

// TestRouteFieldsTakeEveryAction checks that the route fields outside
// actionFields are accepted with every action.
func TestRouteFieldsTakeEveryAction(t *testing.T) {
	samples := map[string]string{
		"name":         "r1",
		"match":        "{path_prefix: /api/}",
		"cost":         "2",
		"exempt_cidrs": "[10.0.0.0/8]",
		"criticality":  "sheddable-plus",
		"rate_limit":   "{unit: second, requests_per_unit: 5, algorithm: token_bucket, burst: 5}",
		"rate_limits":  "[{unit: second, requests_per_unit: 5, algorithm: gcra, burst: 5}]",
	}
	for _, name := range httpFields {
		if name == "key" || name == "action" || actionFieldOf(name) != nil {
			continue
		}
		sample, ok := samples[name]
		if !ok {
			t.Fatalf("no sample value for %s", name)
		}
		for _, act := range httpActions {
			if _, err := Parse("f.yaml", []byte(actionRoute(act, "", name+": "+sample))); err != nil {
				t.Errorf("%s with action %s: %v", name, act, err)
			}
		}
	}
}

// TestSpecNeedsTable checks the parser against specNeeds: each field is
// refused at its line where its condition fails, and accepted where it
// holds.
func TestSpecNeedsTable(t *testing.T) {
	cases := map[string]struct{ without, with string }{
		"unit_multiplier": {"window: 2m, unit_multiplier: 2", "unit: minute, unit_multiplier: 2"},
		"time_zone":       {"unit: day, time_zone: UTC", "calendar: day, time_zone: UTC"},
		"week_start":      {"calendar: day, week_start: monday", "calendar: week, week_start: monday"},
		"soft_percent":    {"unit: minute, mode: hard, soft_percent: 10", "unit: minute, mode: soft, soft_percent: 10"},
		"budget":          {"unit: minute, tier: exact, budget: 1%", "unit: minute, tier: write_back, budget: 1%"},
		"elastic_ceiling": {"unit: minute, mode: hard, elastic_ceiling: 10", "unit: minute, mode: elastic, elastic_ceiling: 10"},
	}
	spare := Options{Spare: func() bool { return false }}
	if len(cases) != len(specNeeds) {
		t.Fatalf("%d cases for %d entries of specNeeds", len(cases), len(specNeeds))
	}
	file := func(fields string) string {
		return "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {requests_per_unit: 5, " + fields + "}\n"
	}
	for _, n := range specNeeds {
		c, ok := cases[n.field]
		if !ok {
			t.Fatalf("no case for %s", n.field)
		}
		_, err := ParseWith("f.yaml", []byte(file(c.without)), spare)
		if want := "f.yaml:4: descriptors[0].rate_limit." + n.field + ": " + n.msg; err == nil || err.Error() != want {
			t.Errorf("%s without its condition: got %v, want %q", n.field, err, want)
		}
		if _, err := ParseWith("f.yaml", []byte(file(c.with)), spare); err != nil {
			t.Errorf("%s with its condition: %v", n.field, err)
		}
	}
}

// TestExemptRefusesTable checks that an exempt descriptor refuses each
// field of exemptRefuses at its line.
func TestExemptRefusesTable(t *testing.T) {
	samples := map[string]string{
		"rate_limit":    "{unit: second, requests_per_unit: 5}",
		"rate_limits":   "[{unit: second, requests_per_unit: 5}]",
		"descriptors":   "[{key: k2}]",
		"exempt_values": "[a]",
	}
	for _, name := range exemptRefuses {
		src := "domain: d\ndescriptors:\n  - key: k\n    exempt: true\n    " + name + ": " + samples[name] + "\n"
		_, err := Parse("f.yaml", []byte(src))
		want := "f.yaml:5: descriptors[0]." + name + ": an exempt descriptor is never limited: it cannot have " + name
		if err == nil || err.Error() != want {
			t.Errorf("exempt with %s: got %v, want %q", name, err, want)
		}
	}
}

// TestFieldListsMatchTables checks that the field lists the "unknown
// field" hints use name exactly the fields the parser reads.
func TestFieldListsMatchTables(t *testing.T) {
	keys := func(m any) []string {
		var out []string
		switch m := m.(type) {
		case map[string]specReader:
			for k := range m {
				out = append(out, k)
			}
		case map[string]routeReader:
			for k := range m {
				out = append(out, k)
			}
		case map[string]func(*descSpec) *bool:
			for k := range m {
				out = append(out, k)
			}
		}
		return out
	}
	same := func(what string, got, want []string) {
		t.Helper()
		got, want = slices.Clone(got), slices.Clone(want)
		sort.Strings(got)
		sort.Strings(want)
		if !slices.Equal(got, want) {
			t.Errorf("%s: the parser reads %q, the list says %q", what, got, want)
		}
	}
	same("rate_limit", keys(specReaders), ruleFields)

	route := append(keys(routeReaders), "key", "rate_limit", "rate_limits")
	for _, af := range actionFields {
		route = append(route, af.name)
	}
	same("route", route, httpFields)

	var kinds []string
	for k := range namedKinds {
		kinds = append(kinds, k)
	}
	same("named key parts", kinds, httpNamedKinds)

	var match []string
	for k := range matchReaders {
		match = append(match, k)
	}
	same("match", match, httpMatchFields)

	// A descriptor's key, booleans and values are read as they come; the
	// rest is kept for later phases, each of which is refused somewhere
	// when misplaced.
	desc := append(keys(descBools), "key", "exempt_values", "rate_limit", "rate_limits", "descriptors", "metadata")
	for _, vf := range valueFields {
		desc = append(desc, vf.name)
	}
	same("descriptor", desc, descFields)

	for _, f := range unlimitedTakes {
		if !slices.Contains(ruleFields, f) {
			t.Errorf("unlimitedTakes names %q, no rate_limit field", f)
		}
	}
	for _, n := range specNeeds {
		if !slices.Contains(ruleFields, n.field) {
			t.Errorf("specNeeds names %q, no rate_limit field", n.field)
		}
	}
}

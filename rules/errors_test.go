package rules

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// parseErrorTests are broken files and their errors, line by line; the
// fuzz test seeds its corpus with them too.
var parseErrorTests = []struct {
	name string
	src  string
	want []string // each a line of the error, exactly
}{
	{"unknown unit", `domain: api
descriptors:
  - key: user
    rate_limit:
      requests_per_unit: 5
      unit: fortnight
`, []string{`bad.yaml:6: descriptors[0].rate_limit.unit: unknown unit "fortnight" (want second, minute, hour, day, week, month or year)`}},

	{"missing domain", `descriptors: []
`, []string{`bad.yaml:1: domain: missing: every rules file names its domain`}},

	{"empty domain", `domain: ""
`, []string{`bad.yaml:1: domain: must not be empty`}},

	{"empty file", ``, []string{`bad.yaml:1: domain: missing: every rules file names its domain`}},

	{"not a mapping", `- a
- b
`, []string{`bad.yaml:1: want a mapping, got a list`}},

	{"bad yaml", `domain: x
descriptors:
  - key: a
   value: b
`, []string{`bad.yaml:2: invalid YAML: did not find expected '-' indicator`}},

	{"tabs", "domain: x\ndescriptors:\n\t- key: a\n", []string{`bad.yaml:3: invalid YAML: found character that cannot start any token`}},

	{"second document", `domain: x
---
domain: y
`, []string{`bad.yaml:2: a second YAML document: a rules file holds one domain`}},

	{"second document after an empty one", "domain: x\n---\n# nothing\n---\ndomain: y\n",
		[]string{`bad.yaml:4: a second YAML document: a rules file holds one domain`}},

	{"binary tag", "domain: !!binary ZA==\n",
		[]string{`bad.yaml:1: YAML tag !!binary is not supported here (rules are plain strings, numbers, booleans, lists and maps)`}},

	{"local tag", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: !limit {unit: second, requests_per_unit: 5}\n",
		[]string{`bad.yaml:4: YAML tag !limit is not supported here (rules are plain strings, numbers, booleans, lists and maps)`}},

	{"second document holding null", "domain: x\n---\n~\n",
		[]string{`bad.yaml:2: a second YAML document: a rules file holds one domain`}},

	{"empty unit", `domain: x
descriptors:
  - key: a
    rate_limit: {unit: "", requests_per_unit: 5}
  - key: b
    rate_limit: {unit: "", unlimited: false, requests_per_unit: 5}
`, []string{
		`bad.yaml:4: descriptors[0].rate_limit.unit: unknown unit "" (want second, minute, hour, day, week, month or year)`,
		`bad.yaml:6: descriptors[1].rate_limit.unit: unknown unit "" (want second, minute, hour, day, week, month or year)`,
	}},

	{"unlimited with unknown unit", `domain: x
descriptors:
  - key: foo
    rate_limit:
      unlimited: true
      unit: fortnight
`, []string{`bad.yaml:6: descriptors[0].rate_limit.unit: unknown unit "fortnight" (want second, minute, hour, day, week, month or year)`}},

	{"missing and empty keys", `domain: x
descriptors:
  - value: a
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: ""
`, []string{
		`bad.yaml:3: descriptors[0].key: missing: every descriptor has a key`,
		`bad.yaml:5: descriptors[1].key: must not be empty`,
	}},

	{"duplicate descriptors", `domain: x
descriptors:
  - key: a
    value: b
  - key: a
    value: b
  - key: a
  - key: a
`, []string{
		`bad.yaml:5: descriptors[1]: duplicate descriptor: key "a" value "b" is already defined at line 3`,
		`bad.yaml:8: descriptors[3]: duplicate descriptor: key "a" is already defined at line 7`,
	}},

	{"duplicate nested", `domain: x
descriptors:
  - key: a
    descriptors:
      - key: b
        value: "c*"
      - key: b
        value: "c*"
`, []string{`bad.yaml:7: descriptors[0].descriptors[1]: duplicate descriptor: key "b" value "c*" is already defined at line 5`}},

	{"unknown fields", `domain: x
descriptors:
  - key: a
    ratelimit:
      unit: second
  - key: b
    rate_limit:
      unit: second
      requestsperunit: 5
  - key: c
    unit: second
  - key: d
    rate_limit:
      unit: second
      requests_per_unit: 1
      shadow_mode: true
colour: blue
`, []string{
		`bad.yaml:4: descriptors[0].ratelimit: unknown field "ratelimit" (did you mean "rate_limit"?)`,
		`bad.yaml:9: descriptors[1].rate_limit.requestsperunit: unknown field "requestsperunit" (did you mean "requests_per_unit"?)`,
		`bad.yaml:11: descriptors[2].unit: unknown field "unit" here (it belongs in rate_limit)`,
		`bad.yaml:16: descriptors[3].rate_limit.shadow_mode: unknown field "shadow_mode" here (it is a descriptor field)`,
		`bad.yaml:17: colour: unknown field "colour"`,
	}},

	{"list of non-maps", `domain: x
descriptors:
  - a
`, []string{`bad.yaml:3: descriptors[0]: want a descriptor (a mapping with a key), got "a"`}},

	{"non-string field name", `domain: x
0.25: y
`, []string{`bad.yaml:2: 0.25: unknown field "0.25"`}},

	{"field twice", `domain: x
descriptors:
  - key: a
    key: b
`, []string{`bad.yaml:4: descriptors[0].key: given twice (first at line 3)`}},

	{"unlimited with unit", `domain: x
descriptors:
  - key: foo
    rate_limit:
      unlimited: true
      unit: day
      requests_per_unit: 25
`, []string{`bad.yaml:6: descriptors[0].rate_limit.unit: should not specify rate limit unit when unlimited`}},

	{"unlimited with engine fields", `domain: x
descriptors:
  - key: foo
    rate_limit:
      unlimited: true
      algorithm: token_bucket
`, []string{`bad.yaml:6: descriptors[0].rate_limit.algorithm: an unlimited limit has no algorithm`}},

	{"no unit", `domain: x
descriptors:
  - key: foo
    rate_limit:
      requests_per_unit: 25
  - key: bar
    rate_limit: {}
  - key: baz
    rate_limit:
      unit: minute
`, []string{
		`bad.yaml:5: descriptors[0].rate_limit.unit: missing: a rate_limit needs a unit (second, minute, hour, day, week, month or year) or unlimited: true`,
		`bad.yaml:7: descriptors[1].rate_limit.requests_per_unit: missing: how many requests each window admits (requests_per_unit: 0 blocks every request)`,
		`bad.yaml:10: descriptors[2].rate_limit.requests_per_unit: missing: how many requests each window admits (requests_per_unit: 0 blocks every request)`,
	}},

	{"replaces", `domain: x
descriptors:
  - key: a
    rate_limit:
      name: me
      unit: second
      requests_per_unit: 1
      replaces:
        - name: me
  - key: b
    rate_limit:
      unit: second
      requests_per_unit: 1
      replaces:
        - name: ""
  - key: c
    rate_limit:
      unit: second
      requests_per_unit: 1
      replaces:
        - nom: x
`, []string{
		`bad.yaml:8: descriptors[0].rate_limit.replaces: replaces should not contain the name of the same limit ("me")`,
		`bad.yaml:15: descriptors[1].rate_limit.replaces[0].name: should not be empty: replaces names the limit it replaces`,
		`bad.yaml:21: descriptors[2].rate_limit.replaces[0].nom: unknown field "nom" (did you mean "name"?)`,
	}},

	{"numbers", `domain: x
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: -1}
  - key: b
    rate_limit: {unit: second, requests_per_unit: 4294967296}
  - key: c
    rate_limit: {unit: second, requests_per_unit: ten}
  - key: d
    rate_limit: {unit: second, requests_per_unit: "5"}
  - key: e
    rate_limit: {unit: second, requests_per_unit: 1.5}
  - key: f
    rate_limit: {unit: minute, unit_multiplier: 0, requests_per_unit: 5}
`, []string{
		`bad.yaml:4: descriptors[0].rate_limit.requests_per_unit: -1 is out of range (0 to 4294967295)`,
		`bad.yaml:6: descriptors[1].rate_limit.requests_per_unit: 4294967296 is out of range (0 to 4294967295)`,
		`bad.yaml:8: descriptors[2].rate_limit.requests_per_unit: want a whole number, got "ten"`,
		`bad.yaml:10: descriptors[3].rate_limit.requests_per_unit: want a whole number, got "5"`,
		`bad.yaml:12: descriptors[4].rate_limit.requests_per_unit: 1.5 is not a whole number`,
		`bad.yaml:14: descriptors[5].rate_limit.unit_multiplier: 0 is out of range (1 to 4294967295)`,
	}},

	{"booleans", `domain: x
all_or_nothing: perhaps
descriptors:
  - key: a
    shadow_mode: "true"
    detailed_metric: [true]
`, []string{
		`bad.yaml:2: all_or_nothing: want true or false, got "perhaps"`,
		`bad.yaml:5: descriptors[0].shadow_mode: want true or false, got "true"`,
		`bad.yaml:6: descriptors[0].detailed_metric: want true or false, got a list`,
	}},

	{"wrong shapes", `domain: [x]
descriptors:
  key: a
`, []string{
		`bad.yaml:1: domain: want a string, got a list`,
		`bad.yaml:3: descriptors: want a list, got a mapping`,
	}},

	{"share_threshold without a pattern", `domain: x
descriptors:
  - key: a
    value: b
    share_threshold: true
    rate_limit: {unit: second, requests_per_unit: 1}
`, []string{`bad.yaml:5: descriptors[0].share_threshold: needs a wildcard value (containing '*'), a value_prefix or a value_regex: it makes every value the pattern matches share one limit`}},

	{"elastic", `domain: x
descriptors:
  - key: a
    rate_limit:
      unit: second
      requests_per_unit: 1
      mode: elastic
  - key: b
    rate_limit:
      unit: second
      requests_per_unit: 1
      elastic_ceiling: 5
`, []string{
		`bad.yaml:7: descriptors[0].rate_limit.mode: elastic mode needs a live spare-capacity signal, which a rules file cannot give: floodgate proxy gives its server throttler's (--throttle-max-inflight or --throttle-adaptive), Go code rules.Options.Spare; else use hard or soft`,
		`bad.yaml:12: descriptors[1].rate_limit.elastic_ceiling: elastic mode needs a live spare-capacity signal, which a rules file cannot give: floodgate proxy gives its server throttler's (--throttle-max-inflight or --throttle-adaptive), Go code rules.Options.Spare; else use hard or soft`,
	}},

	{"engine errors at their lines", `domain: x
descriptors:
  - key: a
    rate_limit:
      unit: second
      requests_per_unit: 1
      burst: 5
  - key: b
    rate_limit:
      algorithm: sliding_subwindow
      unit: hour
      requests_per_unit: 1
  - key: c
    rate_limit:
      algorithm: leaky
      unit: hour
      requests_per_unit: 1
  - key: d
    rate_limit:
      algorithm: sliding_log
      unit: hour
      requests_per_unit: 20000
  - key: e
    rate_limit:
      algorithm: sliding_subwindow
      window: 1h
      granularity: 7m
      requests_per_unit: 5
  - key: f
    rate_limit:
      unit: hour
      requests_per_unit: 5
      refill: interval
  - key: g
    rate_limit:
      unit: hour
      requests_per_unit: 5
      count_rejected: true
`, []string{
		`bad.yaml:7: descriptors[0].rate_limit.burst: only bucket algorithms have a burst apart from the limit`,
		`bad.yaml:10: descriptors[1].rate_limit.granularity: must be set for sliding_subwindow`,
		`bad.yaml:15: descriptors[2].rate_limit.algorithm: unknown algorithm "leaky"`,
		`bad.yaml:22: descriptors[3].rate_limit.requests_per_unit: a sliding_log keeps one timestamp per request and is capped at 10000; use sliding_window or sliding_subwindow for larger limits`,
		`bad.yaml:27: descriptors[4].rate_limit.granularity: must divide the period`,
		`bad.yaml:33: descriptors[5].rate_limit.refill: only token_bucket has a refill style`,
		`bad.yaml:38: descriptors[6].rate_limit.count_rejected: only sliding_log counts rejected requests`,
	}},

	{"windows", `domain: x
descriptors:
  - key: a
    rate_limit: {window: 90, requests_per_unit: 1}
  - key: b
    rate_limit: {window: -5s, requests_per_unit: 1}
  - key: c
    rate_limit: {window: 1m, unit: minute, requests_per_unit: 1}
  - key: d
    rate_limit: {calendar: fortnight, requests_per_unit: 1}
  - key: e
    rate_limit: {calendar: month, time_zone: Mars/Olympus, requests_per_unit: 1}
  - key: f
    rate_limit: {unit: day, time_zone: UTC, requests_per_unit: 1}
  - key: g
    rate_limit: {calendar: day, week_start: monday, requests_per_unit: 1}
  - key: h
    rate_limit: {calendar: day, algorithm: token_bucket, requests_per_unit: 1}
  - key: i
    rate_limit: {window: 1ns, requests_per_unit: 1}
`, []string{
		`bad.yaml:4: descriptors[0].rate_limit.window: want a positive duration such as "90s", "15m" or "36h", got "90"`,
		`bad.yaml:6: descriptors[1].rate_limit.window: want a positive duration such as "90s", "15m" or "36h", got "-5s"`,
		`bad.yaml:8: descriptors[2].rate_limit.window: give unit or window, not both`,
		`bad.yaml:10: descriptors[3].rate_limit.calendar: unknown calendar "fortnight" (want day, week or month)`,
		`bad.yaml:12: descriptors[4].rate_limit.time_zone: unknown time zone "Mars/Olympus" (want an IANA name such as Europe/Paris, or UTC)`,
		`bad.yaml:14: descriptors[5].rate_limit.time_zone: only calendar windows have a time zone`,
		`bad.yaml:16: descriptors[6].rate_limit.week_start: only calendar: week windows have a first weekday`,
		`bad.yaml:18: descriptors[7].rate_limit.calendar: only fixed_window windows follow the calendar`,
		`bad.yaml:20: descriptors[8].rate_limit.window: must be at least 1µs, got 1ns`,
	}},

	{"modes and failure modes", `domain: x
failure_mode: sideways
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 1, mode: soft}
  - key: b
    rate_limit: {unit: second, requests_per_unit: 1, soft_percent: 5}
  - key: c
    rate_limit: {unit: second, requests_per_unit: 1, failure_mode: local}
  - key: d
    rate_limit: {unit: second, requests_per_unit: 1, local_percent: 5}
  - key: e
    rate_limit: {unit: second, requests_per_unit: 1, failure_mode: local, local_percent: 500}
  - key: f
    rate_limit: {unit: second, requests_per_unit: 1, mode: gentle}
`, []string{
		`bad.yaml:2: failure_mode: unknown failure mode "sideways" (want open, closed or local)`,
		`bad.yaml:5: descriptors[0].rate_limit.mode: soft needs soft_percent: how far beyond the limit to admit, in percent`,
		`bad.yaml:7: descriptors[1].rate_limit.soft_percent: needs mode: soft`,
		`bad.yaml:9: descriptors[2].rate_limit.failure_mode: local needs local_percent (1 to 100): the share of the limit each instance allows on its own`,
		`bad.yaml:11: descriptors[3].rate_limit.local_percent: needs failure_mode: local`,
		`bad.yaml:13: descriptors[4].rate_limit.local_percent: 500 is out of range (1 to 100)`,
		`bad.yaml:15: descriptors[5].rate_limit.mode: unknown mode "gentle" (want hard, soft or elastic)`,
	}},

	{"tiers", `domain: x
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 1, tier: nearby}
  - key: b
    rate_limit: {unit: second, requests_per_unit: 1, tier: write_back}
  - key: c
    rate_limit: {unit: second, requests_per_unit: 1, budget: 1%}
  - key: d
    rate_limit: {unit: second, requests_per_unit: 1, tier: local_share, budget: 1%}
  - key: e
    rate_limit: {unit: second, requests_per_unit: 1, tier: write_back, budget: 60%}
  - key: f
    rate_limit: {unit: second, requests_per_unit: 1, tier: write_back, budget: 0%}
  - key: g
    rate_limit: {unit: second, requests_per_unit: 1, tier: write_back, budget: 0.01}
  - key: h
    rate_limit: {unit: second, requests_per_unit: 1, tier: write_back, budget: [1]}
  - key: i
    rate_limit: {unit: second, requests_per_unit: 1, tier: local_share, algorithm: token_bucket}
  - key: j
    rate_limit: {calendar: day, requests_per_unit: 1, tier: local_share}
  - key: k
    rate_limit: {unit: second, requests_per_unit: 1, tier: 5}
  - key: l
    rate_limit: {unit: second, requests_per_unit: 1, tier: local_share, mode: soft, soft_percent: 10}
`, []string{
		`bad.yaml:4: descriptors[0].rate_limit.tier: unknown tier "nearby" (want exact, local_share or write_back)`,
		`bad.yaml:6: descriptors[1].rate_limit.tier: write_back needs budget: the overshoot accepted, as a percentage of the limit such as 1%`,
		`bad.yaml:8: descriptors[2].rate_limit.budget: needs tier: write_back`,
		`bad.yaml:10: descriptors[3].rate_limit.budget: needs tier: write_back`,
		`bad.yaml:12: descriptors[4].rate_limit.budget: 60% is out of range (above 0% and at most 50%)`,
		`bad.yaml:14: descriptors[5].rate_limit.budget: 0% is out of range (above 0% and at most 50%)`,
		`bad.yaml:16: descriptors[6].rate_limit.budget: want a percentage of the limit such as 1%, got "0.01"`,
		`bad.yaml:18: descriptors[7].rate_limit.budget: want a percentage of the limit such as 1%, got a list`,
		`bad.yaml:20: descriptors[8].rate_limit.tier: local_share needs algorithm fixed_window with a period (a slice is a number of requests of the current window); use exact or write_back`,
		`bad.yaml:22: descriptors[9].rate_limit.tier: local_share needs algorithm fixed_window with a period (a slice is a number of requests of the current window); use exact or write_back`,
		`bad.yaml:24: descriptors[10].rate_limit.tier: unknown tier "5" (want exact, local_share or write_back)`,
		`bad.yaml:26: descriptors[11].rate_limit.tier: local_share needs mode hard`,
	}},

	{"domain failure defaults", `domain: x
failure_mode: local
descriptors: []
`, []string{`bad.yaml:2: failure_mode: local needs local_percent (1 to 100): the share of the limit each instance allows on its own`}},

	{"value matchers", `domain: x
descriptors:
  - key: a
    value: b
    value_prefix: c
  - key: b
    value_regex: "(unclosed"
  - key: c
    value_prefix: ""
  - key: d
    value: b
    exempt_values: [x]
  - key: e
    value_prefix: "p-"
    exempt_values: ["q-1"]
  - key: f
    exempt: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: g
    value: v
  - key: g
    exempt_values: [v]
`, []string{
		`bad.yaml:3: descriptors[0]: value, value_prefix and value_regex exclude each other`,
		`bad.yaml:7: descriptors[1].value_regex: invalid RE2 regular expression: missing closing ): ` + "`^(?:(unclosed)$`",
		`bad.yaml:9: descriptors[2].value_prefix: must not be empty (a descriptor without a value matches every value)`,
		`bad.yaml:12: descriptors[3].exempt_values: needs a descriptor that matches many values (no value, a wildcard, value_prefix or value_regex)`,
		`bad.yaml:15: descriptors[4].exempt_values[0]: "q-1" does not match this descriptor's value_prefix`,
		`bad.yaml:18: descriptors[5].rate_limit: an exempt descriptor is never limited: it cannot have rate_limit`,
		`bad.yaml:22: descriptors[7].exempt_values[0]: duplicate descriptor: key "g" value "v" is already defined at line 19`,
	}},

	{"rate_limits", `domain: x
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 1}
    rate_limits:
      - {unit: second, requests_per_unit: 1}
  - key: b
    rate_limits: []
  - key: c
    rate_limits:
      - {unit: second, requests_per_unit: 1}
      - {unit: minute, requests_per_unit: 5, replaces: [{name: z}]}
  - key: d
    rate_limits:
      - {name: same, unit: second, requests_per_unit: 1}
      - {name: same, unit: minute, requests_per_unit: 5}
  - key: e
    rate_limits:
      - {unit: second, requests_per_unit: 0}
  - key: f
    rate_limits:
      - {unlimited: true}
`, []string{
		`bad.yaml:5: descriptors[0].rate_limits: give rate_limit or rate_limits, not both`,
		`bad.yaml:8: descriptors[1].rate_limits: an empty list: give at least one rule`,
		`bad.yaml:12: descriptors[2].rate_limits[1].replaces: belongs in the first entry of rate_limits (its name and replaces name the whole limit)`,
		`bad.yaml:16: descriptors[3].rate_limits[1].name: duplicate rule name "same"`,
		`bad.yaml:19: descriptors[4].rate_limits[0].requests_per_unit: must be positive in rate_limits (a single rate_limit with requests_per_unit: 0 blocks every request)`,
		`bad.yaml:22: descriptors[5].rate_limits[0].unlimited: an unlimited descriptor has a single rate_limit`,
	}},

	{"metadata", `domain: x
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 1}
    metadata:
      weight: .nan
  - key: b
    rate_limit: {unit: second, requests_per_unit: 1}
    metadata: [1, 2]
`, []string{
		`bad.yaml:6: descriptors[0].metadata.weight: NaN and infinities cannot be sent as metadata`,
		`bad.yaml:9: descriptors[1].metadata: want a mapping, got a list`,
	}},
}

func TestParseErrors(t *testing.T) {
	for _, tt := range parseErrorTests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := Parse("bad.yaml", []byte(tt.src))
			if err == nil {
				t.Fatalf("parsed, domain %q; want errors", d.Name)
			}
			if d != nil {
				t.Errorf("a domain with errors")
			}
			got := strings.Split(err.Error(), "\n")
			if strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
				t.Errorf("errors:\n%s\nwant:\n%s", err, strings.Join(tt.want, "\n"))
			}
			var list interface{ Unwrap() []error }
			if !errors.As(err, &list) {
				t.Fatalf("not a joined error: %T", err)
			}
			for _, e := range list.Unwrap() {
				var pe *Error
				if !errors.As(e, &pe) || pe.File != "bad.yaml" {
					t.Errorf("%v is not a *rules.Error of bad.yaml", e)
				}
			}
		})
	}
}

func TestHostileInput(t *testing.T) {
	// Too large.
	_, err := Parse("big.yaml", make([]byte, MaxFileSize+1))
	if err == nil || !strings.Contains(err.Error(), "big.yaml: file is 4194305 bytes; at most 4194304") {
		t.Errorf("big file: %v", err)
	}
	// Too deep.
	var b strings.Builder
	b.WriteString("domain: deep\ndescriptors:\n")
	for i := 0; i < MaxDepth+1; i++ {
		ind := strings.Repeat("  ", 2*i)
		b.WriteString(ind + "- key: k\n" + ind + "  descriptors:\n")
	}
	_, err = Parse("deep.yaml", []byte(b.String()))
	if err == nil || !strings.Contains(err.Error(), "descriptors nest deeper than 32 levels") {
		t.Errorf("deep: %v", err)
	}
	// Exactly MaxDepth levels load, and match a request of that depth.
	b.Reset()
	b.WriteString("domain: deep\ndescriptors:\n")
	var entries []Entry
	for i := 0; i < MaxDepth; i++ {
		ind := strings.Repeat("  ", 2*i)
		b.WriteString(ind + "- key: k\n")
		if i < MaxDepth-1 {
			b.WriteString(ind + "  descriptors:\n")
		} else {
			b.WriteString(ind + "  rate_limit: {unit: second, requests_per_unit: 1}\n")
		}
		entries = append(entries, Entry{"k", "v"})
	}
	d, err := Parse("deep.yaml", []byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	c, _ := NewConfig(d)
	if c.Match("deep", entries) == nil || c.Match("deep", append(entries, Entry{"k", "v"})) != nil {
		t.Error("deep match")
	}
	// Too many descriptors (and YAML nodes), with the limits lowered so the
	// test stays fast.
	defer func(d, n int) { maxDescriptors, maxYAMLNodes = d, n }(maxDescriptors, maxYAMLNodes)
	maxDescriptors, maxYAMLNodes = 500, 20000
	b.Reset()
	b.WriteString("domain: many\ndescriptors:\n")
	for i := 0; i <= maxDescriptors; i++ {
		fmt.Fprintf(&b, "- key: k\n  value: v%d\n", i)
	}
	_, err = Parse("many.yaml", []byte(b.String()))
	if err == nil || !strings.Contains(err.Error(), "many.yaml:1003: descriptors[500]: more than 500 descriptors in one file") {
		t.Errorf("many: %.300v", err)
	}
	// A billion laughs: aliases expanding exponentially.
	src := "domain: lol\na0: &a0 [x, x, x, x, x, x, x, x, x, x]\n"
	for i := 1; i < 6; i++ {
		src += "a" + string(rune('0'+i)) + ": &a" + string(rune('0'+i)) + " [" + strings.Repeat("*a"+string(rune('0'+i-1))+", ", 9) + "*a" + string(rune('0'+i-1)) + "]\n"
	}
	src += "descriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n    metadata: {x: *a5}\n"
	_, err = Parse("lol.yaml", []byte(src))
	if err == nil || !strings.Contains(err.Error(), "metadata is more than 16384 bytes once aliases are expanded") {
		t.Errorf("laughs in metadata: %v", err)
	}
	// With a larger metadata allowance, the node budget stops it.
	defer func(m int) { maxMetadata = m }(maxMetadata)
	maxMetadata = 1 << 30
	_, err = Parse("lol.yaml", []byte(src))
	if err == nil || !strings.Contains(err.Error(), "the file expands (aliases included) to more than 20000 YAML nodes") {
		t.Errorf("laughs: %v", err)
	}
	// A recursive alias.
	_, err = Parse("rec.yaml", []byte("domain: r\ndescriptors: &d\n  - key: k\n    descriptors: *d\n"))
	if err == nil {
		t.Error("recursive alias accepted")
	}
	// A long regex.
	_, err = Parse("re.yaml", []byte("domain: r\ndescriptors:\n  - key: k\n    value_regex: \""+strings.Repeat("a", MaxRegexLen+1)+"\"\n"))
	if err == nil || !strings.Contains(err.Error(), "re.yaml:4: descriptors[0].value_regex: is 1025 bytes long; at most 1024") {
		t.Errorf("regex: %v", err)
	}
	// Many errors are capped.
	b.Reset()
	b.WriteString("domain: errs\ndescriptors:\n")
	for i := 0; i < 200; i++ {
		b.WriteString("- nokey: 1\n")
	}
	_, err = Parse("errs.yaml", []byte(b.String()))
	if err == nil || !strings.HasSuffix(err.Error(), "errs.yaml: 350 more errors not shown") {
		t.Errorf("many errors: ...%s", err.Error()[max(0, len(err.Error())-200):])
	}
}

func TestLoadDir(t *testing.T) {
	dir := t.TempDir()
	write := func(name, src string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a.yaml", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	write("b.yml", "domain: b\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")
	write("c.yaml", "domain: a\n")
	write("d.yml", "domain: d\n")
	write(".hidden.yaml", "domain: [broken\n")
	write("notes.txt", "domain: [broken\n")
	if err := os.Mkdir(filepath.Join(dir, "sub.yaml"), 0o755); err != nil {
		t.Fatal(err)
	}
	write("sub.yaml/e.yaml", "domain: e\n")
	write("huge.yaml", "domain: h\n"+strings.Repeat("#", MaxFileSize))

	c, errs := LoadDir(dir)
	var msgs []string
	for _, e := range errs {
		msgs = append(msgs, e.Error())
	}
	want := []string{
		filepath.Join(dir, "b.yml") + `:4: descriptors[0].rate_limit.unit: unknown unit "fortnight" (want second, minute, hour, day, week, month or year)`,
		filepath.Join(dir, "c.yaml") + `: domain: domain "a" is already defined in ` + filepath.Join(dir, "a.yaml") + `; a domain lives in one file`,
		filepath.Join(dir, "huge.yaml") + `: file is 4194314 bytes; at most 4194304`,
	}
	if strings.Join(msgs, "\n") != strings.Join(want, "\n") {
		t.Errorf("errors:\n%s\nwant:\n%s", strings.Join(msgs, "\n"), strings.Join(want, "\n"))
	}
	var names []string
	for _, d := range c.Domains() {
		names = append(names, d.Name)
	}
	if strings.Join(names, ",") != "a,d" {
		t.Errorf("domains %v", names)
	}
	if c.Match("a", es("k", "v")) == nil {
		t.Error("a.yaml not live")
	}

	c, errs = LoadDir(filepath.Join(dir, "missing"))
	if c == nil || len(errs) != 1 || len(c.Domains()) != 0 {
		t.Errorf("missing dir: %v %v", c, errs)
	}
}

// What a file's regular expressions and metadata cost is bounded: a
// value_regex whose program is large (counted repetitions) is refused
// before it is fully compiled, so are regexes beyond the file's budget,
// and a limit's metadata may not expand (through aliases) past
// MaxMetadata, since every matching response carries it.
func TestBoundedRegexAndMetadata(t *testing.T) {
	head := "domain: r\ndescriptors:\n"
	_, err := Parse("big.yaml", []byte(head+"  - key: k\n    value_regex: '(?:[a-z]{1,30}){1,30}N'\n    rate_limit: {unit: second, requests_per_unit: 1}\n"))
	if err == nil || !strings.Contains(err.Error(), "big.yaml:4: descriptors[0].value_regex: compiles to") {
		t.Errorf("a large regex: %v", err)
	}
	// Regexes of 63 instructions each: the file's budget takes 63 of them.
	var b strings.Builder
	b.WriteString(head)
	for i := range 70 {
		fmt.Fprintf(&b, "  - key: k\n    value_regex: '[a-z]{1,30}%d'\n    rate_limit: {unit: second, requests_per_unit: 1}\n", i)
	}
	_, err = Parse("many.yaml", []byte(b.String()))
	if err == nil || !strings.Contains(err.Error(), "compile to more than 4000 instructions in all") {
		t.Errorf("many regexes: %.300v", err)
	}
	// Ordinary regexes load.
	d, err := Parse("ok.yaml", []byte(head+"  - key: path\n    value_regex: '/api/v[0-9]+/users/[0-9]+'\n    rate_limit: {unit: second, requests_per_unit: 1}\n"))
	if err != nil {
		t.Fatal(err)
	}
	c, _ := NewConfig(d)
	if c.Match("r", []Entry{{"path", "/api/v2/users/17"}}) == nil {
		t.Error("the regex does not match")
	}
	// A 421-byte file whose metadata expands to megabytes.
	src := "domain: m\nx0: &x0 [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\n"
	for i := 1; i <= 5; i++ {
		src += fmt.Sprintf("x%d: &x%d [%s*x%d]\n", i, i, strings.Repeat(fmt.Sprintf("*x%d, ", i-1), 9), i-1)
	}
	src += "descriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n    metadata: {m: *x3}\n"
	_, err = Parse("meta.yaml", []byte(src))
	if err == nil || !strings.Contains(err.Error(), "metadata is more than 16384 bytes") {
		t.Errorf("metadata bomb: %v", err)
	}
	// Metadata of a few kilobytes loads.
	if _, err := Parse("meta.yaml", []byte("domain: m\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n    metadata: {team: payments, tags: [a, b, c], note: '"+strings.Repeat("n", 4000)+"'}\n")); err != nil {
		t.Errorf("ordinary metadata: %v", err)
	}
}

// Bytes that are no UTF-8 text are reported with their line, which the
// YAML parser does not give.
func TestBadBytesHaveALine(t *testing.T) {
	for name, src := range map[string]string{
		"latin1": "domain: d\ndescriptors:\n  - key: k\n    value: caf\xe9\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
		"nul":    "domain: d\ndescriptors:\n  - key: k\x00\n",
	} {
		_, err := Parse(name+".yaml", []byte(src))
		want := map[string]string{"latin1": name + ".yaml:4: ", "nul": name + ".yaml:3: "}[name]
		if err == nil || !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), "UTF-8") {
			t.Errorf("%s: %v, want an error starting %q", name, err, want)
		}
	}
}

// time_zone: Local would make one file mean different days on different
// hosts; it is refused like an unknown zone.
func TestLocalTimeZoneRefused(t *testing.T) {
	_, err := Parse("tz.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {calendar: day, time_zone: Local, requests_per_unit: 1}\n"))
	if err == nil || !strings.Contains(err.Error(), `tz.yaml:4: descriptors[0].rate_limit.time_zone: unknown time zone "Local"`) {
		t.Fatalf("Local: %v", err)
	}
}

// A bucket whose burst is what takes it past the engine's exact arithmetic
// is reported at its burst, not at requests_per_unit.
func TestBurstTooLargeNamesBurst(t *testing.T) {
	_, err := Parse("b.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: hour\n      requests_per_unit: 10\n      algorithm: token_bucket\n      burst: 99999999999\n"))
	if err == nil || !strings.Contains(err.Error(), "b.yaml:8: descriptors[0].rate_limit.burst: ") {
		t.Fatalf("%v", err)
	}
}

package rules

import (
	"encoding/json"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/storekit"
)

func mustParse(t *testing.T, src string) *Domain {
	t.Helper()
	d, err := Parse("t.yaml", []byte(src))
	if err != nil {
		t.Fatalf("Parse:\n%v\nof:\n%s", err, src)
	}
	return d
}

func mustConfig(t *testing.T, src string) *Config {
	t.Helper()
	c, err := NewConfig(mustParse(t, src))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestEngineParameters(t *testing.T) {
	c := mustConfig(t, `
domain: eng
failure_mode: closed
descriptors:
  - key: tb
    rate_limit:
      unit: second
      requests_per_unit: 5
      algorithm: token_bucket
      burst: 20
      refill: interval
  - key: odd
    rate_limit:
      window: 90s
      requests_per_unit: 7
      algorithm: gcra
  - key: sub
    rate_limit:
      window: 1h
      granularity: 1m
      requests_per_unit: 600
      algorithm: sliding_subwindow
  - key: cal
    rate_limit:
      calendar: week
      time_zone: Europe/Paris
      week_start: monday
      requests_per_unit: 1000
  - key: soft
    rate_limit:
      unit: minute
      requests_per_unit: 100
      algorithm: sliding_window
      mode: soft
      soft_percent: 10
  - key: log
    rate_limit:
      unit: minute
      requests_per_unit: 3
      algorithm: sliding_log
      count_rejected: true
      failure_mode: local
      local_percent: 25
  - key: open
    rate_limit:
      unit: minute
      requests_per_unit: 3
      failure_mode: open
`)
	rule := func(key string) (floodgate.Rule, *Limit) {
		m := c.Match("eng", es(key, "v"))
		if m == nil {
			t.Fatalf("%s: no match", key)
		}
		return m.Limit.Policy.Rules()[0], m.Limit
	}
	r, l := rule("tb")
	if r.Algorithm != floodgate.TokenBucket || r.Limit != 5 || r.Burst != 20 || r.Period != time.Second || r.Refill != floodgate.RefillInterval || r.OnStoreFailure != floodgate.FailClosed {
		t.Errorf("tb: %+v", r)
	}
	if l.Unit != "second" || l.RequestsPerUnit != 5 {
		t.Errorf("tb limit: %s %d", l.Unit, l.RequestsPerUnit)
	}
	r, l = rule("odd")
	if r.Algorithm != floodgate.GCRA || r.Period != 90*time.Second || l.Unit != "" || l.Window != 90*time.Second || l.MultipliedUnit != "second" || l.UnitMultiplier != 90 {
		t.Errorf("odd: %+v %+v", r, l)
	}
	r, l = rule("sub")
	if r.Algorithm != floodgate.SlidingSubwindow || r.Granularity != time.Minute || l.Unit != "hour" {
		t.Errorf("sub: %+v unit %q", r, l.Unit)
	}
	r, l = rule("cal")
	if r.Calendar != floodgate.CalendarWeek || r.Location == nil || r.Location.String() != "Europe/Paris" || r.WeekStart != time.Monday || r.Algorithm != floodgate.FixedWindow {
		t.Errorf("cal: %+v", r)
	}
	if l.Unit != "" || l.MultipliedUnit != "" || l.Window != 7*24*time.Hour {
		t.Errorf("cal limit: unit %q %q window %v", l.Unit, l.MultipliedUnit, l.Window)
	}
	r, _ = rule("soft")
	if r.Mode != floodgate.Soft || r.SoftPercent != 10 || r.Algorithm != floodgate.SlidingWindow {
		t.Errorf("soft: %+v", r)
	}
	r, _ = rule("log")
	if !r.CountRejected || r.OnStoreFailure != floodgate.FailLocal || r.LocalPercent != 25 {
		t.Errorf("log: %+v", r)
	}
	r, _ = rule("open")
	if r.OnStoreFailure != floodgate.FailOpen {
		t.Errorf("open: %+v", r)
	}
}

func TestSeveralRules(t *testing.T) {
	c := mustConfig(t, `
domain: multi
all_or_nothing: true
descriptors:
  - key: user
    rate_limits:
      - name: per_second
        unit: second
        requests_per_unit: 10
        replaces: [{name: old}]
      - unit: minute
        requests_per_unit: 100
        algorithm: sliding_window
      - unit: minute
        requests_per_unit: 150
        algorithm: token_bucket
`)
	if !c.Domain("multi").AllOrNothing {
		t.Error("all_or_nothing lost")
	}
	l := c.Match("multi", es("user", "u")).Limit
	rs := l.Policy.Rules()
	if len(rs) != 3 || rs[0].Name != "per_second" || rs[1].Name != "minute" || rs[2].Name != "minute#2" {
		t.Fatalf("rules %+v", rs)
	}
	if l.Name != "per_second" || !l.NameGiven || len(l.Replaces) != 1 || l.Unit != "second" || l.RequestsPerUnit != 10 {
		t.Errorf("limit %+v", l)
	}
	// All or nothing within the descriptor: the 11th request in a second
	// is denied and consumes nothing from the minute rules.
	state := make([]int64, storekit.Width(l.Policy))
	now := int64(1e15)
	for i := 0; i < 10; i++ {
		if d := storekit.Apply(l.Policy, state, now, floodgate.Op{Kind: floodgate.OpAllow, Cost: 1}); !d.Allowed {
			t.Fatalf("request %d denied", i)
		}
	}
	if d := storekit.Apply(l.Policy, state, now, floodgate.Op{Kind: floodgate.OpAllow, Cost: 1}); d.Allowed || d.Rule != "per_second" {
		t.Errorf("11th: %+v", d)
	}
}

func TestValueMatching(t *testing.T) {
	c := mustConfig(t, `
domain: m
descriptors:
  - key: path
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: path
    value: "/api/*"
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: path
    value_regex: "/api/v[0-9]+/.*"
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: path
    value_prefix: /api/
    rate_limit: {unit: second, requests_per_unit: 4}
  - key: path
    value_prefix: /api/v1/admin
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: path
    value: /api/v1/health
    rate_limit: {unit: second, requests_per_unit: 6}
  - key: host
    value_regex: "a.c"
    rate_limit: {unit: second, requests_per_unit: 7}
  - key: host
    value_regex: "a.*"
    rate_limit: {unit: second, requests_per_unit: 8}
`)
	for _, tt := range []struct {
		entries []Entry
		rpu     int64
	}{
		{es("path", "/api/v1/health"), 6},      // exact first
		{es("path", "/api/v1/admin/users"), 5}, // then the longest prefix
		{es("path", "/api/v1/users"), 4},       // a prefix before a regex
		{es("path", "/apiv1"), 1},              // nothing but the key
		{es("path", "/other"), 1},              //
		{es("host", "abc"), 7},                 // regexes in file order, anchored
		{es("host", "abcd"), 8},                //
		{es("host", "xabc"), none},             // anchored at the start
		{es("path", "/api/v1/health", "x", "y"), none},
	} {
		checkMatch(t, c, "m", tt.entries, want{rpu: tt.rpu, unit: "second"})
	}
	c = mustConfig(t, `
domain: m
descriptors:
  - key: path
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: path
    value: "/a*"
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: path
    value_regex: "/ab.*"
    rate_limit: {unit: second, requests_per_unit: 3}
`)
	checkMatch(t, c, "m", es("path", "/abc"), want{rpu: 3, unit: "second"}) // a regex before a wildcard
	checkMatch(t, c, "m", es("path", "/ax"), want{rpu: 2, unit: "second"})
	checkMatch(t, c, "m", es("path", "/b"), want{rpu: 1, unit: "second"})
}

// TestNoBacktracking: as in envoyproxy/ratelimit, the walk commits to the
// best node at each level.
func TestNoBacktracking(t *testing.T) {
	c := mustConfig(t, `
domain: b
descriptors:
  - key: a
    value: "1"
    descriptors:
      - key: b
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: a
    descriptors:
      - key: c
        rate_limit: {unit: second, requests_per_unit: 2}
`)
	checkMatch(t, c, "b", es("a", "1", "b", "x"), want{rpu: 1, unit: "second"})
	checkMatch(t, c, "b", es("a", "2", "c", "x"), want{rpu: 2, unit: "second"})
	checkMatch(t, c, "b", es("a", "1", "c", "x"), want{rpu: none})
}

func TestExempt(t *testing.T) {
	c := mustConfig(t, `
domain: x
descriptors:
  - key: remote_address
    exempt_values: ["127.0.0.1", "10.0.0.1"]
    rate_limit: {unit: second, requests_per_unit: 10}
    descriptors:
      - key: path
        rate_limit: {unit: second, requests_per_unit: 5}
  - key: user
    value_prefix: "bot-"
    exempt_values: ["bot-trusted"]
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: user
    value_regex: "admin-[0-9]+"
    exempt: true
  - key: user
    rate_limit: {unit: second, requests_per_unit: 100}
`)
	checkMatch(t, c, "x", es("remote_address", "1.2.3.4"), want{rpu: 10, unit: "second"})
	checkMatch(t, c, "x", es("remote_address", "127.0.0.1"), want{rpu: none})
	checkMatch(t, c, "x", es("remote_address", "10.0.0.1", "path", "/"), want{rpu: none})
	checkMatch(t, c, "x", es("remote_address", "1.2.3.4", "path", "/"), want{rpu: 5, unit: "second"})
	checkMatch(t, c, "x", es("user", "bot-1"), want{rpu: 1, unit: "second"})
	checkMatch(t, c, "x", es("user", "bot-trusted"), want{rpu: none})
	checkMatch(t, c, "x", es("user", "admin-7"), want{rpu: none})
	checkMatch(t, c, "x", es("user", "admin-x"), want{rpu: 100, unit: "second"})
	j, err := c.JSON()
	if err != nil || !strings.Contains(string(j), `"127.0.0.1"`) || !strings.Contains(string(j), `"exempt": true`) {
		t.Errorf("JSON: %v\n%s", err, j)
	}
}

func TestShareThresholdPatterns(t *testing.T) {
	c := mustConfig(t, `
domain: s
descriptors:
  - key: model
    value_prefix: "gpt-"
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: model
    value_regex: "claude-.*"
    share_threshold: true
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: model
    rate_limit: {unit: minute, requests_per_unit: 30}
`)
	a := c.Match("s", es("model", "gpt-4"))
	b := c.Match("s", es("model", "gpt-5"))
	if a.Key != b.Key || a.Key != "model=*gpt-" {
		t.Errorf("prefix share: %q %q", a.Key, b.Key)
	}
	x := c.Match("s", es("model", "claude-1"))
	if x.Key != "model=*claude-.%2A" || x.StatKey != "s.model_~claude-.*" {
		t.Errorf("regex share: %q %q", x.Key, x.StatKey)
	}
	// A value that is literally the shared key's text still gets its own.
	y := c.Match("s", es("model", "*gpt-"))
	if y.Key == a.Key || y.Limit == a.Limit {
		t.Errorf("literal %q collides with the shared counter", y.Key)
	}
}

func TestKeysAreUnambiguous(t *testing.T) {
	c := mustConfig(t, `
domain: k
descriptors:
  - key: a
    descriptors:
      - key: b
        rate_limit: {unit: second, requests_per_unit: 1}
`)
	keys := map[string][]Entry{}
	for _, e := range [][]Entry{
		es("a", "x|b=y", "b", "z"),
		es("a", "x", "b", "y|b=z"),
		es("a", "x=", "b", "y"),
		es("a", "x", "b", "=y"),
		es("a", "%3D", "b", "y"),
		es("a", "=", "b", "y"),
		es("a", "", "b", ""),
	} {
		m := c.Match("k", e)
		if m == nil {
			t.Fatalf("%v: no match", e)
		}
		if prev, ok := keys[m.Key]; ok {
			t.Errorf("%v and %v share key %q", prev, e, m.Key)
		}
		keys[m.Key] = e
	}
}

func TestDerivedNames(t *testing.T) {
	d := mustParse(t, `
domain: a.b
descriptors:
  - key: x_y
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: x
    value: y
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: plain
    descriptors:
      - key: sub
        value: v
        rate_limit: {unit: second, requests_per_unit: 3}
`)
	ls := d.Limits()
	if ls[0].Name == ls[1].Name {
		t.Errorf("two paths share the name %q", ls[0].Name)
	}
	if ls[2].Name != "a%2Eb.plain.sub_v" {
		t.Errorf("name %q", ls[2].Name)
	}
	if ls[0].Policy.Name() == ls[1].Policy.Name() {
		t.Errorf("two paths share the policy %q", ls[0].Policy.Name())
	}
	// Long paths get a hashed policy name, still distinct.
	long := strings.Repeat("v", 300)
	d = mustParse(t, "domain: d\ndescriptors:\n- key: k\n  value: "+long+"1\n  rate_limit: {unit: second, requests_per_unit: 1}\n- key: k\n  value: "+long+"2\n  rate_limit: {unit: second, requests_per_unit: 1}\n")
	n1, n2 := d.Limits()[0].Policy.Name(), d.Limits()[1].Policy.Name()
	if n1 == n2 || len(n1) > 200 {
		t.Errorf("long names %q %q", n1, n2)
	}
}

func TestBlocked(t *testing.T) {
	c := mustConfig(t, "domain: d\ndescriptors:\n- key: ip\n  value: 1.2.3.4\n  rate_limit: {unit: minute, requests_per_unit: 0}\n")
	l := c.Match("d", es("ip", "1.2.3.4")).Limit
	if !l.Blocked || l.RequestsPerUnit != 0 || l.Policy == nil || l.Unit != "minute" {
		t.Errorf("blocked limit %+v", l)
	}
}

func TestConfigAPI(t *testing.T) {
	a := mustParse(t, "domain: a\n")
	b := mustParse(t, "domain: b\ndescriptors: []\n")
	a2 := mustParse(t, "domain: a\n")
	c, err := NewConfig(b, a)
	if err != nil {
		t.Fatal(err)
	}
	if c.Domain("a") != a || c.Domain("zz") != nil || len(c.Domains()) != 2 || c.Domains()[0] != a {
		t.Errorf("domains %v", c.Domains())
	}
	if _, err := NewConfig(a, a2); err == nil || !strings.Contains(err.Error(), `domain "a" is defined twice`) {
		t.Errorf("duplicate domains: %v", err)
	}
	if _, err := NewConfig(nil); err == nil {
		t.Error("nil domain accepted")
	}
	var nilc *Config
	if nilc.Match("a", es("k", "v")) != nil || nilc.Domain("a") != nil {
		t.Error("nil config matched")
	}
	j, err := nilc.JSON()
	if err != nil || string(j) != "{\n  \"domains\": []\n}" {
		t.Errorf("nil JSON %s %v", j, err)
	}
	c = loadEnvoy(t)
	j, err = c.JSON()
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Domains []struct {
			Domain      string
			Descriptors []map[string]any
		}
	}
	if err := json.Unmarshal(j, &v); err != nil || len(v.Domains) != 13 {
		t.Fatalf("JSON: %v %d", err, len(v.Domains))
	}
	if !strings.Contains(string(j), `"policy": "rules/test-domain/key1=value1/subkey1"`) {
		t.Errorf("JSON lacks a policy name:\n%s", j)
	}
}

func TestExampleFile(t *testing.T) {
	d, err := Parse("example.yaml", ExampleFile)
	if err != nil {
		t.Fatal(err)
	}
	if d.Name != "example" {
		t.Errorf("domain %q", d.Name)
	}
	c, _ := NewConfig(d)
	checkMatch(t, c, "example", es("remote_address", "192.0.2.1"), want{rpu: 10, unit: "second"})
	checkMatch(t, c, "example", es("remote_address", "127.0.0.1"), want{rpu: none})
	m := checkMatch(t, c, "example", es("user_id", "alice"), want{rpu: 100, unit: "minute", key: "user_id=alice"})
	if m != nil && len(m.Limit.Policy.Rules()) != 2 {
		t.Errorf("user limit has %d rules", len(m.Limit.Policy.Rules()))
	}
	e := Example()
	e[0] = 'X'
	if ExampleFile[0] == 'X' {
		t.Error("Example returned the shared bytes")
	}
}

func TestConcurrentMatch(t *testing.T) {
	c := loadEnvoy(t)
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 500; i++ {
				if m := c.Match("messaging", es("message_type", "marketing", "to_number", "1")); m == nil || m.Limit.RequestsPerUnit != 5 {
					t.Error("bad match")
					return
				}
				c.Match("shared", es("files", "files/x"))
			}
		}()
	}
	wg.Wait()
}

func BenchmarkMatch(b *testing.B) {
	c, _ := LoadDir("testdata/envoy")
	e := es("message_type", "marketing", "to_number", "2061111111")
	b.ReportAllocs()
	for b.Loop() {
		c.Match("messaging", e)
	}
}

// TestDocsExamples parses every complete rules file in docs/RULES.md.
func TestDocsExamples(t *testing.T) {
	doc, err := os.ReadFile("../docs/RULES.md")
	if err != nil {
		t.Skip("docs/RULES.md not found")
	}
	n := 0
	for _, block := range strings.Split(string(doc), "```yaml\n")[1:] {
		src, _, _ := strings.Cut(block, "```")
		if !strings.HasPrefix(src, "domain:") {
			continue
		}
		n++
		c := mustConfig(t, src)
		if n == 1 {
			checkMatch(t, c, "edge", es("remote_address", "192.0.2.7"), want{rpu: 10, unit: "second"})
			checkMatch(t, c, "edge", es("remote_address", "::1"), want{rpu: none})
			checkMatch(t, c, "edge", es("remote_address", "203.0.113.9"), want{rpu: 0, unit: "second", blocked: true})
			m := checkMatch(t, c, "edge", es("path", "/api/orders", "user_id", "alice"), want{rpu: 100, unit: "minute",
				key: "path=/api/orders|user_id=alice", stat: "edge.path_/api/*.user_id"})
			if m != nil && m.Limit.Policy.Name() != "rules/edge/path^=%2Fapi%2F/user_id" {
				t.Errorf("policy %q", m.Limit.Policy.Name())
			}
		}
	}
	if n == 0 {
		t.Error("no complete rules file in docs/RULES.md")
	}
}

func TestCalendarMonthOption(t *testing.T) {
	src := "domain: d\ndescriptors:\n- key: k\n  rate_limit: {unit: month, requests_per_unit: 1000}\n"
	plain, _ := Parse("t.yaml", []byte(src))
	cal, err := ParseWith("t.yaml", []byte(src), Options{CalendarMonth: true})
	if err != nil {
		t.Fatal(err)
	}
	p, c := plain.Limits()[0], cal.Limits()[0]
	if r := p.Policy.Rules()[0]; r.Calendar != "" || r.Period != 30*24*time.Hour {
		t.Errorf("default month: %+v", r)
	}
	if r := c.Policy.Rules()[0]; r.Calendar != floodgate.CalendarMonth || r.Location != time.UTC || r.Name != "month" {
		t.Errorf("calendar month: %+v", r)
	}
	if c.Unit != "month" || c.MultipliedUnit != "month" || c.UnitMultiplier != 1 || c.Window != 30*24*time.Hour {
		t.Errorf("calendar month limit: %q %q %d %v", c.Unit, c.MultipliedUnit, c.UnitMultiplier, c.Window)
	}
	_, err = ParseWith("t.yaml", []byte("domain: d\ndescriptors:\n- key: k\n  rate_limit: {unit: month, unit_multiplier: 2, requests_per_unit: 1}\n"), Options{CalendarMonth: true})
	if err == nil || err.Error() != "t.yaml:4: descriptors[0].rate_limit.unit_multiplier: calendar months (Options.CalendarMonth) cannot be multiplied" {
		t.Errorf("multiplied calendar month: %v", err)
	}
	dir := t.TempDir()
	os.WriteFile(dir+"/a.yaml", []byte(src), 0o644)
	cfg, errs := LoadDirWith(dir, Options{CalendarMonth: true})
	if len(errs) != 0 || cfg.Match("d", es("k", "x")).Limit.Policy.Rules()[0].Calendar != floodgate.CalendarMonth {
		t.Errorf("LoadDirWith: %v", errs)
	}
}

func TestTiers(t *testing.T) {
	c := mustConfig(t, `domain: eng
descriptors:
  - key: share
    rate_limit: {unit: second, requests_per_unit: 100, tier: local_share}
  - key: wb
    rate_limit: {unit: second, requests_per_unit: 100, tier: write_back, budget: 1.5%}
  - key: exact
    rate_limit: {unit: second, requests_per_unit: 100, tier: exact}
  - key: plain
    rate_limit: {unit: second, requests_per_unit: 100}
`)
	for key, want := range map[string]struct {
		tier   floodgate.Tier
		budget float64
	}{
		"share": {floodgate.TierLocalShare, 0}, "wb": {floodgate.TierWriteBack, 0.015},
		"exact": {floodgate.TierExact, 0}, "plain": {"", 0},
	} {
		m := c.Match("eng", es(key, "v"))
		if m == nil {
			t.Fatalf("%s: no match", key)
		}
		r := m.Limit.Policy.Rules()[0]
		if r.Tier != want.tier || r.Budget != want.budget {
			t.Errorf("%s: tier %q budget %g, want %q %g", key, r.Tier, r.Budget, want.tier, want.budget)
		}
	}
}

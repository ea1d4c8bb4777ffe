package rules

import (
	"fmt"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/storekit"
)

// es builds entries from key, value pairs.
func es(kv ...string) []Entry {
	out := make([]Entry, 0, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, Entry{Key: kv[i], Value: kv[i+1]})
	}
	return out
}

func loadEnvoy(t *testing.T) *Config {
	t.Helper()
	c, errs := LoadDir("testdata/envoy")
	for _, err := range errs {
		t.Errorf("LoadDir: %v", err)
	}
	if len(c.Domains()) != 13 {
		t.Fatalf("loaded %d domains, want 13", len(c.Domains()))
	}
	return c
}

// want describes an expected match; rpu < 0 means no match.
type want struct {
	rpu       int64
	unit      string
	key       string
	stat      string
	name      string
	unlimited bool
	blocked   bool
	shadow    bool
}

const none = -1

func checkMatch(t *testing.T, c *Config, domain string, entries []Entry, w want) *Match {
	t.Helper()
	m := c.Match(domain, entries)
	if w.rpu == none {
		if m != nil {
			t.Errorf("%s %v: matched %q (%d/%s), want no limit", domain, entries, m.Limit.Name, m.Limit.RequestsPerUnit, m.Limit.Unit)
		}
		return nil
	}
	if m == nil {
		t.Errorf("%s %v: no limit, want %d/%s", domain, entries, w.rpu, w.unit)
		return nil
	}
	l := m.Limit
	if int64(l.RequestsPerUnit) != w.rpu || l.Unit != w.unit {
		t.Errorf("%s %v: %d/%s, want %d/%s", domain, entries, l.RequestsPerUnit, l.Unit, w.rpu, w.unit)
	}
	if l.Unlimited != w.unlimited || l.Blocked != w.blocked || l.ShadowMode != w.shadow {
		t.Errorf("%s %v: unlimited %v blocked %v shadow %v, want %v %v %v", domain, entries, l.Unlimited, l.Blocked, l.ShadowMode, w.unlimited, w.blocked, w.shadow)
	}
	if w.key != "" && m.Key != w.key {
		t.Errorf("%s %v: key %q, want %q", domain, entries, m.Key, w.key)
	}
	if w.stat != "" && m.StatKey != w.stat {
		t.Errorf("%s %v: stat key %q, want %q", domain, entries, m.StatKey, w.stat)
	}
	if w.name != "" && l.Name != w.name {
		t.Errorf("%s %v: name %q, want %q", domain, entries, l.Name, w.name)
	}
	if l.Unlimited != (l.Policy == nil) {
		t.Errorf("%s %v: unlimited %v with policy %v", domain, entries, l.Unlimited, l.Policy)
	}
	return m
}

func TestEnvoyExamples(t *testing.T) {
	c := loadEnvoy(t)
	tests := []struct {
		domain  string
		entries []Entry
		want    want
	}{
		// Example 1: values of one key.
		{"mongo_cps", es("database", "users"), want{rpu: 500, unit: "second", key: "database=users", stat: "mongo_cps.database_users"}},
		{"mongo_cps", es("database", "default"), want{rpu: 500, unit: "second"}},
		{"mongo_cps", es("database", "other"), want{rpu: none}},
		{"mongo_cps", es("Database", "users"), want{rpu: none}}, // descriptors are case-sensitive
		{"no_such_domain", es("database", "users"), want{rpu: none}},
		{"mongo_cps", nil, want{rpu: none}},

		// Example 2: nested descriptors; a key without a value limits each value.
		{"messaging", es("message_type", "marketing", "to_number", "2061111111"), want{rpu: 5, unit: "day",
			key: "message_type=marketing|to_number=2061111111", stat: "messaging.message_type_marketing.to_number"}},
		{"messaging", es("message_type", "marketing", "to_number", "2062222222"), want{rpu: 5, unit: "day", key: "message_type=marketing|to_number=2062222222"}},
		{"messaging", es("to_number", "2061111111"), want{rpu: 100, unit: "day", key: "to_number=2061111111", stat: "messaging.to_number"}},
		{"messaging", es("message_type", "marketing"), want{rpu: none}}, // a placeholder level has no limit
		{"messaging", es("message_type", "transactional", "to_number", "1"), want{rpu: none}},

		// Example 3: key/value before key; requests_per_unit 0 blocks.
		{"edge_proxy_per_ip", es("remote_address", "50.0.0.1"), want{rpu: 10, unit: "second", key: "remote_address=50.0.0.1"}},
		{"edge_proxy_per_ip", es("remote_address", "50.0.0.5"), want{rpu: 0, unit: "second", blocked: true, stat: "edge_proxy_per_ip.remote_address_50.0.0.5"}},

		// Example 4: the request's depth must be the configuration's.
		{"example4", es("key", "value", "subkey", "subvalue"), want{rpu: 300, unit: "second"}},
		{"example4", es("key", "value"), want{rpu: none}},
		{"example4", es("shallow", "value"), want{rpu: 300, unit: "second"}},
		{"example4", es("shallow", "value", "subkey", "subvalue"), want{rpu: none}},
		{"example4", es("key", "value", "subkey", "subvalue", "more", "x"), want{rpu: none}},

		// Example 5: unlimited.
		{"internal", es("ldap", "x"), want{rpu: 0, unlimited: true}},
		{"internal", es("azure", "x"), want{rpu: 100, unit: "minute"}},

		// Example 6: shadow mode.
		{"example6", es("service", "auth-service", "user", "user-a"), want{rpu: 10, unit: "second", shadow: true}},
		{"example6", es("service", "auth-service", "user", "user-b"), want{rpu: 20, unit: "second"}},
		{"example6", es("service", "auth-service", "user", "user-c"), want{rpu: none}},

		// Example 7: named limits.
		{"example7", es("key_1", "value_1", "user", "bkthomps"), want{rpu: 5, unit: "second", name: "specific_limit"}},
		{"example7", es("key_2", "value_2", "user", "bkthomps"), want{rpu: 10, unit: "second", name: "example7.key_2_value_2.user_bkthomps"}},

		// Example 8: detailed metrics name the value.
		{"example8", es("key1", "unspecified_value"), want{rpu: 10, unit: "minute", stat: "example8.key1_unspecified_value"}},
		{"example8", es("key1", "value1"), want{rpu: 20, unit: "minute", stat: "example8.key1_value1"}},

		// Example 9: wildcards, each matching value limited separately.
		{"example9", es("key1", "value1"), want{rpu: 20, unit: "minute", key: "key1=value1", stat: "example9.key1_value*"}},
		{"example9", es("key1", "value2"), want{rpu: 20, unit: "minute", key: "key1=value2"}},
		{"example9", es("key1", "value"), want{rpu: 20, unit: "minute"}}, // '*' matches nothing too
		{"example9", es("key1", "valu"), want{rpu: none}},
		{"example9", es("key1", "xvalue1"), want{rpu: none}},
		{"example9", es("path", "/api/v1/items"), want{rpu: 30, unit: "minute"}}, // first wildcard in file order
		{"example9", es("path", "/api/v1/users"), want{rpu: 40, unit: "minute"}},
		{"example9", es("path", "/api/"), want{rpu: 40, unit: "minute"}},
		{"example9", es("path", "/apix"), want{rpu: none}},
		{"example9", es("tenant", "t1", "route", "r1"), want{rpu: 50, unit: "hour", key: "tenant=t1|route=r1"}},
		{"example9", es("tenant", "", "route", ""), want{rpu: 50, unit: "hour", key: "tenant=|route="}},
		{"example9", es("tenant", "t1"), want{rpu: none}},

		// envoyproxy/ratelimit's basic test configuration.
		{"test-domain", es("key1", "something"), want{rpu: none}},
		{"test-domain", es("key1", "value1"), want{rpu: none}},
		{"test-domain", es("key2", "value2", "subkey", "subvalue"), want{rpu: none}},
		{"test-domain", es("key5", "value5", "subkey5", "subvalue"), want{rpu: none}},
		{"test-domain", es("key1", "value1", "subkey1", "something"), want{rpu: 5, unit: "second", stat: "test-domain.key1_value1.subkey1"}},
		{"test-domain", es("key1", "value1", "subkey1", "subvalue1"), want{rpu: 10, unit: "second", stat: "test-domain.key1_value1.subkey1_subvalue1"}},
		{"test-domain", es("key2", "something"), want{rpu: 20, unit: "minute", stat: "test-domain.key2"}},
		{"test-domain", es("key2", "value2"), want{rpu: 30, unit: "minute", stat: "test-domain.key2_value2"}},
		{"test-domain", es("key2", "value3"), want{rpu: none}}, // listed without a limit: never limited
		{"test-domain", es("key2", ""), want{rpu: 20, unit: "minute", key: "key2="}},
		{"test-domain", es("key3", "foo"), want{rpu: 1, unit: "hour"}},
		{"test-domain", es("key4", "foo"), want{rpu: 1, unit: "day"}},
		{"test-domain", es("key5", "value5"), want{rpu: 15, unit: "day"}},
		{"test-domain", es("key5", "value5", "subkey5", "subvalue5"), want{rpu: 25, unit: "day"}},
		{"test-domain", es("key6", "foo"), want{rpu: 0, unlimited: true}},
		{"test-domain", es("key7", "foo"), want{rpu: 70, unit: "week"}},
		{"test-domain", es("key8", "foo"), want{rpu: 80, unit: "month"}},
		{"test-domain", es("key9", "foo"), want{rpu: 90, unit: "year"}},

		// share_threshold: one counter for every value the pattern matches.
		{"shared", es("files", "files/a.pdf"), want{rpu: 100, unit: "minute", key: "files=*files/%2A", stat: "shared.files_files/*"}},
		{"shared", es("files", "files/b.csv"), want{rpu: 100, unit: "minute", key: "files=*files/%2A"}},
		{"shared", es("files", "files/special"), want{rpu: 5, unit: "minute", key: "files=files/special"}},
		{"shared", es("user", "user/1", "action", "read"), want{rpu: 150, unit: "minute", key: "user=*user/%2A|action=read"}},
		{"shared", es("route", "api/v1", "method", "GET"), want{rpu: 60, unit: "minute", key: "route=api/v1|method=GET", stat: "shared.route_api/v1.method"}},

		// anchors and merge keys
		{"anchors", es("a", "1"), want{rpu: 60, unit: "minute"}},
		{"anchors", es("b", "1"), want{rpu: 60, unit: "minute"}},
		{"anchors", es("c", "1"), want{rpu: 120, unit: "minute"}},
	}
	for _, tt := range tests {
		checkMatch(t, c, tt.domain, tt.entries, tt.want)
	}
}

func TestEnvoyWindows(t *testing.T) {
	c := loadEnvoy(t)
	for _, tt := range []struct {
		key    string
		window time.Duration
	}{
		{"key3", time.Hour}, {"key4", 24 * time.Hour}, {"key7", 7 * 24 * time.Hour},
		{"key8", 30 * 24 * time.Hour}, {"key9", 365 * 24 * time.Hour},
	} {
		m := c.Match("test-domain", es(tt.key, "x"))
		if m.Limit.Window != tt.window {
			t.Errorf("%s: window %v, want %v", tt.key, m.Limit.Window, tt.window)
		}
		r := m.Limit.Policy.Rules()
		if len(r) != 1 || r[0].Algorithm != floodgate.FixedWindow || r[0].Period != tt.window || r[0].Calendar != "" {
			t.Errorf("%s: rules %+v, want one fixed window of %v", tt.key, r, tt.window)
		}
	}
	// envoyproxy/ratelimit's windows are aligned to the Unix epoch: a week
	// runs from Thursday 00:00 UTC, and 70 requests a week means the 71st
	// waits for the next Thursday.
	p := c.Match("test-domain", es("key7", "x")).Limit.Policy
	state := make([]int64, storekit.Width(p))
	week := (7 * 24 * time.Hour).Microseconds()
	start := 2914 * week // a Thursday in November 2025
	for i := 0; i < 70; i++ {
		if d := storekit.Apply(p, state, start+int64(i), floodgate.Op{Kind: floodgate.OpAllow, Cost: 1}); !d.Allowed {
			t.Fatalf("request %d denied", i)
		}
	}
	if d := storekit.Apply(p, state, start+week-1, floodgate.Op{Kind: floodgate.OpAllow, Cost: 1}); d.Allowed || d.RetryAfter != time.Microsecond {
		t.Errorf("71st request: %+v, want denied until the week ends", d)
	}
	if d := storekit.Apply(p, state, start+week, floodgate.Op{Kind: floodgate.OpAllow, Cost: 1}); !d.Allowed {
		t.Errorf("first request of the next week denied")
	}
	if time.UnixMicro(start).UTC().Weekday() != time.Thursday {
		t.Errorf("epoch week start is a %v", time.UnixMicro(start).UTC().Weekday())
	}
}

func TestEnvoyReplacesAndMetadata(t *testing.T) {
	c := loadEnvoy(t)
	named := c.Match("example7", es("key_1", "value_1", "user", "bkthomps")).Limit
	replacing := c.Match("example7", es("key_2", "value_2", "user", "bkthomps")).Limit
	if !named.NameGiven || named.Name != "specific_limit" || replacing.NameGiven {
		t.Errorf("names: %q (%v), %q (%v)", named.Name, named.NameGiven, replacing.Name, replacing.NameGiven)
	}
	if len(replacing.Replaces) != 1 || replacing.Replaces[0] != "specific_limit" {
		t.Errorf("replaces %v", replacing.Replaces)
	}

	q := c.Match("quota", es("backend", "primary")).Limit
	if !q.QuotaMode || q.ShadowMode {
		t.Errorf("quota_mode %v shadow_mode %v", q.QuotaMode, q.ShadowMode)
	}
	svc, _ := q.Metadata["service_with_quota"].(map[string]any)
	if svc["name"] != "service_1" || svc["weight"] != int64(2) || len(svc["tags"].([]any)) != 2 {
		t.Errorf("metadata %#v", q.Metadata)
	}
	b := c.Match("quota", es("burst", "x")).Limit
	if b.Window != 5*time.Minute || b.Unit != "" || b.MultipliedUnit != "minute" || b.UnitMultiplier != 5 || b.RequestsPerUnit != 20 {
		t.Errorf("unit_multiplier: %+v", b)
	}
	d := c.Match("example8", es("key1", "x")).Limit
	if !d.DetailedMetric {
		t.Error("detailed_metric lost")
	}
	s := c.Match("shared", es("files", "files/x")).Limit
	if !s.ShareThreshold {
		t.Error("share_threshold lost")
	}
	v := c.Match("shared", es("route", "api/x", "method", "GET")).Limit
	if !v.ValueToMetric || v.ShareThreshold {
		t.Errorf("value_to_metric %v share_threshold %v", v.ValueToMetric, v.ShareThreshold)
	}
}

// TestPolicyNames: one policy per path, named by the path alone, so a
// reload (or a changed limit) keeps its state, and distinct paths never
// share one.
func TestPolicyNames(t *testing.T) {
	c1 := loadEnvoy(t)
	c2 := loadEnvoy(t)
	seen := map[string]string{}
	for _, d := range c1.Domains() {
		for _, l := range d.Limits() {
			if l.Policy == nil {
				continue
			}
			n := l.Policy.Name()
			if prev, ok := seen[n]; ok {
				t.Errorf("policy %q shared by %s and %s", n, prev, l.Name)
			}
			seen[n] = l.Name
		}
		d2 := c2.Domain(d.Name)
		for i, l := range d.Limits() {
			l2 := d2.Limits()[i]
			if l.Policy != nil && (l.Policy.Name() != l2.Policy.Name() || l.Policy == l2.Policy) {
				t.Errorf("reloaded policy %q != %q", l2.Policy.Name(), l.Policy.Name())
			}
			if l.Name != l2.Name {
				t.Errorf("reloaded name %q != %q", l2.Name, l.Name)
			}
		}
	}
	a := mustParse(t, "domain: d\ndescriptors:\n- key: k\n  rate_limit: {unit: minute, requests_per_unit: 1}\n")
	b := mustParse(t, "domain: d\ndescriptors:\n- key: k\n  rate_limit: {unit: hour, requests_per_unit: 100, algorithm: token_bucket}\n")
	if a.Limits()[0].Policy.Name() != b.Limits()[0].Policy.Name() {
		t.Errorf("changed limit renamed its policy: %q, %q", a.Limits()[0].Policy.Name(), b.Limits()[0].Policy.Name())
	}
	if a.Limits()[0].Policy.Rules()[0].Name == b.Limits()[0].Policy.Rules()[0].Name {
		t.Errorf("a new window kept its rule name %q (envoyproxy/ratelimit starts a new counter)", a.Limits()[0].Policy.Rules()[0].Name)
	}
}

// Numbers and booleans read as envoyproxy/ratelimit's YAML parser (yaml.v2,
// YAML 1.1) reads them, so a file means the same in both; a fraction, which
// yaml.v2 would cut short, and a quoted number or boolean are errors.
func TestYAML11Scalars(t *testing.T) {
	load := func(rpu, shadow string) (*Match, error) {
		src := "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: " + shadow + "\n    rate_limit: {unit: hour, requests_per_unit: " + rpu + "}\n"
		d, err := Parse("d.yaml", []byte(src))
		if err != nil {
			return nil, err
		}
		c, err := NewConfig(d)
		if err != nil {
			return nil, err
		}
		return c.Match("d", es("k", "v")), nil
	}
	for in, want := range map[string]uint32{
		"10": 10, "010": 8, "08": 8, "0o10": 8, "0x10": 16, "0b11": 3, "1_000": 1000, "+5": 5,
		"5.0": 5, "1e3": 1000, "4294967295": 4294967295, "0": 0,
	} {
		m, err := load(in, "false")
		if err != nil || m == nil || m.Limit.RequestsPerUnit != want {
			t.Errorf("requests_per_unit: %s: %v, %v; want %d", in, m, err, want)
		}
	}
	for _, in := range []string{"5.5", "'5'", "!!str 5", "1e10", "4294967296", "-1", "ten", ".inf", "0x"} {
		if _, err := load(in, "false"); err == nil {
			t.Errorf("requests_per_unit: %s loaded", in)
		}
	}
	for in, want := range map[string]bool{
		"true": true, "True": true, "TRUE": true, "yes": true, "Yes": true, "YES": true, "on": true, "On": true, "ON": true, "y": true, "Y": true,
		"false": false, "False": false, "no": false, "NO": false, "off": false, "Off": false, "n": false, "N": false,
	} {
		m, err := load("5", in)
		if err != nil || m == nil || m.Limit.ShadowMode != want {
			t.Errorf("shadow_mode: %s: %+v, %v; want %v", in, m, err, want)
		}
	}
	for _, in := range []string{"tRUE", "'true'", "\"yes\"", "!!str yes", "1", "maybe"} {
		if _, err := load("5", in); err == nil {
			t.Errorf("shadow_mode: %s loaded", in)
		}
	}
}

// ParseKey reads Match.Key back into the entries that made it, escapes
// included, and refuses what no match could have made.
func TestParseKey(t *testing.T) {
	d, err := Parse("k.yaml", []byte("domain: k\ndescriptors:\n  - key: 'a%b'\n    descriptors:\n      - key: k2\n        rate_limit: {unit: second, requests_per_unit: 1}\n"))
	if err != nil {
		t.Fatal(err)
	}
	c, _ := NewConfig(d)
	for _, entries := range [][]Entry{es("a%b", "x=y|z*", "k2", ""), es("a%b", "日本", "k2", "v")} {
		m := c.Match("k", entries)
		if m == nil {
			t.Fatalf("no match for %v", entries)
		}
		got, ok := ParseKey(m.Key)
		if !ok || fmt.Sprint(got) != fmt.Sprint(entries) {
			t.Errorf("ParseKey(%q) = %v %v, want %v", m.Key, got, ok, entries)
		}
	}
	if got, ok := ParseKey("path=*%2Fapi%2F"); !ok || fmt.Sprint(got) != fmt.Sprint(es("path", "/api/")) {
		t.Errorf("a shared counter's key: %v %v", got, ok)
	}
	for _, in := range []string{"", "user", "=v", "a=%2", "a=%ZZ", "a=b=c", "a=b|"} {
		if got, ok := ParseKey(in); ok {
			t.Errorf("ParseKey(%q) = %v, want refused", in, got)
		}
	}
}

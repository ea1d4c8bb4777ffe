package lease

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const goodConfig = `# resources of the test
defaults: &d
  lease_length: 30s
  refresh_interval: 3s
resources:
  - id: "db/*"
    capacity: 1000
    safe_capacity: 10
    algorithm: fair_share
    lease_length: 60s
    refresh_interval: 5s
    learning_mode: 90s
  - id: api
    <<: *d
    capacity: 0.5
    algorithm: static
    static_capacity: 0.1
  - id: "*"
    capacity: 100
`

func TestParseConfig(t *testing.T) {
	// the anchor needs a field to live in: "defaults" is unknown, so test
	// anchors inside the list instead.
	src := strings.Replace(goodConfig, "defaults: &d\n  lease_length: 30s\n  refresh_interval: 3s\n", "", 1)
	src = strings.Replace(src, "  - id: api\n    <<: *d\n", "  - id: api\n    <<: {lease_length: 30s, refresh_interval: 3s}\n", 1)
	cfg, err := ParseConfig("r.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	want := []Resource{
		{ID: "db/*", Capacity: 1000, SafeCapacity: 10, Algorithm: FairShare, LeaseLength: time.Minute,
			RefreshInterval: 5 * time.Second, LearningMode: 90 * time.Second, Pos: "r.yaml:3"},
		{ID: "api", Capacity: 0.5, Algorithm: Static, StaticCapacity: 0.1, LeaseLength: 30 * time.Second,
			RefreshInterval: 3 * time.Second, LearningMode: 30 * time.Second, Pos: "r.yaml:10"},
		{ID: "*", Capacity: 100, Algorithm: FairShare, LeaseLength: DefaultLeaseLength,
			RefreshInterval: DefaultRefreshInterval, LearningMode: DefaultLeaseLength, Pos: "r.yaml:15"},
	}
	if len(cfg.Resources) != len(want) {
		t.Fatalf("got %+v", cfg.Resources)
	}
	for i := range want {
		if cfg.Resources[i] != want[i] {
			t.Errorf("resource %d:\n got %+v\nwant %+v", i, cfg.Resources[i], want[i])
		}
	}
	for id, w := range map[string]string{"db/users": "db/*", "api": "api", "db/a/b": "*", "other": "*"} {
		if got := cfg.Find(id); got == nil || got.ID != w {
			t.Errorf("Find(%q) = %+v, want %q", id, got, w)
		}
	}
}

// Every bad input gets an error naming file:line and the field, and no
// Config.
func TestParseConfigErrors(t *testing.T) {
	const tail = "  - id: \"*\"\n    capacity: 1\n"
	cases := []struct{ name, src, want string }{
		{"unknown field", "resources:\n  - id: a\n    capacity: 1\n    algoritm: none\n" + tail,
			`r.yaml:4: resources[0].algoritm: unknown field "algoritm" (did you mean "algorithm"?)`},
		{"unknown field far", "resources:\n  - id: a\n    capacity: 1\n    colour: red\n" + tail,
			`r.yaml:4: resources[0].colour: unknown field "colour" (want one of id, capacity`},
		{"unknown top field", "resource:\n" + tail, `r.yaml:1: resource: unknown field "resource" (did you mean "resources"?)`},
		{"missing resources", "{}\n", `r.yaml:1: resources: missing`},
		{"empty list", "resources: []\n", `r.yaml:1: resources: want a non-empty list`},
		{"no default", "resources:\n  - id: a\n    capacity: 1\n", `r.yaml:2: resources: no "*" default`},
		{"default not last", "resources:\n" + tail + "  - id: a\n    capacity: 1\n", `r.yaml:2: resources[0].id: the "*" default must be the last resource (1 follow it`},
		{"refresh >= lease", "resources:\n  - id: a\n    capacity: 1\n    lease_length: 5s\n    refresh_interval: 5s\n" + tail,
			`r.yaml:5: resources[0].refresh_interval: 5s is not shorter than lease_length (5s)`},
		{"lease too short", "resources:\n  - id: a\n    capacity: 1\n    lease_length: 5ms\n" + tail,
			`r.yaml:4: resources[0].lease_length: 5ms: at least 10ms`},
		{"negative capacity", "resources:\n  - id: a\n    capacity: -1\n" + tail, `r.yaml:3: resources[0].capacity: -1 is negative`},
		{"capacity not a number", "resources:\n  - id: a\n    capacity: lots\n" + tail, `r.yaml:3: resources[0].capacity: want a number, got "lots"`},
		{"capacity quoted", "resources:\n  - id: a\n    capacity: \"5\"\n" + tail, `r.yaml:3: resources[0].capacity: want a number, got "5"`},
		{"capacity nan", "resources:\n  - id: a\n    capacity: .nan\n" + tail, `r.yaml:3: resources[0].capacity: want a number`},
		{"capacity inf", "resources:\n  - id: a\n    capacity: .inf\n" + tail, `r.yaml:3: resources[0].capacity: want a number, got ".inf"`},
		{"capacity huge", "resources:\n  - id: a\n    capacity: 1e13\n" + tail, `r.yaml:3: resources[0].capacity: 1e13 is too large`},
		{"missing capacity", "resources:\n  - id: a\n" + tail, `r.yaml:2: resources[0].capacity: missing`},
		{"missing id", "resources:\n  - capacity: 1\n" + tail, `r.yaml:2: resources[0].id: missing`},
		{"empty id", "resources:\n  - id: \"\"\n    capacity: 1\n" + tail, `r.yaml:2: resources[0].id: empty`},
		{"bad glob", "resources:\n  - id: \"db/[\"\n    capacity: 1\n" + tail, `r.yaml:2: resources[0].id: "db/[" is not a valid glob`},
		{"unknown algorithm", "resources:\n  - id: a\n    capacity: 1\n    algorithm: fairshare\n" + tail,
			`r.yaml:4: resources[0].algorithm: unknown algorithm "fairshare" (did you mean "fair_share"?)`},
		{"unknown algorithm far", "resources:\n  - id: a\n    capacity: 1\n    algorithm: lottery\n" + tail,
			`r.yaml:4: resources[0].algorithm: unknown algorithm "lottery" (want none, static, proportional_share, fair_share)`},
		{"duplicate id", "resources:\n  - id: a\n    capacity: 1\n  - id: a\n    capacity: 2\n" + tail, `r.yaml:4: resources[1].id: duplicate id "a" (first at r.yaml:2)`},
		{"shadowed id", "resources:\n  - id: \"db/*\"\n    capacity: 1\n  - id: db/x\n    capacity: 2\n" + tail,
			`r.yaml:4: resources[1].id: "db/x" is never used: "db/*" (r.yaml:2) comes first and matches it`},
		{"static without cap", "resources:\n  - id: a\n    capacity: 1\n    algorithm: static\n" + tail,
			`r.yaml:2: resources[0].static_capacity: algorithm static needs static_capacity > 0`},
		{"static cap on fair", "resources:\n  - id: a\n    capacity: 1\n    static_capacity: 1\n" + tail,
			`r.yaml:4: resources[0].static_capacity: only for algorithm static (this one is fair_share)`},
		{"safe > capacity", "resources:\n  - id: a\n    capacity: 1\n    safe_capacity: 2\n" + tail,
			`r.yaml:4: resources[0].safe_capacity: 2 is more than capacity (1)`},
		{"duration without unit", "resources:\n  - id: a\n    capacity: 1\n    lease_length: 60\n" + tail,
			`r.yaml:4: resources[0].lease_length: want a duration such as "5s" or "1m", got "60" (a unit is needed: 60s?)`},
		{"negative duration", "resources:\n  - id: a\n    capacity: 1\n    lease_length: -5s\n" + tail, `r.yaml:4: resources[0].lease_length: -5s: want a duration > 0`},
		{"learning shorter than lease", "resources:\n  - id: a\n    capacity: 1\n    learning_mode: 10s\n" + tail,
			`r.yaml:4: resources[0].learning_mode: 10s is shorter than lease_length (1m0s)`},
		{"field twice", "resources:\n  - id: a\n    capacity: 1\n    capacity: 2\n" + tail, `r.yaml:4: resources[0].capacity: given twice (first at line 3)`},
		{"entry not a mapping", "resources:\n  - a\n" + tail, `r.yaml:2: resources[0]: want a mapping`},
		{"syntax", "resources:\n  - id: a\n   capacity: [\n", `: YAML syntax: did not find expected`},
		{"not a mapping", "- a\n", `r.yaml:1: want a mapping with a resources list, got a list`},
		{"empty file", "", `r.yaml: the file is empty`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := ParseConfig("r.yaml", []byte(c.src))
			if err == nil {
				t.Fatalf("no error; config %+v", cfg)
			}
			if cfg != nil {
				t.Errorf("a config beside the error: %+v", cfg)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error\n%v\nwant it to contain\n%s", err, c.want)
			}
			var e *Error
			if !errors.As(err, &e) || e.File != "r.yaml" {
				t.Fatalf("not an *Error naming the file: %#v", err)
			}
		})
	}
}

// A flood of aliases (a billion laughs) is refused, not expanded.
func TestParseConfigAliasBomb(t *testing.T) {
	var b strings.Builder
	b.WriteString("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n")
	for i := 1; i < 9; i++ {
		b.WriteString("a" + string(rune('0'+i)) + ": &a" + string(rune('0'+i)) + " [")
		for j := 0; j < 10; j++ {
			if j > 0 {
				b.WriteString(", ")
			}
			b.WriteString("*a" + string(rune('0'+i-1)))
		}
		b.WriteString("]\n")
	}
	b.WriteString("resources:\n  - id: \"*\"\n    capacity: 1\n    <<: *a8\n")
	_, err := ParseConfig("r.yaml", []byte(b.String()))
	if err == nil || !strings.Contains(err.Error(), "YAML nodes") && !strings.Contains(err.Error(), "merge key") {
		t.Fatalf("got %v", err)
	}
}

func TestLoadConfig(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "res.yaml")
	if err := os.WriteFile(p, []byte("resources:\n  - id: \"*\"\n    capacity: -1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadConfig(p); err == nil || !strings.HasPrefix(err.Error(), p+":3: resources[0].capacity:") {
		t.Fatalf("got %v", err)
	}
	if _, err := LoadConfig(filepath.Join(dir, "missing.yaml")); err == nil {
		t.Fatal("no error for a missing file")
	}
	big := make([]byte, MaxConfigBytes+10)
	for i := range big {
		big[i] = '#'
	}
	os.WriteFile(p, big, 0o600)
	if _, err := LoadConfig(p); err == nil || !strings.Contains(err.Error(), "at most") {
		t.Fatalf("got %v", err)
	}
}

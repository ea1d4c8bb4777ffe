package rules

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzParse checks that no input makes Parse panic, that every error
// names the file, and that whatever parses can be matched and rendered.
// The plain test run replays the seed corpus (every testdata file, every
// broken file of TestParseErrors and TestHTTPErrors); to search for new
// inputs:
//
//	go test -run '^$' -fuzz FuzzParse -fuzztime 60s ./rules/
func FuzzParse(f *testing.F) {
	files, _ := filepath.Glob("testdata/*/*.yaml")
	for _, name := range files {
		data, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	for _, tt := range parseErrorTests {
		f.Add([]byte(tt.src))
	}
	f.Add([]byte("domain: d\ndescriptors:\n  - key: k\n    value_regex: \"(a|b)+\"\n    share_threshold: true\n    rate_limit: {window: 90s, requests_per_unit: 3, algorithm: token_bucket, burst: 9}\n"))
	f.Add([]byte("domain: d\ndescriptors: &x\n  - key: k\n    <<: {value: v}\n    descriptors: *x\n"))
	for _, tt := range httpErrorTests {
		f.Add([]byte(tt.src))
	}
	f.Add([]byte(`domain: d
descriptors:
  - key: path
    value_prefix: /api/
    descriptors:
      - key: remote_address
        rate_limit: {unit: second, requests_per_unit: 5}
http:
  - name: api
    match: {host: ["*.example.com", "[::1]"], path: /api/*/x/**, methods: [get, POST]}
    key: [path, {header: X-Real-IP, entry: remote_address, missing: skip}]
    action: ban
    ban: {threshold: 10, interval: 1m, duration: 5m}
    exempt_cidrs: [10.0.0.0/8, "::1"]
  - &own
    key: [{cookie: s, missing: shared}, {generic: gold, entry: tier}, method, host]
    rate_limits:
      - {unit: minute, requests_per_unit: 60, algorithm: gcra}
      - {calendar: day, requests_per_unit: 1000}
    action: shadow
    cost: 2
  - <<: *own
    name: own2
    action: delay
    max_delay: 250ms
  - key: [remote_address]
    rate_limit: {unit: second, requests_per_unit: 0}
    action: redirect
    redirect: https://example.com/busy
    redirect_status: 307
`))
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := parse("f.yaml", data, Options{CalendarMonth: len(data)%2 == 0}) // without Parse's recover, so panics surface
		if err != nil {
			if d != nil {
				t.Fatal("a domain and an error")
			}
			for _, line := range strings.Split(err.Error(), "\n") {
				if !strings.HasPrefix(line, "f.yaml") {
					t.Fatalf("error line %q does not name the file", line)
				}
			}
			return
		}
		c, err := NewConfig(d)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.JSON(); err != nil {
			t.Fatalf("JSON: %v", err)
		}
		names := map[string]bool{}
		for _, r := range d.HTTP() {
			if r.Name == "" || names[r.Name] || len(r.Key) == 0 || r.Cost < 1 || r.File != "f.yaml" || r.Line < 1 {
				t.Fatalf("route %+v", r)
			}
			names[r.Name] = true
			if l := r.Limit; l != nil && (l.Unlimited != (l.Policy == nil) || l.Policy != nil && !strings.Contains(l.Policy.Name(), "#")) {
				t.Fatalf("route %q: limit %+v", r.Name, l)
			}
		}
		for _, l := range d.Limits() {
			if l.Unlimited != (l.Policy == nil) {
				t.Fatalf("limit %q: unlimited %v, policy %v", l.Name, l.Unlimited, l.Policy)
			}
			// A request built from the limit's own path.
			entries := make([]Entry, len(l.path))
			for i, n := range l.path {
				v := "v"
				switch n.kind {
				case kindExact:
					v = n.value
				case kindPrefix:
					v = n.value + "x"
				case kindGlob:
					v = strings.Join(n.parts, "x")
				}
				entries[i] = Entry{Key: n.key, Value: v}
			}
			if m := c.Match(d.Name, entries); m != nil && (m.Key == "" || m.Limit == nil) {
				t.Fatalf("match %+v", m)
			}
			c.Match(d.Name, entries[:len(entries)-1])
		}
	})
}

package rules

import (
	"fmt"
	"strings"
	"testing"
)

// oracleMatchRules exercises envoyproxy/ratelimit's matching
// (src/config/config_impl.go:319-545, GetLimit): an exact value before
// wildcards, wildcards in file order, then the key alone; no backtracking;
// a limit only where the last entry ends; a whitelisted value; an
// unlimited wildcard parent with a limited child.
const oracleMatchRules = `domain: d
descriptors:
  - key: w
    value: "fo*"
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: w
    value: "foo*"
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: w
    value: foo
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: w
    rate_limit: {unit: second, requests_per_unit: 4}
  - key: s
    value: "*"
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: n
    value: "a*"
    descriptors:
      - key: m
        rate_limit: {unit: second, requests_per_unit: 6}
      - key: m
        value: "z*"
        rate_limit: {unit: second, requests_per_unit: 7}
  - key: n
    rate_limit: {unit: second, requests_per_unit: 8}
    descriptors:
      - key: m
        value: q
        rate_limit: {unit: second, requests_per_unit: 9}
  - key: e
    value: x
  - key: e
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: p
    value: "v*"
    rate_limit: {unlimited: true}
    descriptors:
      - key: c
        rate_limit: {unit: minute, requests_per_unit: 11}
  - key: u
    value: "a_b*"
    rate_limit: {unit: second, requests_per_unit: 12}
  - key: deep
    descriptors:
      - key: x
        descriptors:
          - key: y
            rate_limit: {unit: hour, requests_per_unit: 13}
`

// The answers were taken from envoyproxy/ratelimit itself (its
// config.NewRateLimitConfigImpl and GetLimit, at the version
// bench/envoydiff.sh pins, on this file): "" where it finds no limit.
func TestOracleMatching(t *testing.T) {
	d, err := Parse("m.yaml", []byte(oracleMatchRules))
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewConfig(d)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ query, want string }{
		{"w=fo", "1/SECOND"},
		{"w=foo", "3/SECOND"},
		{"w=foo1", "1/SECOND"},
		{"w=fop", "1/SECOND"},
		{"w=f", "4/SECOND"},
		{"w=", "4/SECOND"},
		{"s=", "5/SECOND"},
		{"s=anything", "5/SECOND"},
		{"n=abc", ""},
		{"n=abc,m=1", "6/SECOND"},
		{"n=abc,m=zz", "7/SECOND"},
		{"n=b", "8/SECOND"},
		{"n=b,m=q", "9/SECOND"},
		{"n=b,m=r", ""},
		{"n=a", ""},
		{"n=a,m=z", "7/SECOND"},
		{"e=x", ""},
		{"e=y", "10/SECOND"},
		{"p=v1", "unlimited"},
		{"p=v1,c=2", "11/MINUTE"},
		{"p=w,c=2", ""},
		{"u=a_bc", "12/SECOND"},
		{"u=a_b", "12/SECOND"},
		{"u=a", ""},
		{"deep=1,x=2,y=3", "13/HOUR"},
		{"deep=1,x=2", ""},
		{"deep=1", ""},
		{"n=abc,m=1,o=1", ""},
	} {
		var es []Entry
		for _, kv := range strings.Split(tc.query, ",") {
			k, v, _ := strings.Cut(kv, "=")
			es = append(es, Entry{Key: k, Value: v})
		}
		got := ""
		switch m := c.Match("d", es); {
		case m == nil:
		case m.Limit.Unlimited:
			got = "unlimited"
		default:
			got = fmt.Sprintf("%d/%s", m.Limit.RequestsPerUnit, strings.ToUpper(m.Limit.Unit))
		}
		if got != tc.want {
			t.Errorf("%s: %q, want %q (envoyproxy/ratelimit's)", tc.query, got, tc.want)
		}
	}
}

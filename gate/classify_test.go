package gate

import (
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
)

const classifyRules = `domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10}
http:
  - name: batch
    match: {path_prefix: /batch/}
    key: [remote_address]
    criticality: sheddable
  - name: api
    match: {path_prefix: /api/}
    key: [remote_address]
  - name: checkout
    match: {path_prefix: /api/checkout}
    key: [remote_address]
    criticality: critical-plus
  - name: all
    key: [remote_address]
    criticality: SHEDDABLE_PLUS
`

// TestClassify: a route's criticality comes from the rules file to the
// gate; Classify names the first route that matches and the first level
// a matching route sets, in configuration order, without the store.
func TestClassify(t *testing.T) {
	cfg := configOf(t, "edge.yaml", classifyRules)
	ls, err := FromRules(cfg)
	if err != nil {
		t.Fatal(err)
	}
	g, err := New(Config{Limits: ls, Rules: cfg})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	for _, c := range []struct{ path, route, crit string }{
		{"/batch/x", "edge/batch", "SHEDDABLE"},
		{"/api/items", "edge/api", "SHEDDABLE_PLUS"},     // api sets none: all's
		{"/api/checkout/1", "edge/api", "CRITICAL_PLUS"}, // api first, checkout's level
		{"/other", "edge/all", "SHEDDABLE_PLUS"},
	} {
		if got := g.Classify(httpReq("192.0.2.1:1", c.path)); got.Route != c.route || got.Criticality != c.crit {
			t.Errorf("%s: %+v, want route %s, level %s", c.path, got, c.route, c.crit)
		}
	}
	empty, _ := New(Config{})
	if got := empty.Classify(httpReq("192.0.2.1:1", "/")); got != (Class{}) {
		t.Errorf("no limits: %+v", got)
	}
}

// TestCriticalityErrors: a bad level in Go is an error naming the field;
// a level on an unlimited route is refused at its line, not ignored.
func TestCriticalityErrors(t *testing.T) {
	_, err := New(Config{Limits: []Limit{{Name: "x", Policy: policy(t, "x", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 1, Period: time.Second}), Criticality: "URGENT"}}})
	if err == nil || !strings.Contains(err.Error(), `criticality: "URGENT" is not a level`) {
		t.Errorf("bad level: %v", err)
	}
	cfg := configOf(t, "u.yaml", `domain: u
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10}
http:
  - key: [remote_address]
    criticality: CRITICAL_PLUS
    rate_limit: {unlimited: true}
`)
	if _, err := FromRules(cfg); err == nil || !strings.HasPrefix(err.Error(), "u.yaml:6: http route http[0]: criticality CRITICAL_PLUS on an unlimited route") {
		t.Errorf("unlimited route: %v", err)
	}
}

package main

import (
	"strings"
	"testing"

	"github.com/floodgate/floodgate/rules"
)

// TestProxyRefusesDeferRoutes: floodgate proxy does not queue yet, so a
// rules file with action defer is refused at its route's line rather than
// served as a silent 429.
func TestProxyRefusesDeferRoutes(t *testing.T) {
	dom, err := rules.Parse("edge.yaml", []byte("domain: edge\nhttp:\n  - name: orders\n    key: [remote_address]\n    action: defer\n    rate_limit: {unit: second, requests_per_unit: 2}\n"))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := rules.NewConfig(dom)
	if err != nil {
		t.Fatal(err)
	}
	if err := noDeferRoutes(cfg); err == nil || !strings.HasPrefix(err.Error(), "edge.yaml:3: http route orders: action defer") {
		t.Errorf("got %v", err)
	}
}

package rules

import (
	"strings"
	"testing"
	"time"
)

// TestDeferRoute: action defer reads its queue fields, defaults them to
// zero (deferq's defaults), and reports bad ones at their line.
func TestDeferRoute(t *testing.T) {
	head := "domain: d\nhttp:\n  - key: [remote_address]\n    action: defer\n    rate_limit: {unit: second, requests_per_unit: 5}\n"
	d, err := Parse("f.yaml", []byte(head+"    defer: {max_queue: 100, max_body: 4096, result_ttl: 5m}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if r := d.HTTP()[0]; r.Action != "defer" || r.Defer != (HTTPDefer{100, 4096, 5 * time.Minute}) || r.Status != 0 {
		t.Errorf("route = %+v", r)
	}
	if d, err := Parse("f.yaml", []byte(head)); err != nil || d.HTTP()[0].Defer != (HTTPDefer{}) {
		t.Errorf("defer without its fields: %v", err)
	}
	for _, c := range []struct{ field, want string }{
		{"{max_queue: 0}", "f.yaml:6: http[0].defer.max_queue: "},
		{"{max_body: 999999999999}", "f.yaml:6: http[0].defer.max_body: "},
		{"{result_ttl: 10ms}", "f.yaml:6: http[0].defer.result_ttl: "},
		{"{queue_size: 5}", "f.yaml:6: http[0].defer.queue_size: "},
		{"5", "f.yaml:6: http[0].defer: "},
	} {
		_, err := Parse("f.yaml", []byte(head+"    defer: "+c.field+"\n"))
		if err == nil || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("defer: %s: got %v, want %q...", c.field, err, c.want)
		}
	}
}

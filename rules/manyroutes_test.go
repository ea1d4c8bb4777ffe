package rules

import (
	"fmt"
	"strings"
	"testing"
)

// A file holds many http routes, one per API endpoint say: a gate takes
// any number (the routes of all of a proxy's files), so a file is bounded
// at MaxRoutes only to bound what reading one costs. (A 17th route was
// refused: a proxy's gate took 16 in all.)
func TestManyRoutesInOneFile(t *testing.T) {
	var b strings.Builder
	b.WriteString("domain: api\nhttp:\n")
	for i := range 100 {
		fmt.Fprintf(&b, "  - name: e%d\n    match: {path: /v1/e%d/*}\n    key: [remote_address]\n    rate_limit: {unit: minute, requests_per_unit: 5}\n", i, i)
	}
	d, err := Parse("api.yaml", []byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	if rs := d.HTTP(); len(rs) != 100 || rs[99].Name != "e99" || rs[99].Path != "/v1/e99/*" {
		t.Fatalf("%d routes", len(rs))
	}
	if MaxRoutes < 1000 {
		t.Errorf("MaxRoutes %d: a file takes fewer routes than an API has endpoints", MaxRoutes)
	}
}

package gate

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/clock"
)

// A request matching ten limits, one of them of two rules, gets
// RateLimit-Policy's first maxPolicyItems items: each rule of the first
// limit, then the others.
func TestPolicyFieldsBounded(t *testing.T) {
	clk := clock.NewManual(t0)
	two, err := floodgate.NewPolicy("two",
		floodgate.Rule{Name: "minute", Algorithm: floodgate.FixedWindow, Limit: 10, Period: time.Minute},
		floodgate.Rule{Name: "hour", Algorithm: floodgate.FixedWindow, Limit: 100, Period: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	limits := []Limit{{Name: "two", Policy: two}}
	for i := range 9 {
		limits = append(limits, Limit{Name: fmt.Sprintf("l%d", i), Policy: policy(t, fmt.Sprintf("p%d", i), floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: int64(20 + i), Period: time.Minute})})
	}
	g := newGate(t, clk, limits...)
	v := check(g, httpReq("192.0.2.1:1", "/"))
	got := map[string][]string{}
	Headers(v, false, func(k string, vals []string) { got[k] = vals })
	want := `"two/minute";q=10;w=60, "two/hour";q=100;w=3600`
	for i := range maxPolicyItems - 2 {
		want += fmt.Sprintf(`, "l%d";q=%d;w=60`, i, 20+i)
	}
	if p := strings.Join(got[HeaderPolicy], ", "); p != want {
		t.Fatalf("RateLimit-Policy\n%s, want\n%s", p, want)
	}
}

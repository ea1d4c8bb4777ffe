package gate_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/gate"
	"github.com/floodgate/floodgate/memstore"
	"github.com/floodgate/floodgate/rules"
)

// A gate in front of a server other than net/http (fasthttp, say): the
// server describes each request in a RawHTTP, the gate decides it, and
// Headers gives the RateLimit fields to answer with.
func Example() {
	clk := clock.NewManual(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	login := floodgate.MustPolicy("login", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 2, Period: time.Minute})
	g, err := gate.New(gate.Config{Clock: clk, Limits: []gate.Limit{
		{Name: "login", Policy: login, Match: gate.Match{Path: "/login", Methods: []string{"POST"}}, Key: []gate.Part{gate.IP()}},
	}})
	if err != nil {
		panic(err)
	}
	defer g.Close()

	for range 3 {
		r := &gate.Request{
			Raw:  &gate.RawHTTP{Method: "POST", Host: "example.com", Path: "/login"},
			Peer: "203.0.113.9:41000",
			Ctx:  context.Background(),
		}
		var v gate.Verdict
		g.Check(r, &v)
		fmt.Print("allowed=", v.Allowed)
		gate.Headers(&v, false, func(key string, vals []string) { fmt.Printf(" %s: %s;", key, vals[0]) })
		fmt.Println()
	}
	// Output:
	// allowed=true Ratelimit-Policy: "login";q=2;w=60; Ratelimit: "login";r=1;t=60;
	// allowed=true Ratelimit-Policy: "login";q=2;w=60; Ratelimit: "login";r=0;t=60;
	// allowed=false Ratelimit-Policy: "login";q=2;w=60; Ratelimit: "login";r=0;t=60; Retry-After: 60;
}

// A client that sends more than 3 requests in a minute is refused for the
// rest of that minute and 10 minutes after it, until an operator lifts
// the ban.
func Example_ban() {
	clk := clock.NewManual(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	store := memstore.MustNew(memstore.Options{Clock: clk})
	defer store.Close()
	perIP := floodgate.MustPolicy("per-ip", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 3, Period: time.Minute})
	g, err := gate.New(gate.Config{Store: store, Clock: clk, Limits: []gate.Limit{{
		Name: "per-ip", Policy: perIP, Key: []gate.Part{gate.IP()},
		Action: gate.Ban, Ban: gate.BanRule{Threshold: 3, Interval: time.Minute, Duration: 10 * time.Minute},
	}}})
	if err != nil {
		panic(err)
	}
	check := func() {
		r := &gate.Request{Raw: &gate.RawHTTP{Method: "GET", Path: "/"}, Peer: "198.51.100.4:5000", Ctx: context.Background()}
		var v gate.Verdict
		g.Check(r, &v)
		o := v.Outcomes[0]
		fmt.Printf("%s allowed=%v banned=%v retry-after=%s\n",
			clk.Now().Format("15:04"), v.Allowed, o.Banned, o.Decision.RetryAfter.Round(time.Second))
	}
	for range 4 {
		check()
	}
	clk.Advance(5 * time.Minute)
	check() // the window has reset; the ban has not
	if err := g.Lift(context.Background(), "per-ip", "198.51.100.4"); err != nil {
		panic(err)
	}
	check()
	// Output:
	// 00:00 allowed=true banned=false retry-after=0s
	// 00:00 allowed=true banned=false retry-after=0s
	// 00:00 allowed=true banned=false retry-after=0s
	// 00:00 allowed=false banned=true retry-after=11m0s
	// 00:05 allowed=false banned=true retry-after=6m0s
	// 00:05 allowed=true banned=false retry-after=0s
}

// Limits from a rules file's http section (the routes of floodgate proxy),
// for a gate in a Go service.
func ExampleFromRules() {
	file := []byte(`
domain: web
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 100}
http:
  - name: per-ip
    key: [remote_address]
  - name: search
    match: {path_prefix: /search}
    key: [{header: X-API-Key, missing: skip}]
    rate_limit: {unit: second, requests_per_unit: 5, algorithm: token_bucket}
`)
	dom, err := rules.Parse("web.yaml", file)
	if err != nil {
		panic(err)
	}
	cfg, err := rules.NewConfig(dom)
	if err != nil {
		panic(err)
	}
	limits, err := gate.FromRules(cfg)
	if err != nil {
		panic(err)
	}
	g, err := gate.New(gate.Config{Rules: cfg, Limits: limits})
	if err != nil {
		panic(err)
	}
	defer g.Close()
	req := httptest.NewRequest("GET", "/search?q=floodgate", nil)
	req.RemoteAddr = "192.0.2.7:3000"
	req.Header.Set("X-API-Key", "k-123")
	var v gate.Verdict
	g.Check(&gate.Request{HTTP: req, Peer: req.RemoteAddr}, &v)
	for _, o := range v.Outcomes {
		fmt.Printf("%s key=%s remaining=%d\n", o.Limit.Name, o.Key, o.Decision.Remaining)
	}
	// Output:
	// web/per-ip key=192.0.2.7 remaining=99
	// web/search key=k-123 remaining=4
}

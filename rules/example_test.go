package rules_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/memstore"
	"github.com/floodgate/floodgate/rules"
)

// Match a request's descriptor against a rules file and decide it with
// the matched limit's policy, under the key Match gives: what floodgate
// serve does for each descriptor Envoy sends.
func Example() {
	file := []byte(`
domain: edge
descriptors:
  - key: remote_address
    exempt_values: ["127.0.0.1"]
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: path
    value_prefix: /api/
    descriptors:
      - key: user_id
        rate_limits:
          - {unit: minute, requests_per_unit: 2, algorithm: sliding_window}
          - {unit: hour, requests_per_unit: 1000}
`)
	dom, err := rules.Parse("edge.yaml", file)
	if err != nil {
		panic(err)
	}
	cfg, err := rules.NewConfig(dom)
	if err != nil {
		panic(err)
	}

	m := cfg.Match("edge", []rules.Entry{{Key: "path", Value: "/api/orders"}, {Key: "user_id", Value: "alice"}})
	fmt.Printf("limit %s (line %d), key %q\n", m.Limit.Name, m.Limit.Line, m.Key)

	ctx := context.Background()
	l := floodgate.NewLimiter(m.Limit.Policy, memstore.MustNew(memstore.Options{}))
	for range 3 {
		d, _ := l.Allow(ctx, m.Key)
		fmt.Printf("allowed=%v rule=%s\n", d.Allowed, d.Rule)
	}

	exempt := cfg.Match("edge", []rules.Entry{{Key: "remote_address", Value: "127.0.0.1"}})
	fmt.Println("loopback limited:", exempt != nil)
	// Output:
	// limit edge.path_/api/*.user_id (line 11), key "path=/api/orders|user_id=alice"
	// allowed=true rule=minute
	// allowed=true rule=minute
	// allowed=false rule=minute
	// loopback limited: false
}

// Parse reports every problem of a file, each as "file:line: field:
// message"; errors.As reaches each one's fields.
func ExampleParse() {
	_, err := rules.Parse("api.yaml", []byte(`
domain: api
descriptors:
  - key: user_id
    rate_limit: {unit: fortnight, requests_per_unit: 10}
  - key: api_key
    ratelimit: {unit: second, requests_per_unit: 5}
`))
	fmt.Println(err)
	var e *rules.Error
	if errors.As(err, &e) {
		fmt.Printf("first: line %d, field %s\n", e.Line, e.Field)
	}
	// Output:
	// api.yaml:5: descriptors[0].rate_limit.unit: unknown unit "fortnight" (want second, minute, hour, day, week, month or year)
	// api.yaml:7: descriptors[1].ratelimit: unknown field "ratelimit" (did you mean "rate_limit"?)
	// first: line 5, field descriptors[0].rate_limit.unit
}

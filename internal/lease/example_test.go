package lease_test

import (
	"fmt"
	"time"

	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/internal/lease"
)

// A capacity server's table: three clients share 120 under fair share
// (Doorman's worked example). Each refreshes reporting the lease it holds;
// the shares settle at 60, 50 and 10, never more than 120 in all.
func ExampleTable() {
	cfg, err := lease.ParseConfig("resources.yaml", []byte(`
resources:
  - id: "db/*"
    capacity: 120
    algorithm: fair_share
    lease_length: 60s
    refresh_interval: 5s
  - id: "*"
    capacity: 0
`))
	if err != nil {
		panic(err)
	}
	clk := clock.NewManual(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	t := lease.New(cfg, lease.Options{Clock: clk})
	wants := map[string]float64{"a": 1000, "b": 50, "c": 10}
	has := map[string]lease.Lease{}
	for range 3 {
		for _, c := range []string{"a", "b", "c"} {
			out, err := t.Get(c, []lease.Request{{Resource: "db/users", Wants: wants[c], Has: has[c]}}, nil)
			if err != nil {
				panic(err)
			}
			has[c] = out[0]
		}
		clk.Advance(5 * time.Second)
	}
	fmt.Println(has["a"].Capacity, has["b"].Capacity, has["c"].Capacity, t.Outstanding("db/users"))
	// Output: 60 50 10 120
}

// A bad resources file: every problem, with its file:line and field.
func ExampleParseConfig() {
	_, err := lease.ParseConfig("resources.yaml", []byte(`
resources:
  - id: "db/*"
    capacity: 1000
    algoritm: fair_share
    lease_length: 5s
    refresh_interval: 5s
`))
	fmt.Println(err)
	// Output:
	// resources.yaml:3: resources: no "*" default: the last resource must have id "*" (it serves every resource no other id matches)
	// resources.yaml:5: resources[0].algoritm: unknown field "algoritm" (did you mean "algorithm"?)
	// resources.yaml:7: resources[0].refresh_interval: 5s is not shorter than lease_length (5s): a client must refresh before its lease expires
}

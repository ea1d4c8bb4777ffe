package storekit_test

import (
	"fmt"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/storekit"
)

// A store keeps Width words per key and applies each operation to them.
func Example() {
	p := floodgate.MustPolicy("api", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 2, Period: time.Minute})
	state := make([]int64, storekit.Width(p)) // a key never seen: all zero
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
	for range 3 {
		d := storekit.Apply(p, state, now, p.Op(floodgate.OpAllow, "k", 1, 0))
		fmt.Println(d.Allowed, d.Remaining)
	}
	fmt.Println(storekit.Consumption(p, state, now))
	// Output:
	// true 1
	// true 0
	// false 0
	// 1000
}

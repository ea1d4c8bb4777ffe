package throttle_test

import (
	"context"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/memstore"
	"github.com/floodgate/floodgate/throttle"
)

// An elastic limit stretches while the throttler has room and not once
// it is busy: 2 a minute, up to 4 while spare.
func TestSpareFeedsElasticRule(t *testing.T) {
	th := throttle.New(throttle.Config{Limit: 2, MaxQueueCost: time.Second})
	p := floodgate.MustPolicy("elastic", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 2, Period: time.Minute,
		Mode: floodgate.Elastic, ElasticCeiling: 4, Spare: th.Spare(0.5)})
	st, err := memstore.New(memstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	l := floodgate.NewLimiter(p, st)
	allow := func(key string) bool {
		d, err := l.Allow(context.Background(), key)
		if err != nil {
			t.Fatal(err)
		}
		return d.Allowed
	}
	n := 0
	for allow("idle") {
		n++
	}
	if n != 4 {
		t.Fatalf("idle throttler: %d admitted, want the elastic ceiling 4", n)
	}
	k := throttle.RouteKey{Method: "GET", Route: "/"}
	a, _ := th.Enter(k, throttle.Critical, 0) // 1 of 2 in flight: not below half
	n = 0
	for allow("busy") {
		n++
	}
	if n != 2 {
		t.Fatalf("busy throttler: %d admitted, want the limit 2", n)
	}
	a.Done()
}

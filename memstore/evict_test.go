package memstore_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/memstore"
)

// daily is a quota of 1000 a day that one request can spend whole (Envoy's
// hits_addend, AllowN).
func daily(name string, mode floodgate.FailureMode) *floodgate.Policy {
	return floodgate.MustPolicy(name, floodgate.Rule{Name: "day", Algorithm: floodgate.FixedWindow, Limit: 1000, Period: 24 * time.Hour, OnStoreFailure: mode})
}

// The attack (#17, item 2): five keys spend a 1000/day quota,
// then 40,000 new keys each spend theirs whole. At the cap every sampled
// key is as consumed as the spent ones, and the store evicted one of them
// anyway: the five came back with 1000 remaining. A key that constrains
// is never reset by memory pressure, at either cap.
func TestSpentKeysSurviveFloodOfSpentKeys(t *testing.T) {
	for name, opts := range map[string]memstore.Options{
		"MaxKeys":   {MaxKeys: 256, Shards: 4},
		"MaxMemory": {MaxMemory: 64 << 10},
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			clk := clock.NewManual(t0)
			s := newStore(t, opts)
			l := floodgate.NewLimiter(daily("quota", ""), s, floodgate.WithClock(clk))
			for v := range 5 {
				if d, err := l.AllowN(ctx, "victim:"+strconv.Itoa(v), 1000); err != nil || !d.Allowed || d.Remaining != 0 {
					t.Fatalf("victim %d spends its quota: %+v, %v", v, d, err)
				}
			}
			for i := range 40_000 {
				if _, err := l.AllowN(ctx, "flood:"+strconv.Itoa(i), 1000); err != nil {
					t.Fatalf("flood key %d: %v", i, err)
				}
				if i%1000 == 0 {
					clk.Advance(time.Second)
				}
			}
			for v := range 5 {
				d, err := l.PeekN(ctx, "victim:"+strconv.Itoa(v), 1)
				if err != nil || d.Allowed || d.Remaining != 0 {
					t.Errorf("victim %d after the flood: %+v, %v; want still spent (0 remaining)", v, d, err)
				}
			}
		})
	}
}

package floodgate_test

import (
	"context"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/memstore"
)

func TestAllowAllRefundsWhenOneKeyDenies(t *testing.T) {
	ctx := context.Background()
	clk := floodgate.WithClock(clock.NewManual(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)))
	store := memstore.MustNew(memstore.Options{SweepInterval: -1})
	perIP := floodgate.NewLimiter(floodgate.MustPolicy("ip", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 10, Period: time.Minute}), store, clk)
	perUser := floodgate.NewLimiter(floodgate.MustPolicy("user", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 2, Period: time.Minute}), store, clk)
	items := []floodgate.Item{{Limiter: perIP, Key: "198.51.100.9", Cost: 1}, {Limiter: perUser, Key: "user:7", Cost: 1}}
	out := make([]floodgate.Decision, 2)
	for i := range 5 {
		ok, err := floodgate.AllowAll(ctx, items, out)
		if err != nil {
			t.Fatal(err)
		}
		if want := i < 2; ok != want {
			t.Fatalf("request %d: ok=%v, want %v", i, ok, want)
		}
	}
	// Three denied requests consumed nothing from the IP: 2 of 10 used.
	if d, _ := perIP.AllowN(ctx, "198.51.100.9", 0); d.Remaining != 8 {
		t.Fatalf("IP remaining %d, want 8 (denied requests refunded)", d.Remaining)
	}
	if ok, err := floodgate.AllowAll(ctx, nil, nil); err != nil || !ok {
		t.Fatalf("empty batch: %v %v", ok, err)
	}
}

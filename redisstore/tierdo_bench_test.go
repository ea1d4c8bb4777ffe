package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/redistest"
	"github.com/floodgate/floodgate/redisstore"
)

// BenchmarkExactTierDoBreakerOpen is a whole Do of an exact policy that
// answers without the network (Redis down, the breaker open, the rule's
// failure mode refusing): Do's own cost, of which the tiers' lookups are a
// part (BenchmarkExactTierLookups).
//
//	go test -run '^$' -bench 'ExactTier' -benchmem -count 5 ./redisstore/
func BenchmarkExactTierDoBreakerOpen(b *testing.B) {
	srv := redistest.Standalone(b)
	s, err := redisstore.New("redis://"+srv.Addr, redisstore.Options{Timeout: 20 * time.Millisecond, BreakerThreshold: 1, BreakerCooldown: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	pol := floodgate.MustPolicy("exact", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 100, Period: time.Second,
		OnStoreFailure: floodgate.FailClosed})
	ctx := context.Background()
	srv.Kill()
	for range 3 {
		_, _ = s.Do(ctx, 0, pol.Op(floodgate.OpAllow, "k", 1, 0))
	}
	op := pol.Op(floodgate.OpAllow, "k", 1, 0)
	b.ReportAllocs()
	for b.Loop() {
		if d, err := s.Do(ctx, 0, op); err != nil || d.Allowed {
			b.Fatal(d, err)
		}
	}
}

package grpclimit_test

import (
	"google.golang.org/grpc"

	"github.com/floodgate/floodgate/grpclimit"
	"github.com/floodgate/floodgate/inflight"
)

// At most 8 calls in flight per client address; more fail with
// RESOURCE_EXHAUSTED and a retry-after trailer.
func ExampleNewInFlight() {
	slots, _ := inflight.NewMemory(inflight.MemoryOptions{Limit: 8})
	capped, err := grpclimit.NewInFlight(grpclimit.InFlightOptions{Limiter: slots})
	if err != nil {
		panic(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(capped.Unary()), grpc.StreamInterceptor(capped.Stream()))
	_ = srv
}

package grpclimit_test

import (
	"time"

	"google.golang.org/grpc"

	"github.com/floodgate/floodgate/grpclimit"
	"github.com/floodgate/floodgate/throttle"
)

// The server throttler in front of a gRPC server: calls are admitted by
// criticality (metadata x-criticality, capped at CRITICAL: no client is
// trusted to claim more without ThrottleOptions.Trusted), queued by
// predicted cost, shed
// with UNAVAILABLE and a retry-after trailer; the client interceptors
// propagate a handler's level to the calls it makes.
func ExampleNewThrottle() {
	th := throttle.New(throttle.Config{
		Adaptive:     &throttle.AdaptiveConfig{},
		MaxWait:      time.Second,
		MaxQueueCost: 2 * time.Second,
	})
	it, err := grpclimit.NewThrottle(grpclimit.ThrottleOptions{Throttler: th})
	if err != nil {
		panic(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(it.Unary()), grpc.StreamInterceptor(it.Stream()))
	defer srv.Stop()

	unary, stream := grpclimit.ThrottleClient("")
	_ = []grpc.DialOption{grpc.WithUnaryInterceptor(unary), grpc.WithStreamInterceptor(stream)}
	// Output:
}

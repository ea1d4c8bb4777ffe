package grpclimit_test

import (
	"context"
	"fmt"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/gate"
	"github.com/floodgate/floodgate/grpclimit"
	"github.com/floodgate/floodgate/throttle"
)

// The server throttler and a quota together, in the one right order:
// ThrottleOptions.Limiter makes Throttle's interceptors admit a call
// first and only then charge its quota, so a call shed as overload
// (UNAVAILABLE) spends none, and a call over its quota
// (RESOURCE_EXHAUSTED) gives its throttler slot straight back. Install
// Throttle's interceptors only, not the Limiter's as well.
func ExampleThrottleOptions_limiter() {
	perUser := floodgate.MustPolicy("per-user", floodgate.Rule{Algorithm: floodgate.TokenBucket, Limit: 1, Period: time.Minute})
	lim, err := grpclimit.New(grpclimit.Options{Config: gate.Config{Limits: []gate.Limit{
		{Name: "per-user", Policy: perUser, Key: []gate.Part{gate.Header("x-user")}},
	}}})
	if err != nil {
		panic(err)
	}
	defer lim.Close()
	th := throttle.New(throttle.Config{Adaptive: &throttle.AdaptiveConfig{}, MaxQueueCost: time.Second, MaxWait: time.Second})
	it, err := grpclimit.NewThrottle(grpclimit.ThrottleOptions{Throttler: th, Limiter: lim})
	if err != nil {
		panic(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(it.Unary()), grpc.StreamInterceptor(it.Stream()))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	go srv.Serve(ln)
	defer srv.Stop()

	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-user", "alice")
	for range 2 {
		_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		fmt.Println(status.Code(err))
	}
	fmt.Println("in flight:", th.Stats().InFlight)
	// Output:
	// OK
	// ResourceExhausted
	// in flight: 0
}

// Believe the criticality a call claims only from your own services,
// recognized by their mTLS client certificate; any other client may
// lower its level in x-criticality but never raise it above the ceiling
// (here SHEDDABLE_PLUS for every method), so it cannot claim
// CRITICAL_PLUS to jump the queue.
func ExampleThrottleOptions_trusted() {
	th := throttle.New(throttle.Config{Adaptive: &throttle.AdaptiveConfig{}, MaxQueueCost: time.Second})
	it, err := grpclimit.NewThrottle(grpclimit.ThrottleOptions{
		Throttler: th,
		Ceiling:   func(context.Context, string) throttle.Criticality { return throttle.SheddablePlus },
		Trusted: func(ctx context.Context) bool {
			p, ok := peer.FromContext(ctx)
			if !ok {
				return false
			}
			ti, ok := p.AuthInfo.(credentials.TLSInfo) // with grpc.Creds(credentials.NewTLS(...)) requiring client certificates
			return ok && len(ti.State.VerifiedChains) > 0 && ti.State.VerifiedChains[0][0].Subject.CommonName == "frontend.internal"
		},
	})
	if err != nil {
		panic(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(it.Unary()), grpc.StreamInterceptor(it.Stream()))
	defer srv.Stop()
	// Output:
}

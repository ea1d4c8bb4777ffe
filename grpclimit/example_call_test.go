package grpclimit_test

import (
	"context"
	"fmt"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/gate"
	"github.com/floodgate/floodgate/grpclimit"
)

// What a client sees: calls over the limit fail with RESOURCE_EXHAUSTED,
// and every limited call carries the RateLimit fields as trailers. The
// server here is in process (bufconn), limited to 2 calls a minute per API
// key.
func Example_call() {
	clk := clock.NewManual(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	perKey := floodgate.MustPolicy("per-key", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 2, Period: time.Minute})
	lim, err := grpclimit.New(grpclimit.Options{Config: gate.Config{Clock: clk, Limits: []gate.Limit{
		{Name: "per-key", Policy: perKey, Key: []gate.Part{gate.Header("x-api-key")}},
	}}})
	if err != nil {
		panic(err)
	}
	defer lim.Close()

	srv := grpc.NewServer(grpc.UnaryInterceptor(lim.Unary()), grpc.StreamInterceptor(lim.Stream()))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	ln := bufconn.Listen(1 << 20)
	go srv.Serve(ln)
	defer srv.Stop()

	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return ln.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)

	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", "k-123")
	for range 3 {
		var trailer metadata.MD
		_, err := client.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer))
		fmt.Printf("%s %q ratelimit=%s\n", status.Code(err), status.Convert(err).Message(), trailer.Get("ratelimit"))
	}
	// Output:
	// OK "" ratelimit=["per-key";r=1;t=60]
	// OK "" ratelimit=["per-key";r=0;t=60]
	// ResourceExhausted "rate limit exceeded (per-key); retry in 60 s" ratelimit=["per-key";r=0;t=60]
}

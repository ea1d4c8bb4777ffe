package adaptive_test

import (
	"context"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/floodgate/floodgate/adaptive"
	"github.com/floodgate/floodgate/clock"
)

// A real gRPC server that refuses every call with UNAVAILABLE while down:
// the client interceptor drops most calls locally (they never reach the
// server) and, once the server is back, lets them all through again
// within a few windows. Retries stay within the budget.
func TestUnaryInterceptorBacksOffAndRecovers(t *testing.T) {
	var down atomic.Bool
	var arrived atomic.Int64
	refuser := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		arrived.Add(1)
		if down.Load() {
			return nil, status.Error(codes.Unavailable, "overloaded")
		}
		return h(ctx, req)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(refuser))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Stop()

	clk := clock.NewManual(time.Unix(1_000_000, 0))
	th := newThrottle(t, clk, adaptive.Options{Window: 10 * time.Second, RetryRatio: 0.1, MinRetries: 2})
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(adaptive.UnaryClientInterceptor(th, adaptive.GRPCOptions{Retries: 2})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := healthpb.NewHealthClient(conn)
	call := func(n int) (local, ok int) {
		for range n {
			_, err := c.Check(context.Background(), &healthpb.HealthCheckRequest{})
			switch {
			case err == nil:
				ok++
			case status.Code(err) == codes.Unavailable && strings.Contains(status.Convert(err).Message(), "dropped locally"):
				local++
			}
			clk.Advance(10 * time.Millisecond)
		}
		return
	}
	down.Store(true)
	call(1000)
	before := arrived.Load()
	local, _ := call(1000)
	reached := arrived.Load() - before
	if local < 900 || reached > 100 {
		t.Fatalf("server down: %d of 1000 dropped locally, %d calls reached it; want most dropped", local, reached)
	}
	if _, _, firsts, retries := th.Counts(ln.Addr().String()); float64(retries) > 0.1*float64(firsts)+2 {
		t.Fatalf("%d retries for %d first attempts in the window; budget 10%% + 2", retries, firsts)
	}
	down.Store(false)
	for w := 0; ; w++ {
		if _, ok := call(1000); ok == 1000 {
			break
		}
		if w == 8 {
			t.Fatal("still dropping 8 windows after the server recovered")
		}
	}
}

// Streams: a server refusing every stream makes the client drop most
// stream openings locally; back up, they open again.
func TestStreamInterceptorBacksOffAndRecovers(t *testing.T) {
	var down atomic.Bool
	var arrived atomic.Int64
	refuser := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		arrived.Add(1)
		if down.Load() {
			return status.Error(codes.Unavailable, "overloaded")
		}
		return h(srv, ss)
	}
	srv := grpc.NewServer(grpc.StreamInterceptor(refuser))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Stop()
	clk := clock.NewManual(time.Unix(1_000_000, 0))
	th := newThrottle(t, clk, adaptive.Options{Window: 10 * time.Second})
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithStreamInterceptor(adaptive.StreamClientInterceptor(th, adaptive.GRPCOptions{})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := healthpb.NewHealthClient(conn)
	open := func(n int) (local, ok int) {
		for range n {
			ctx, cancel := context.WithCancel(context.Background())
			st, err := c.Watch(ctx, &healthpb.HealthCheckRequest{})
			if err == nil {
				_, err = st.Recv()
			}
			cancel()
			switch {
			case err == nil:
				ok++
			case strings.Contains(status.Convert(err).Message(), "dropped locally"):
				local++
			}
			clk.Advance(20 * time.Millisecond)
		}
		return
	}
	down.Store(true)
	open(500)
	before := arrived.Load()
	local, _ := open(500)
	if local < 450 || arrived.Load()-before > 50 {
		t.Fatalf("server down: %d of 500 dropped locally, %d reached it", local, arrived.Load()-before)
	}
	down.Store(false)
	for w := 0; ; w++ {
		if _, ok := open(500); ok == 500 {
			break
		}
		if w == 8 {
			t.Fatal("still dropping 8 windows after the server recovered")
		}
	}
}

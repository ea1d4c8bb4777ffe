package grpclimit_test

import (
	"context"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/gate"
	"github.com/floodgate/floodgate/grpclimit"
)

// A real grpc-go service (the health service) behind the interceptors.
func start(t *testing.T, limits ...gate.Limit) healthpb.HealthClient {
	t.Helper()
	return serveOpts(t, grpclimit.Options{Config: gate.Config{Limits: limits}})
}

// serveOpts serves the health service behind interceptors made with opts.
func serveOpts(t *testing.T, opts grpclimit.Options) healthpb.HealthClient {
	t.Helper()
	lim, err := grpclimit.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lim.Close)
	srv := grpc.NewServer(grpc.UnaryInterceptor(lim.Unary()), grpc.StreamInterceptor(lim.Stream()))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return healthpb.NewHealthClient(conn)
}

func TestUnaryLimitsPerMetadata(t *testing.T) {
	p, _ := floodgate.NewPolicy("per-user", floodgate.Rule{Algorithm: floodgate.TokenBucket, Limit: 3, Period: time.Hour})
	client := start(t, gate.Limit{Name: "per-user", Policy: p, Match: gate.Match{Path: "/grpc.health.v1.Health/Check"}, Key: []gate.Part{gate.Header("x-user").Or(gate.MissingShared)}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, user := range []string{"alice", "bob"} {
		uctx := metadata.AppendToOutgoingContext(ctx, "x-user", user)
		for i := 0; i < 5; i++ {
			var trailer metadata.MD
			_, err := client.Check(uctx, &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer))
			if i < 3 {
				if err != nil {
					t.Fatalf("%s call %d: %v", user, i, err)
				}
				if got := trailer.Get("ratelimit"); len(got) != 1 || !strings.HasPrefix(got[0], `"per-user";r=`+strconv.Itoa(2-i)+`;t=`) {
					t.Fatalf("%s call %d: ratelimit trailer %v", user, i, got)
				}
				continue
			}
			if status.Code(err) != codes.ResourceExhausted {
				t.Fatalf("%s call %d: %v, want RESOURCE_EXHAUSTED", user, i, err)
			}
			if len(trailer.Get("retry-after")) != 1 || len(trailer.Get("ratelimit-policy")) != 1 {
				t.Fatalf("%s call %d: trailer %v", user, i, trailer)
			}
		}
	}
}

func TestStreamLimited(t *testing.T) {
	p, _ := floodgate.NewPolicy("streams", floodgate.Rule{Algorithm: floodgate.TokenBucket, Limit: 1, Period: time.Hour})
	client := start(t, gate.Limit{Name: "streams", Policy: p, Key: []gate.Part{gate.Method()}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := client.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recv(); err != nil {
		t.Fatalf("first stream: %v", err)
	}
	s2, err := client.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s2.Recv(); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("second stream: %v, want RESOURCE_EXHAUSTED", err)
	}
	// The unary method has its own key.
	if _, err := client.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("unary call: %v", err)
	}
}

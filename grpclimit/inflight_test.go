package grpclimit_test

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/floodgate/floodgate/gate"
	"github.com/floodgate/floodgate/grpclimit"
	"github.com/floodgate/floodgate/inflight"
)

// serveInFlight serves the health service behind an InFlight cap, then an
// interceptor that holds each unary call until hold is closed.
func serveInFlight(t *testing.T, f *grpclimit.InFlight, hold <-chan struct{}, in *atomic.Int64) *grpc.ClientConn {
	t.Helper()
	blocker := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		in.Add(1)
		<-hold
		return h(ctx, req)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(f.Unary(), blocker), grpc.StreamInterceptor(f.Stream()))
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
	return conn
}

// Unary calls past the peer's cap fail with RESOURCE_EXHAUSTED and a
// retry-after trailer and never reach the handler; streams hold a slot
// while open.
func TestInFlightUnaryAndStream(t *testing.T) {
	const limit = 2
	mem, _ := inflight.NewMemory(inflight.MemoryOptions{Limit: limit})
	f, err := grpclimit.NewInFlight(grpclimit.InFlightOptions{Limiter: mem, RetryAfter: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	hold := make(chan struct{})
	var in atomic.Int64
	conn := serveInFlight(t, f, hold, &in)
	c := healthpb.NewHealthClient(conn)
	ctx := context.Background()
	var wg sync.WaitGroup
	for range limit {
		wg.Go(func() {
			if _, err := c.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
				t.Error(err)
			}
		})
	}
	for in.Load() < limit {
		time.Sleep(time.Millisecond)
	}
	var trailer metadata.MD
	_, err = c.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer))
	if status.Code(err) != codes.ResourceExhausted || len(trailer["retry-after"]) != 1 || trailer["retry-after"][0] != "3" {
		t.Fatalf("past the cap: %v, trailer %v; want RESOURCE_EXHAUSTED, retry-after 3", err, trailer)
	}
	if in.Load() != limit {
		t.Fatalf("%d calls reached the handler; want %d", in.Load(), limit)
	}
	close(hold)
	wg.Wait()

	// streams: two open Watch streams hold both slots
	var cancels []context.CancelFunc
	for range limit {
		sctx, cancel := context.WithCancel(ctx)
		cancels = append(cancels, cancel)
		st, err := c.Watch(sctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Recv(); err != nil { // the handler runs: the slot is held
			t.Fatal(err)
		}
	}
	st, err := c.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err == nil {
		_, err = st.Recv()
	}
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("third stream: %v; want RESOURCE_EXHAUSTED", err)
	}
	cancels[0]()
	// the canceled stream's handler returns and gives its slot back
	deadline := time.Now().Add(10 * time.Second)
	for mem.InFlight("127.0.0.1") != limit-1 {
		if time.Now().After(deadline) {
			t.Fatalf("the closed stream's slot never came back: %d held", mem.InFlight("127.0.0.1"))
		}
		time.Sleep(time.Millisecond)
	}
	if _, err := c.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("a call after a stream closed: %v", err)
	}
	cancels[1]()
}

func TestInFlightOptionsErrors(t *testing.T) {
	if _, err := grpclimit.NewInFlight(grpclimit.InFlightOptions{}); err == nil {
		t.Fatal("NewInFlight without a Limiter accepted")
	}
}

func TestInFlightGateKey(t *testing.T) {
	g, err := gate.New(gate.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	key, err := grpclimit.GateKey(g, gate.Header("x-tenant").Or(gate.MissingSkip), gate.Method())
	if err != nil {
		t.Fatal(err)
	}
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-tenant", "acme"))
	if k, ok := key(ctx, "/pkg.S/M"); !ok || k != "acme|/pkg.S/M" {
		t.Fatalf("key %q, %v; want acme|/pkg.S/M", k, ok)
	}
	if _, ok := key(context.Background(), "/pkg.S/M"); ok {
		t.Fatal("a call without x-tenant got a key; MissingSkip leaves it uncapped")
	}
	if _, err := grpclimit.GateKey(g); err == nil {
		t.Fatal("GateKey with no parts accepted")
	}
}

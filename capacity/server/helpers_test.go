package server

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/floodgate/floodgate/capacity/capacitypb"
	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/internal/lease"
)

var t0 = time.Date(2026, 11, 27, 0, 0, 0, 0, time.UTC)

// resource is a test resource: capacity c, algorithm a, lease 10s, refresh 1s.
func resource(id string, c float64, a lease.Algorithm) lease.Resource {
	return lease.Resource{ID: id, Capacity: c, Algorithm: a, LeaseLength: 10 * time.Second,
		RefreshInterval: time.Second, LearningMode: 10 * time.Second, Pos: "test:1"}
}

func config(rs ...lease.Resource) *lease.Config {
	return &lease.Config{Resources: append(rs, resource("*", 10, lease.FairShare))}
}

// serveGRPC serves s over real gRPC on a loopback port and returns a
// client of it.
func serveGRPC(t testing.TB, s *Server) pb.CapacityClient {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	s.Register(gs)
	go gs.Serve(l)
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pb.NewCapacityClient(conn)
}

func newTest(t testing.TB, cfg *lease.Config, opts Options) (*Server, pb.CapacityClient, *clock.Manual) {
	clk := clock.NewManual(t0)
	opts.Clock = clk
	s := New(cfg, opts)
	return s, serveGRPC(t, s), clk
}

// client is a test client that keeps its lease per resource and reports
// it, as the client library does.
type client struct {
	id  string
	c   pb.CapacityClient
	has map[string]*pb.Lease
}

func newClient(id string, c pb.CapacityClient) *client {
	return &client{id: id, c: c, has: map[string]*pb.Lease{}}
}

// get asks for one resource at priority 0 and returns the capacity granted.
func (c *client) get(t testing.TB, resource string, wants float64) float64 {
	t.Helper()
	return c.getP(t, resource, 0, wants)
}

func (c *client) getP(t testing.TB, resource string, prio int64, wants float64) float64 {
	t.Helper()
	resp, err := c.c.GetCapacity(context.Background(), &pb.GetCapacityRequest{ClientId: c.id,
		Resource: []*pb.ResourceRequest{{ResourceId: resource, Priority: prio, Wants: wants, Has: c.has[resource]}}})
	if err != nil {
		t.Fatalf("%s: GetCapacity: %v", c.id, err)
	}
	if resp.Mastership != nil || len(resp.Response) != 1 {
		t.Fatalf("%s: GetCapacity: %v", c.id, resp)
	}
	l := resp.Response[0].Gets
	c.has[resource] = l
	return l.Capacity
}

// holds returns the capacity of the client's unexpired lease at now.
func (c *client) holds(resource string, now time.Time) float64 {
	l := c.has[resource]
	if l == nil || !now.Before(l.Expiry.AsTime()) {
		return 0
	}
	return l.Capacity
}

const eps = 1e-6

func near(a, b float64) bool { return a-b < 1e-3 && b-a < 1e-3 }

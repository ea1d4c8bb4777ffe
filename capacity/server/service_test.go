package server

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/floodgate/floodgate/capacity/capacitypb"
	"github.com/floodgate/floodgate/internal/lease"
)

// TestWorkedExampleOverGRPC: Doorman's worked example through the wire.
// Capacity 120, wants 1000, 50 and 10: fair share converges to 60, 50, 10
// and proportional share to 69.69, 40.31, 10, within a few refreshes, and
// at no refresh do the leases held exceed 120.
func TestWorkedExampleOverGRPC(t *testing.T) {
	for _, tc := range []struct {
		algo lease.Algorithm
		want []float64
	}{
		{lease.FairShare, []float64{60, 50, 10}},
		{lease.ProportionalShare, []float64{69.69, 40.31, 10}},
	} {
		t.Run(string(tc.algo), func(t *testing.T) {
			s, c, clk := newTest(t, config(resource("db", 120, tc.algo)), Options{})
			wants := []float64{1000, 50, 10}
			cs := []*client{newClient("a", c), newClient("b", c), newClient("c", c)}
			var got []float64
			for round := range 5 {
				got = got[:0]
				for i, cl := range cs {
					got = append(got, cl.get(t, "db", wants[i]))
					sum := 0.0
					for _, x := range cs {
						sum += x.holds("db", clk.Now())
					}
					if sum > 120+eps || s.Outstanding("db") > 120+eps {
						t.Fatalf("round %d: clients hold %v, table outstanding %v: over 120", round, sum, s.Outstanding("db"))
					}
				}
				clk.Advance(time.Second)
			}
			for i := range got {
				if math.Abs(got[i]-tc.want[i]) > 0.01 {
					t.Fatalf("got %v, want %v", got, tc.want)
				}
			}
		})
	}
}

// TestValidation: bad input is InvalidArgument naming the field, and
// changes nothing (a good resource in the same call is not granted).
func TestValidation(t *testing.T) {
	s, c, _ := newTest(t, config(resource("db", 100, lease.FairShare)), Options{MaxResources: 3})
	good := &pb.ResourceRequest{ResourceId: "db", Wants: 10}
	past := timestamppb.New(time.Unix(0, 0))
	past.Nanos = -1 // invalid
	for _, tc := range []struct {
		name  string
		req   *pb.GetCapacityRequest
		field string
	}{
		{"no client", &pb.GetCapacityRequest{Resource: []*pb.ResourceRequest{good}}, "client_id: empty"},
		{"long client", &pb.GetCapacityRequest{ClientId: strings.Repeat("x", MaxIDLength+1), Resource: []*pb.ResourceRequest{good}}, "client_id:"},
		{"no resources", &pb.GetCapacityRequest{ClientId: "a"}, "resource: none"},
		{"too many", &pb.GetCapacityRequest{ClientId: "a", Resource: []*pb.ResourceRequest{good, {ResourceId: "b"}, {ResourceId: "c"}, {ResourceId: "d"}}}, "resource: 4 in one call, at most 3"},
		{"empty id", &pb.GetCapacityRequest{ClientId: "a", Resource: []*pb.ResourceRequest{good, {Wants: 1}}}, "resource[1].resource_id: empty"},
		{"duplicate", &pb.GetCapacityRequest{ClientId: "a", Resource: []*pb.ResourceRequest{good, good}}, `resource[1].resource_id: "db" named twice`},
		{"nan wants", &pb.GetCapacityRequest{ClientId: "a", Resource: []*pb.ResourceRequest{good, {ResourceId: "x", Wants: math.NaN()}}}, "resource[1].wants: NaN"},
		{"inf wants", &pb.GetCapacityRequest{ClientId: "a", Resource: []*pb.ResourceRequest{good, {ResourceId: "x", Wants: math.Inf(1)}}}, "resource[1].wants: +Inf"},
		{"negative wants", &pb.GetCapacityRequest{ClientId: "a", Resource: []*pb.ResourceRequest{good, {ResourceId: "x", Wants: -1}}}, "resource[1].wants: -1"},
		{"negative has", &pb.GetCapacityRequest{ClientId: "a", Resource: []*pb.ResourceRequest{good, {ResourceId: "x", Has: &pb.Lease{Capacity: -5}}}}, "resource[1].has.capacity: -5"},
		{"nan has", &pb.GetCapacityRequest{ClientId: "a", Resource: []*pb.ResourceRequest{good, {ResourceId: "x", Has: &pb.Lease{Capacity: math.NaN()}}}}, "resource[1].has.capacity: NaN"},
		{"bad expiry", &pb.GetCapacityRequest{ClientId: "a", Resource: []*pb.ResourceRequest{good, {ResourceId: "x", Has: &pb.Lease{Capacity: 1, Expiry: past}}}}, "resource[1].has.expiry"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.GetCapacity(context.Background(), tc.req)
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tc.field) {
				t.Fatalf("got %v, want InvalidArgument naming %q", err, tc.field)
			}
			if o := s.Outstanding("db"); o != 0 {
				t.Fatalf("a refused call granted %v", o)
			}
		})
	}
	for _, tc := range []struct {
		name  string
		req   *pb.GetServerCapacityRequest
		field string
	}{
		{"no server", &pb.GetServerCapacityRequest{Resource: []*pb.ServerCapacityResourceRequest{{ResourceId: "db"}}}, "server_id: empty"},
		{"band nan", &pb.GetServerCapacityRequest{ServerId: "s", Resource: []*pb.ServerCapacityResourceRequest{{ResourceId: "db", Wants: []*pb.PriorityBandAggregate{{Wants: math.NaN(), NumClients: 1}}}}}, "resource[0].wants[0].wants: NaN"},
		{"band clients", &pb.GetServerCapacityRequest{ServerId: "s", Resource: []*pb.ServerCapacityResourceRequest{{ResourceId: "db", Wants: []*pb.PriorityBandAggregate{{Wants: 1, NumClients: -1}}}}}, "resource[0].wants[0].num_clients: -1"},
		{"server dup", &pb.GetServerCapacityRequest{ServerId: "s", Resource: []*pb.ServerCapacityResourceRequest{{ResourceId: "db"}, {ResourceId: "db"}}}, "resource[1].resource_id"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.GetServerCapacity(context.Background(), tc.req)
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tc.field) {
				t.Fatalf("got %v, want InvalidArgument naming %q", err, tc.field)
			}
		})
	}
	_, err := c.ReleaseCapacity(context.Background(), &pb.ReleaseCapacityRequest{ClientId: "a", ResourceId: []string{"db", ""}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "resource_id[1]: empty") {
		t.Fatalf("release: %v", err)
	}
	if n := refusals(t, s, "", ReasonInvalid); n != 17 {
		t.Fatalf("refusals{reason=invalid_argument} = %v, want every refusal counted", n)
	}
}

// TestNotMasterRedirects: a replica that is not the master grants nothing
// and names the master; Discovery says the same.
func TestNotMasterRedirects(t *testing.T) {
	s, c, _ := newTest(t, config(resource("db", 100, lease.FairShare)), Options{Replica: true})
	d, err := c.Discovery(context.Background(), &pb.DiscoveryRequest{})
	if err != nil || d.IsMaster || d.Mastership.GetMasterAddress() != "" {
		t.Fatalf("replica before any election: %v %v", d, err)
	}
	s.SetMastership(false, "10.0.0.1:8081")
	resp, err := c.GetCapacity(context.Background(), &pb.GetCapacityRequest{ClientId: "a",
		Resource: []*pb.ResourceRequest{{ResourceId: "db", Wants: 10}}})
	if err != nil || resp.Mastership.GetMasterAddress() != "10.0.0.1:8081" || len(resp.Response) != 0 {
		t.Fatalf("GetCapacity on a replica: %v %v, want a redirect and no lease", resp, err)
	}
	sr, err := c.GetServerCapacity(context.Background(), &pb.GetServerCapacityRequest{ServerId: "s",
		Resource: []*pb.ServerCapacityResourceRequest{{ResourceId: "db", Wants: []*pb.PriorityBandAggregate{{Wants: 5, NumClients: 1}}}}})
	if err != nil || sr.Mastership.GetMasterAddress() != "10.0.0.1:8081" || len(sr.Response) != 0 {
		t.Fatalf("GetServerCapacity on a replica: %v %v", sr, err)
	}
	if o := s.Outstanding("db"); o != 0 {
		t.Fatalf("replica granted %v", o)
	}
	d, _ = c.Discovery(context.Background(), &pb.DiscoveryRequest{})
	if d.IsMaster || d.Mastership.GetMasterAddress() != "10.0.0.1:8081" {
		t.Fatalf("Discovery: %v", d)
	}
	if n := refusals(t, s, "", ReasonNotMaster); n != 2 {
		t.Fatalf("refusals{not_master} = %v, want 2", n)
	}
	// Elected: it grants, in learning mode (a newcomer gets 0 until
	// learning ends; one reporting a lease gets it back).
	s.SetMastership(true, "me:1")
	if g := newClient("new", c).get(t, "db", 10); g != 0 {
		t.Fatalf("a newcomer got %v in learning mode", g)
	}
	old := newClient("old", c)
	old.has["db"] = &pb.Lease{Capacity: 30, Expiry: timestamppb.New(t0.Add(5 * time.Second))}
	if g := old.get(t, "db", 50); !near(g, 30) {
		t.Fatalf("a client reporting 30 got %v back in learning mode", g)
	}
	d, _ = c.Discovery(context.Background(), &pb.DiscoveryRequest{})
	if !d.IsMaster {
		t.Fatalf("Discovery on the master: %v", d)
	}
}

// TestReleaseFreesCapacity: a released lease's capacity goes to another
// client at once, not after it expires.
func TestReleaseFreesCapacity(t *testing.T) {
	s, c, _ := newTest(t, config(resource("db", 100, lease.FairShare)), Options{})
	a, b := newClient("a", c), newClient("b", c)
	if g := a.get(t, "db", 100); g != 100 {
		t.Fatalf("a got %v", g)
	}
	if g := b.get(t, "db", 100); g != 0 {
		t.Fatalf("b got %v while a holds everything", g)
	}
	if _, err := c.ReleaseCapacity(context.Background(), &pb.ReleaseCapacityRequest{ClientId: "a", ResourceId: []string{"db"}}); err != nil {
		t.Fatal(err)
	}
	if o := s.Outstanding("db"); o != 0 {
		t.Fatalf("outstanding %v after release", o)
	}
	if g := b.get(t, "db", 100); g != 100 {
		t.Fatalf("b got %v after a released", g)
	}
}

// TestServerCapacityBands: child servers are clients whose demand comes by
// band; a higher band is served first, and the grants never exceed the
// capacity.
func TestServerCapacityBands(t *testing.T) {
	s, c, clk := newTest(t, config(resource("db", 120, lease.FairShare)), Options{})
	ask := func(id string, prio int64, wants float64, has *pb.Lease) *pb.Lease {
		resp, err := c.GetServerCapacity(context.Background(), &pb.GetServerCapacityRequest{ServerId: id,
			Resource: []*pb.ServerCapacityResourceRequest{{ResourceId: "db", Has: has,
				Wants: []*pb.PriorityBandAggregate{{Priority: prio, NumClients: 3, Wants: wants}}}}})
		if err != nil || len(resp.Response) != 1 {
			t.Fatalf("%s: %v %v", id, resp, err)
		}
		return resp.Response[0].Gets
	}
	var hi, lo *pb.Lease
	for range 4 {
		hi = ask("high", 10, 100, hi)
		lo = ask("low", 0, 100, lo)
		if sum := hi.Capacity + lo.Capacity; sum > 120+eps {
			t.Fatalf("servers granted %v + %v > 120", hi.Capacity, lo.Capacity)
		}
		clk.Advance(time.Second)
	}
	if !near(hi.Capacity, 100) || !near(lo.Capacity, 20) {
		t.Fatalf("high band got %v, low %v; want 100 and 20", hi.Capacity, lo.Capacity)
	}
	if o := s.Outstanding("db"); o > 120+eps {
		t.Fatalf("outstanding %v", o)
	}
}

// TestTooManyClients: beyond the table's bound a new client gets
// ResourceExhausted and is counted, and the clients already in keep
// being served.
func TestTooManyClients(t *testing.T) {
	s, c, _ := newTest(t, config(resource("db", 100, lease.FairShare)), Options{MaxClients: 5})
	for i := range 5 {
		newClient(fmt.Sprint("c", i), c).get(t, "db", 1)
	}
	_, err := c.GetCapacity(context.Background(), &pb.GetCapacityRequest{ClientId: "one-too-many",
		Resource: []*pb.ResourceRequest{{ResourceId: "db", Wants: 1}}})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("got %v, want ResourceExhausted", err)
	}
	if n := refusals(t, s, "db", ReasonTooManyClients); n != 1 {
		t.Fatalf("refusals{db,too_many_clients} = %v", n)
	}
	newClient("c0", c).get(t, "db", 1)
}

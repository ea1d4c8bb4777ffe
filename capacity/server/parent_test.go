package server

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/internal/lease"
)

func dial(addr string) (*grpc.ClientConn, error) {
	return grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
}

func listen(t testing.TB, s *Server) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	s.Register(gs)
	go gs.Serve(l)
	t.Cleanup(gs.Stop)
	return l.Addr().String()
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within 10s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestIntermediate: two intermediate servers under one root, each with
// clients wanting more than there is. No intermediate grants more than
// its parent granted it, no client lease outlives its intermediate's
// parent lease, the intermediates together never hold more than the
// root's capacity, and the root's capacity ends up shared.
func TestIntermediate(t *testing.T) {
	clk := clock.NewManual(t0)
	root := New(config(resource("db", 100, lease.FairShare)), Options{Clock: clk})
	rootAddr := listen(t, root)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var regions []*Server
	var clients [][]*client
	for i, id := range []string{"r1", "r2"} {
		r := New(config(resource("db", 100, lease.FairShare)), Options{Clock: clk, Intermediate: true})
		go r.RunParent(ctx, ParentOptions{Address: rootAddr, ID: id, Dial: dial, Poll: time.Millisecond})
		c := serveGRPC(t, r)
		regions = append(regions, r)
		clients = append(clients, []*client{newClient("a", c), newClient("b", c)})
		if g := clients[i][0].get(t, "db", 80); g != 0 {
			t.Fatalf("%s granted %v before its parent answered", id, g)
		}
	}
	parentLease := func(r *Server) lease.Lease {
		for _, d := range r.table.Demand() {
			if d.Resource == "db" {
				return d.Has
			}
		}
		return lease.Lease{}
	}
	// What the leaves may use, summed over the regions, never exceeds the
	// root's capacity (nor does the root's own account).
	check := func(step int) {
		sum := 0.0
		for i := range regions {
			for _, cl := range clients[i] {
				sum += cl.holds("db", clk.Now())
			}
		}
		if o := root.Outstanding("db"); o > 100+eps || sum > 100+eps {
			t.Fatalf("step %d: leaves hold %v, root outstanding %v: over 100", step, sum, o)
		}
	}
	for step := range 40 {
		for i, r := range regions {
			if step == 0 {
				waitUntil(t, "a parent lease", func() bool { return parentLease(r).Capacity > 0 })
			}
			// At step 17 the second region's clients move to a higher
			// priority band: the root takes its grant away from the first
			// region, whose second client refreshes every 16th step only
			// (8 s, eight of the parent's refresh intervals) and so sits
			// on its older, larger lease meanwhile.
			prio := int64(0)
			if i == 1 && step >= 17 {
				prio = 10
			}
			for j, cl := range clients[i] {
				if j == 1 && step%16 != 0 {
					continue
				}
				cl.getP(t, "db", prio, 80)
				pl := parentLease(r) // read after: the loop may renew it meanwhile, never shorten it
				if exp := cl.has["db"].Expiry.AsTime(); cl.has["db"].Capacity > 0 && exp.After(pl.Expiry) {
					t.Fatalf("step %d: a client lease ends %v, after its server's parent lease %v", step, exp, pl.Expiry)
				}
				check(step)
			}
		}
		if testing.Verbose() {
			t.Logf("step %d: r1 %v/%v r2 %v/%v root %v leaves %v %v %v %v", step, regions[0].Outstanding("db"), parentLease(regions[0]).Capacity, regions[1].Outstanding("db"), parentLease(regions[1]).Capacity, root.Outstanding("db"), clients[0][0].holds("db", clk.Now()), clients[0][1].holds("db", clk.Now()), clients[1][0].holds("db", clk.Now()), clients[1][1].holds("db", clk.Now()))
		}
		for range 10 { // the parent loops ask meanwhile
			clk.Advance(50 * time.Millisecond)
			time.Sleep(time.Millisecond)
			check(step)
		}
	}
	if o := root.Outstanding("db"); o < 99 {
		t.Fatalf("root outstanding %v: the demand of 320 never got the capacity of 100", o)
	}
}

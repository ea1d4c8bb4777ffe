package server

import (
	"context"
	"fmt"
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
	tr := &tree{t: t, clk: clk, root: New(config(resource("db", 100, lease.FairShare)), Options{Clock: clk})}
	rootAddr := listen(t, tr.root)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i, id := range []string{"r1", "r2"} {
		r := New(config(resource("db", 100, lease.FairShare)), Options{Clock: clk, Intermediate: true})
		go r.RunParent(ctx, ParentOptions{Address: rootAddr, ID: id, Dial: dial, Poll: time.Millisecond})
		c := serveGRPC(t, r)
		tr.regions = append(tr.regions, r)
		tr.clients = append(tr.clients, []*client{newClient("a", c), newClient("b", c)})
		if g := tr.clients[i][0].get(t, "db", 80); g != 0 {
			t.Fatalf("%s granted %v before its parent answered", id, g)
		}
	}
	for i := range tr.regions {
		waitUntil(t, "a parent lease", func() bool { return parentLease(tr.regions[i]).Capacity > 0 })
	}
	for step := range 40 {
		for i := range tr.regions {
			tr.step(step, i)
		}
		if testing.Verbose() {
			t.Logf("step %d: %s", step, tr)
		}
		for range 10 { // the parent loops ask meanwhile
			clk.Advance(50 * time.Millisecond)
			time.Sleep(time.Millisecond)
			tr.check(step)
		}
	}
	if o := tr.root.Outstanding("db"); o < 99 {
		t.Fatalf("root outstanding %v: the demand of 320 never got the capacity of 100", o)
	}
}

// tree is TestIntermediate's: a root, its regions, their clients.
type tree struct {
	t       *testing.T
	clk     *clock.Manual
	root    *Server
	regions []*Server
	clients [][]*client
}

func parentLease(r *Server) lease.Lease {
	for _, d := range r.table.Demand() {
		if d.Resource == "db" {
			return d.Has
		}
	}
	return lease.Lease{}
}

// step has region i's clients ask. At step 17 the second region's
// clients move to a higher priority band: the root takes its grant away
// from the first region, whose second client refreshes every 16th step
// only (8 s, eight of the parent's refresh intervals) and so sits on its
// older, larger lease meanwhile.
func (tr *tree) step(step, i int) {
	prio := int64(0)
	if i == 1 && step >= 17 {
		prio = 10
	}
	for j, cl := range tr.clients[i] {
		if j == 1 && step%16 != 0 {
			continue
		}
		cl.getP(tr.t, "db", prio, 80)
		pl := parentLease(tr.regions[i]) // read after: the loop may renew it meanwhile, never shorten it
		if exp := cl.has["db"].Expiry.AsTime(); cl.has["db"].Capacity > 0 && exp.After(pl.Expiry) {
			tr.t.Fatalf("step %d: a client lease ends %v, after its server's parent lease %v", step, exp, pl.Expiry)
		}
		tr.check(step)
	}
}

// check: what the leaves may use, summed over the regions, never exceeds
// the root's capacity (nor does the root's own account).
func (tr *tree) check(step int) {
	sum := 0.0
	for i := range tr.regions {
		for _, cl := range tr.clients[i] {
			sum += cl.holds("db", tr.clk.Now())
		}
	}
	if o := tr.root.Outstanding("db"); o > 100+eps || sum > 100+eps {
		tr.t.Fatalf("step %d: leaves hold %v, root outstanding %v: over 100", step, sum, o)
	}
}

func (tr *tree) String() string {
	s := fmt.Sprintf("root %v", tr.root.Outstanding("db"))
	for i, r := range tr.regions {
		s += fmt.Sprintf("; region %d %v of %v, clients", i, r.Outstanding("db"), parentLease(r).Capacity)
		for _, cl := range tr.clients[i] {
			s += fmt.Sprintf(" %v", cl.holds("db", tr.clk.Now()))
		}
	}
	return s
}

// TestParentReplicas: an intermediate given its parent's two replicas
// follows the redirect of the one that is not the master, and when the
// master goes and the other replica is elected, moves to it and is
// granted again (learning mode gives it back what it reports holding).
func TestParentReplicas(t *testing.T) {
	clk := clock.NewManual(t0)
	a := New(config(resource("db", 100, lease.FairShare)), Options{Clock: clk, Replica: true})
	b := New(config(resource("db", 100, lease.FairShare)), Options{Clock: clk})
	addrA := listen(t, a)
	lb, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gsB := grpc.NewServer()
	b.Register(gsB)
	go gsB.Serve(lb)
	defer gsB.Stop()
	addrB := lb.Addr().String()
	a.SetMastership(false, addrB)

	mid := New(config(resource("db", 100, lease.FairShare)), Options{Clock: clk, Intermediate: true})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go mid.RunParent(ctx, ParentOptions{Address: addrA + "," + addrB, ID: "mid", Dial: dial, Poll: time.Millisecond})
	cl := newClient("c", serveGRPC(t, mid))
	cl.get(t, "db", 30)
	waitUntil(t, "a lease from the master through the redirect", func() bool { return b.Outstanding("db") == 30 })
	if a.Outstanding("db") != 0 {
		t.Fatal("the replica granted")
	}
	gsB.Stop() // the master goes; the replica is elected
	a.SetMastership(true, addrA)
	var advanced time.Duration
	waitUntil(t, "a lease from the new master", func() bool {
		// Past the retry after the failure (1s), but never so far that the
		// leases (60s) expire while a busy host delays the failover.
		if advanced < 30*time.Second {
			clk.Advance(100 * time.Millisecond)
			advanced += 100 * time.Millisecond
		}
		return a.Outstanding("db") == 30
	})
	if g := cl.get(t, "db", 30); g != 30 {
		t.Fatalf("the client got %v through the new master, want 30", g)
	}
}

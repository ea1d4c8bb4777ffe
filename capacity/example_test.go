package capacity_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"time"

	"google.golang.org/grpc"

	"github.com/floodgate/floodgate/capacity"
	"github.com/floodgate/floodgate/capacity/server"
	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/internal/lease"
)

// serve starts a capacity server on a loopback port, as `floodgate serve
// --resources FILE` would, and returns its address and a function that
// stops it.
func serve(clk *clock.Manual) (string, func()) {
	cfg, err := lease.ParseConfig("resources.yaml", []byte(`resources:
  - id: db/writes
    capacity: 100
    algorithm: fair_share
    lease_length: 60s
    refresh_interval: 5s
  - id: "*"
    capacity: 10
`))
	if err != nil {
		log.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	gs := grpc.NewServer()
	server.New(cfg, server.Options{Clock: clk}).Register(gs)
	go gs.Serve(ln)
	return ln.Addr().String(), gs.Stop
}

// A process takes a share of a resource's global capacity and keeps under
// it with the resource's limiter. (The manual clock makes the output
// exact; leave ClientOptions.Clock out in production.)
func Example() {
	clk := clock.NewManual(time.Date(2026, 11, 27, 0, 0, 0, 0, time.UTC))
	addr, stop := serve(clk)
	defer stop()
	ctx := context.Background()

	c, err := capacity.New(capacity.ClientOptions{Addrs: []string{addr}, Clock: clk})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close(ctx) // gives the lease back

	writes, err := c.Resource("db/writes", capacity.Options{Wants: 40, Mode: capacity.Safe})
	if err != nil {
		log.Fatal(err)
	}
	// The client refreshes in the background; Refresh waits for a lease.
	if err := c.Refresh(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("capacity:", writes.Capacity())

	admitted := 0
	for range 100 {
		if d, err := writes.Allow(ctx); err == nil && d.Allowed {
			admitted++ // write
		}
	}
	fmt.Println("admitted at once:", admitted)
	// Output:
	// capacity: 40
	// admitted at once: 40
}

// When the servers cannot be reached, the lease runs on until it expires;
// then the mode decides. Safe mode uses the safe capacity the last lease
// carried: here the capacity divided by the two clients.
func ExampleMode() {
	clk := clock.NewManual(time.Date(2026, 11, 27, 0, 0, 0, 0, time.UTC))
	addr, stop := serve(clk)
	ctx := context.Background()
	var cs []*capacity.Client
	var rs []*capacity.Resource
	for range 2 {
		c, err := capacity.New(capacity.ClientOptions{Addrs: []string{addr}, Clock: clk})
		if err != nil {
			log.Fatal(err)
		}
		defer c.Close(ctx)
		r, err := c.Resource("db/writes", capacity.Options{Wants: 80, Mode: capacity.Safe})
		if err != nil {
			log.Fatal(err)
		}
		cs, rs = append(cs, c), append(rs, r)
	}
	for range 2 { // two rounds: the second one's leases count both clients
		for _, c := range cs {
			if err := c.Refresh(ctx); err != nil {
				log.Fatal(err)
			}
		}
	}
	l, _ := rs[0].Lease()
	fmt.Println("leased:", rs[0].Leased(), "safe capacity:", l.Safe)

	stop() // every server gone
	clk.Set(l.Expiry)
	fmt.Println("leased:", rs[0].Leased(), "capacity:", rs[0].Capacity())
	// Output:
	// leased: true safe capacity: 50
	// leased: false capacity: 50
}

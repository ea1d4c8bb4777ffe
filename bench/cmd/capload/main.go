// Command capload measures the GetCapacity throughput of one capacity
// server (capacity/server, floodgate.capacity.v1.Capacity) over real gRPC:
// N clients, each with its own client id and its lease, refreshing it
// (reporting the lease they hold, as the client library does) as fast as
// W workers over C connections can send, for a duration. In the same run it
// measures Discovery, a call that does no work, over the same connections:
// the gRPC ceiling of this machine, to read GetCapacity's figure against.
//
//	go run ./cmd/capload                              # an in-process server on a loopback port
//	go run ./cmd/capload -clients 10000 -workers 64 -duration 5s
//	go run ./cmd/capload -addr 127.0.0.1:8081        # a running `floodgate serve --resources FILE` (resource "db")
//
// It checks, after each run, that the capacity granted never exceeded the
// resource's (the server's own figure, in-process only).
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"runtime/pprof"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/floodgate/floodgate/capacity/capacitypb"
	"github.com/floodgate/floodgate/capacity/server"
	"github.com/floodgate/floodgate/internal/lease"
)

const resources = `resources:
  - id: db
    capacity: 100000
    algorithm: fair_share
    lease_length: 60s
    refresh_interval: 5s
  - id: "*"
    capacity: 0
`

func main() {
	addr := flag.String("addr", "", "the server's gRPC address (default: start one in this process on a loopback port)")
	clients := flag.Int("clients", 1000, "distinct clients (client ids), each with its own lease")
	workers := flag.Int("workers", 32, "concurrent callers")
	conns := flag.Int("conns", 4, "gRPC connections shared by the callers")
	duration := flag.Duration("duration", 5*time.Second, "length of each measurement")
	resource := flag.String("resource", "db", "the resource asked for")
	pid := flag.Int("pid", 0, "the server's process id (with -addr, Linux): report its CPU time per request in each run, read from /proc")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of this process (the in-process server's included) to this file")
	flag.Parse()
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "capload:", err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}
	if err := run(*addr, *clients, *workers, *conns, *duration, *resource, *pid); err != nil {
		fmt.Fprintln(os.Stderr, "capload:", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

func run(addr string, nClients, workers, nConns int, d time.Duration, resource string, pid int) error {
	var srv *server.Server
	if addr == "" {
		cfg, err := lease.ParseConfig("capload", []byte(resources))
		if err != nil {
			return err
		}
		srv = server.New(cfg, server.Options{MaxClients: nClients + 1000})
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		gs := grpc.NewServer()
		srv.Register(gs)
		go gs.Serve(l)
		defer gs.Stop()
		addr = l.Addr().String()
	}
	cs := make([]pb.CapacityClient, nConns)
	for i := range cs {
		cn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return err
		}
		defer cn.Close()
		cs[i] = pb.NewCapacityClient(cn)
	}
	leases := make([]*pb.Lease, nClients)
	ids := make([]string, nClients) // built once: the generator's own cost is CPU the server shares
	for i := range ids {
		ids[i] = fmt.Sprint("client-", i)
	}
	var mu []sync.Mutex = make([]sync.Mutex, nClients)
	get := func(ctx context.Context, w, i int) error {
		id := i % nClients
		mu[id].Lock()
		has := leases[id]
		mu[id].Unlock()
		resp, err := cs[w%nConns].GetCapacity(ctx, &pb.GetCapacityRequest{ClientId: ids[id],
			Resource: []*pb.ResourceRequest{{ResourceId: resource, Wants: float64(1 + id%200), Has: has}}})
		if err != nil {
			return err
		}
		if resp.Mastership != nil {
			return fmt.Errorf("%s is not the master (it names %q)", addr, resp.Mastership.MasterAddress)
		}
		mu[id].Lock()
		leases[id] = resp.Response[0].Gets
		mu[id].Unlock()
		return nil
	}
	discovery := func(ctx context.Context, w, i int) error {
		_, err := cs[w%nConns].Discovery(ctx, &pb.DiscoveryRequest{})
		return err
	}
	// Every client once, so that the measured run refreshes leases held.
	for i := range nClients {
		if err := get(context.Background(), i, i); err != nil {
			return err
		}
	}
	fmt.Printf("server %s, %d clients, %d workers, %d connections, %v per run, GOMAXPROCS %d\n", addr, nClients, workers, nConns, d, runtimeProcs())
	for _, m := range []struct {
		name string
		f    func(context.Context, int, int) error
	}{{"GetCapacity", get}, {"Discovery", discovery}, {"GetCapacity", get}} {
		var cpu0 time.Duration
		if pid > 0 {
			var err error
			if cpu0, err = cpuTime(pid); err != nil {
				return err
			}
		}
		r := measure(workers, d, m.f)
		fmt.Printf("%-12s %9.0f requests/s  p50 %-9v p99 %-9v errors %d", m.name, r.perSec, r.p50, r.p99, r.errs)
		if pid > 0 {
			cpu1, err := cpuTime(pid)
			if err != nil {
				return err
			}
			fmt.Printf("  server CPU %.1f µs/request", float64((cpu1-cpu0).Microseconds())/float64(r.n))
		}
		fmt.Println()
	}
	if srv != nil {
		if o := srv.Outstanding(resource); o > 100000+1e-6 {
			return fmt.Errorf("over-grant: %v outstanding of 100000", o)
		}
		fmt.Printf("outstanding %.0f of 100000 (never more)\n", srv.Outstanding(resource))
	}
	return nil
}

type result struct {
	perSec   float64
	n        int // requests answered
	p50, p99 time.Duration
	errs     int64
}

func measure(workers int, d time.Duration, call func(context.Context, int, int) error) result {
	var next, errs atomic.Int64
	lat := make([][]time.Duration, workers)
	start := time.Now()
	deadline := start.Add(d)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			ctx := context.Background()
			for time.Now().Before(deadline) {
				i := int(next.Add(1))
				t := time.Now()
				if err := call(ctx, w, i); err != nil {
					errs.Add(1)
					continue
				}
				lat[w] = append(lat[w], time.Since(t))
			}
		})
	}
	wg.Wait()
	el := time.Since(start)
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	slices.Sort(all)
	r := result{perSec: float64(len(all)) / el.Seconds(), n: max(1, len(all)), errs: errs.Load()}
	if len(all) > 0 {
		r.p50, r.p99 = all[len(all)/2], all[len(all)*99/100]
	}
	return r
}

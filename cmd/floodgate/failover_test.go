package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/floodgate/floodgate/capacity/capacitypb"
	"github.com/floodgate/floodgate/internal/etcdtest"
)

func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return "127.0.0.1:" + strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

// discovery asks addr who the master is ("" and false on an error).
func discovery(addr string) (isMaster bool, master string) {
	cn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return false, ""
	}
	defer cn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	d, err := pb.NewCapacityClient(cn).Discovery(ctx, &pb.DiscoveryRequest{})
	if err != nil {
		return false, ""
	}
	return d.IsMaster, d.Mastership.GetMasterAddress()
}

// agreedMaster returns the index of the master all the live replicas name
// (-1 if they do not agree yet).
func agreedMaster(addrs []string, dead map[int]bool) int {
	who, named := -1, ""
	for i, a := range addrs {
		if dead[i] {
			continue
		}
		m, master := discovery(a)
		if master == "" || (named != "" && master != named) {
			return -1
		}
		named = master
		if m {
			if addrs[i] != master {
				return -1
			}
			who = i
		}
	}
	return who
}

// TestServeCapacityFailover: three `floodgate serve` replicas elect a
// master through a real etcd; clients that know all three (and start on a
// replica that is not the master) follow the redirect and hold leases.
// Under that load the master is killed with SIGKILL. A new master is
// elected; no client that held a lease loses it (learning mode gives back
// what each reports), the clients follow the new redirect, and at no
// sample does the capacity in the clients' unexpired leases, or any
// replica's granted metric, exceed the capacity. After learning mode the
// leases converge again.
func TestServeCapacityFailover(t *testing.T) {
	etcd := etcdtest.Start(t)
	file := filepath.Join(t.TempDir(), "resources.yaml")
	writeFile(t, file, resourcesFile(100, "4s", "300ms"))
	const n = 3
	addrs := make([]string, n)
	servers := make([]*server, n)
	for i := range n {
		addrs[i] = freeAddr(t)
		servers[i] = capServer(t, file, "--grpc-addr", addrs[i], "--etcd", etcd.ClientURL, "--advertise", addrs[i], "--etcd-ttl", "1")
	}
	var master int
	waitFor(t, "an agreed master", func() bool { master = agreedMaster(addrs, nil); return master >= 0 })
	var clients []*leaseClient
	for i := range 8 {
		c := newLeaseClient(t, fmt.Sprint("client-", i), "db", 20, addrs...)
		c.at = (master + 1 + i%2) % n // a replica: it must follow the redirect
		clients = append(clients, c)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, c := range clients {
		wg.Go(func() { c.run(stop, 300*time.Millisecond) })
	}
	var stopOnce sync.Once
	stopClients := func() { stopOnce.Do(func() { close(stop); wg.Wait() }) }
	defer stopClients()
	// Fair shares first (12.5 each): a new master that trusted nobody would
	// then hand the first clients to ask 20 each while the others still
	// hold 12.5 from the old one.
	waitFor(t, "fair shares of 12.5", func() bool {
		for _, c := range clients {
			if h := c.holds(time.Now()); h < 12.4 || h > 12.6 {
				return false
			}
		}
		return true
	})

	fs := &failoverSampler{clients: clients, servers: servers, kept: map[*leaseClient]bool{},
		killed: make(chan struct{}), done: make(chan struct{})}
	held := fs.start()
	servers[master].cmd.Process.Kill() // SIGKILL: no resignation
	<-servers[master].done
	close(fs.killed)
	killedAt := time.Now()
	dead := map[int]bool{master: true}
	var next int
	waitFor(t, "a new master", func() bool { next = agreedMaster(addrs, dead); return next >= 0 })
	t.Logf("master %d killed; replica %d master after %v", master, next, time.Since(killedAt))
	// Every client asks the new master (learning mode), then learning ends
	// (4s) and the leases converge again.
	waitFor(t, "every client served by the new master", func() bool {
		for _, c := range clients {
			c.mu.Lock()
			e := c.has.GetExpiry().AsTime()
			c.mu.Unlock()
			if !e.After(killedAt.Add(4 * time.Second)) {
				return false
			}
		}
		return true
	})
	waitFor(t, "leases converging after learning", func() bool { return sumHolds(clients, time.Now()) >= 95 })
	close(fs.done)
	fs.wg.Wait()
	stopClients()
	for _, c := range clients {
		if c.redirects == 0 {
			t.Errorf("%s, started on a replica, was never redirected", c.id)
		}
	}
	if held != len(clients) {
		t.Fatalf("only %d of %d clients held a lease before the kill", held, len(clients))
	}
	if over := fs.over; len(over) > 0 {
		t.Fatalf("%d violations, the first: %v", len(over), over[:min(5, len(over))])
	}
	if g, ok := grantedMetric(servers[next].http); !ok || g > 100+1e-6 {
		t.Fatalf("new master's granted metric %v %v", g, ok)
	}
	t.Logf("%d clients kept their leases through the failover", held)
}

// failoverSampler checks, every 5ms, that the clients' leases sum to at
// most 100, every 50ms that no live replica's granted metric exceeds it,
// and, once killed is closed, that every client that held a lease still
// holds one.
type failoverSampler struct {
	clients []*leaseClient
	servers []*server
	killed  chan struct{}
	done    chan struct{}
	wg      sync.WaitGroup

	mu   sync.Mutex
	kept map[*leaseClient]bool
	over []string // the violations seen
}

// start notes the clients holding a lease now, starts sampling, and
// returns how many hold one.
func (f *failoverSampler) start() int {
	for _, c := range f.clients {
		if c.holds(time.Now()) > 0 {
			f.kept[c] = true
		}
	}
	f.wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-f.done:
				return
			case <-time.After(5 * time.Millisecond):
			}
			f.sample(i%10 == 0)
		}
	})
	return len(f.kept)
}

func (f *failoverSampler) violation(format string, args ...any) {
	f.mu.Lock()
	f.over = append(f.over, fmt.Sprintf(format, args...))
	f.mu.Unlock()
}

func (f *failoverSampler) sample(metrics bool) {
	now := time.Now()
	if s := sumHolds(f.clients, now); s > 100+1e-6 {
		f.violation("%v: leases sum to %v", now, s)
	}
	select {
	case <-f.killed:
		for c := range f.kept {
			if c.holds(now) == 0 {
				f.violation("%v: %s lost its lease", now, c.id)
				delete(f.kept, c)
			}
		}
	default:
	}
	if !metrics {
		return
	}
	for j, s := range f.servers {
		select {
		case <-s.done:
			continue
		default:
		}
		if g, ok := grantedMetric(s.http); ok && g > 100+1e-6 {
			f.violation("%v: replica %d's granted metric %v", now, j, g)
		}
	}
}

// grantedMetric reads floodgate_capacity_granted{resource="db"} from a
// server's /metrics (false if absent or unreachable).
func grantedMetric(httpAddr string) (float64, bool) {
	v, err := scrape(httpAddr, `floodgate_capacity_granted{resource="db"}`)
	return v, err == nil
}

// scrape reads one series from a server's /metrics.
func scrape(httpAddr, name string) (float64, error) {
	c := &http.Client{Timeout: time.Second}
	resp, err := c.Get("http://" + httpAddr + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return strconv.ParseFloat(v, 64)
		}
	}
	return 0, fmt.Errorf("no %s", name)
}

package main

import (
	"bytes"
	"context"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pb "github.com/floodgate/floodgate/capacity/capacitypb"
)

// resourcesFile is a resources file: resource db of capacity c, with the
// given lease length and refresh interval.
func resourcesFile(c float64, leaseLen, refresh string) string {
	return fmt.Sprintf(`resources:
  - id: db
    capacity: %v
    algorithm: fair_share
    lease_length: %s
    refresh_interval: %s
  - id: "*"
    capacity: 0
`, c, leaseLen, refresh)
}

func writeFile(t *testing.T, path, body string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil { // whole, never half-written
		t.Fatal(err)
	}
}

// leaseClient is a test client of the Capacity service: it keeps its
// lease and reports it, follows master redirects, and moves to the next
// server when one fails, as the client library's bottom half does.
type leaseClient struct {
	id, resource string
	addrs        []string
	at           int // index in addrs of the server asked
	conns        map[string]*grpc.ClientConn
	redirects    int

	mu    sync.Mutex
	wants float64
	has   *pb.Lease
}

func newLeaseClient(t *testing.T, id, resource string, wants float64, addrs ...string) *leaseClient {
	c := &leaseClient{id: id, resource: resource, wants: wants, addrs: addrs, conns: map[string]*grpc.ClientConn{}}
	t.Cleanup(func() {
		for _, cn := range c.conns {
			cn.Close()
		}
	})
	return c
}

func (c *leaseClient) conn(addr string) pb.CapacityClient {
	cn, ok := c.conns[addr]
	if !ok {
		cn, _ = grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		c.conns[addr] = cn
	}
	return pb.NewCapacityClient(cn)
}

// refresh asks for the lease once (following at most a few redirects); it
// reports whether a lease came back.
func (c *leaseClient) refresh() bool {
	c.mu.Lock()
	req := &pb.GetCapacityRequest{ClientId: c.id, Resource: []*pb.ResourceRequest{{ResourceId: c.resource, Wants: c.wants, Has: c.has}}}
	c.mu.Unlock()
	addr := c.addrs[c.at]
	for hop := 0; hop < 3; hop++ {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := c.conn(addr).GetCapacity(ctx, req)
		cancel()
		switch {
		case err != nil:
			c.at = (c.at + 1) % len(c.addrs)
			return false
		case resp.Mastership != nil:
			if resp.Mastership.MasterAddress == "" {
				c.at = (c.at + 1) % len(c.addrs)
				return false
			}
			addr = resp.Mastership.MasterAddress
			c.redirects++
			for i, a := range c.addrs {
				if a == addr {
					c.at = i
				}
			}
			continue
		}
		c.mu.Lock()
		c.has = resp.Response[0].Gets
		c.mu.Unlock()
		return true
	}
	return false
}

// holds is the capacity of the client's lease if unexpired at now.
func (c *leaseClient) holds(now time.Time) float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.has == nil || !now.Before(c.has.Expiry.AsTime()) {
		return 0
	}
	return c.has.Capacity
}

func (c *leaseClient) setWants(w float64) { c.mu.Lock(); c.wants = w; c.mu.Unlock() }

// run refreshes every interval until stop closes.
func (c *leaseClient) run(stop <-chan struct{}, every time.Duration) {
	for {
		c.refresh()
		select {
		case <-stop:
			return
		case <-time.After(every):
		}
	}
}

func sumHolds(cs []*leaseClient, now time.Time) float64 {
	s := 0.0
	for _, c := range cs {
		s += c.holds(now)
	}
	return s
}

// TestServeCapacity: `floodgate serve --resources` serves leases on its
// gRPC port beside the RLS API, exports the per-resource metrics, answers
// `floodgate check --capacity`, and reloads the resources file: a bad
// file is refused with its file:line and the old capacity stays.
func TestServeCapacity(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "resources.yaml")
	writeFile(t, file, resourcesFile(100, "10s", "1s"))
	s := capServer(t, file)
	a := newLeaseClient(t, "a", "db", 70, s.grpc)
	b := newLeaseClient(t, "b", "db", 70, s.grpc)
	if !a.refresh() || !b.refresh() {
		t.Fatal("no lease")
	}
	if ga, gb := a.holds(time.Now()), b.holds(time.Now()); ga != 70 || gb != 30 {
		t.Fatalf("a got %v, b %v; want 70 and 30 (b gets what is left until a refreshes)", ga, gb)
	}
	if g := metricValue(t, s.http, `floodgate_capacity_granted{resource="db"}`); g != 100 {
		t.Fatalf("granted metric %v", g)
	}
	if w := metricValue(t, s.http, `floodgate_capacity_wanted{resource="db"}`); w != 140 {
		t.Fatalf("wanted metric %v", w)
	}
	// The RLS API still answers beside it.
	s.ask(t, "example", desc("generic_key", "x"))

	// floodgate check --capacity: nothing left for it (a and b hold all).
	var out, errb bytes.Buffer
	code := run([]string{"check", "--server", s.grpc, "--capacity", "db", "--wants", "5"}, &out, &errb)
	if code != 3 || !strings.Contains(out.String(), `"resourceId"`) || !strings.Contains(out.String(), `"db"`) {
		t.Fatalf("check --capacity: exit %d\n%s\n%s", code, out.String(), errb.String())
	}
	if code := run([]string{"check", "--server", s.grpc, "--capacity", "db", "--wants", "-1"}, &out, &errb); code != 2 {
		t.Fatalf("check --wants -1: exit %d", code)
	}

	// A bad file: refused whole, named with its line; the old capacity stays.
	bad := strings.Replace(resourcesFile(500, "10s", "1s"), "algorithm: fair_share", "algorithm: fairest", 1)
	writeFile(t, file, bad)
	waitFor(t, "the refused reload logged", func() bool {
		return strings.Contains(s.logs(), "resources reload refused") && strings.Contains(s.logs(), file+":4")
	})
	if c := metricValue(t, s.http, `floodgate_capacity_capacity{resource="db"}`); c != 100 {
		t.Fatalf("capacity %v after a refused reload, want 100", c)
	}
	writeFile(t, file, resourcesFile(200, "10s", "1s"))
	waitFor(t, "capacity 200 live", func() bool {
		// No request meanwhile: the metric shows a reload at once.
		return metricValue(t, s.http, `floodgate_capacity_capacity{resource="db"}`) == 200
	})
	a.refresh()
	b.refresh()
	a.refresh()
	if ga, gb := a.holds(time.Now()), b.holds(time.Now()); ga != 70 || gb != 70 {
		t.Fatalf("after reload a got %v, b %v; want 70 each", ga, gb)
	}
}

// TestServeCapacityFlags: the lease flags that need --resources, or each
// other, are refused at start.
func TestServeCapacityFlags(t *testing.T) {
	for _, args := range [][]string{
		{"serve", "--parent", "127.0.0.1:1"},
		{"serve", "--etcd", "http://127.0.0.1:1"},
		{"serve", "--resources", "x.yaml", "--etcd", "http://127.0.0.1:1"},
	} {
		var out, errb bytes.Buffer
		if code := run(args, &out, &errb); code != 2 || !strings.Contains(errb.String(), "need") {
			t.Errorf("%v: exit %d: %s", args, code, errb.String())
		}
	}
}

// capServer starts `floodgate serve --resources file` with extra flags, its
// data in a temporary directory.
func capServer(t *testing.T, file string, extra ...string) *server {
	t.Helper()
	return startServer(t, append([]string{"--resources", file, "--data", t.TempDir()}, extra...)...)
}

// capacityWindow is a capacity in effect from from until to (zero: still).
type capacityWindow struct {
	c        float64
	from, to time.Time
}

// capacityLog is the root's capacities over time. A capacity bounds the
// leases from when its file is written (an increase may apply at once)
// until a lease length after the next one is seen live (leases granted
// under it stand until they expire).
type capacityLog struct {
	mu      sync.Mutex
	windows []capacityWindow
	lease   time.Duration
}

func (l *capacityLog) set(c float64, written, live time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := len(l.windows); n > 0 {
		l.windows[n-1].to = live.Add(l.lease)
	}
	l.windows = append(l.windows, capacityWindow{c: c, from: written})
}

// bound is the most the leases may sum to at now.
func (l *capacityLog) bound(now time.Time) float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := 0.0
	for _, w := range l.windows {
		if !now.Before(w.from) && (w.to.IsZero() || now.Before(w.to)) {
			b = max(b, w.c)
		}
	}
	return b
}

// TestServeCapacityTree: a 3-level tree of `floodgate serve` processes,
// a root, two regions under it and a leaf server under each region, with
// clients of the leaves wanting more than there is. The root's capacity
// goes 100 → 50 → 150 by hot reload mid-run. At every sample (every few
// milliseconds) the capacity in the clients' unexpired leases is at most
// the root's capacity (the old one still counts for a lease length after
// a decrease: leases stand until they expire), and after each change the
// clients' leases converge to the new capacity.
func TestServeCapacityTree(t *testing.T) {
	dir := t.TempDir()
	const leaseLen = 3 * time.Second
	rootFile := filepath.Join(dir, "root.yaml")
	midFile := filepath.Join(dir, "mid.yaml")
	writeFile(t, midFile, resourcesFile(0, "3s", "300ms"))
	log := &capacityLog{lease: leaseLen}
	writeFile(t, rootFile, resourcesFile(100, "3s", "300ms"))
	log.set(100, time.Now(), time.Now())
	root := capServer(t, rootFile)
	var clients []*leaseClient
	for r := range 2 {
		region := capServer(t, midFile, "--parent", root.grpc, "--server-id", fmt.Sprint("region-", r))
		leaf := capServer(t, midFile, "--parent", region.grpc, "--server-id", fmt.Sprint("leaf-", r))
		for c := range 2 {
			clients = append(clients, newLeaseClient(t, fmt.Sprintf("client-%d-%d", r, c), "db", 40, leaf.grpc))
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, c := range clients {
		wg.Go(func() { c.run(stop, 300*time.Millisecond) })
	}
	var worst struct {
		sync.Mutex
		over  float64
		at    time.Time
		bound float64
		n     int
	}
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			now := time.Now()
			sum, b := sumHolds(clients, now), log.bound(now)
			worst.Lock()
			worst.n++
			if sum-b > worst.over+1e-6 {
				worst.over, worst.at, worst.bound = sum-b, now, b
			}
			worst.Unlock()
		}
	})
	defer func() { close(stop); wg.Wait() }()
	converge := func(c float64) time.Duration {
		start := time.Now()
		waitFor(t, fmt.Sprintf("leases summing to %v", c), func() bool {
			s := sumHolds(clients, time.Now())
			return s >= 0.95*c && s <= c+1e-6
		})
		return time.Since(start)
	}
	reload := func(c float64) {
		written := time.Now()
		writeFile(t, rootFile, resourcesFile(c, "3s", "300ms"))
		waitFor(t, fmt.Sprintf("root capacity %v live", c), func() bool {
			return metricValue(t, root.http, `floodgate_capacity_capacity{resource="db"}`) == c
		})
		log.set(c, written, time.Now())
	}
	t.Logf("converged to 100 in %v", converge(100))
	reload(50)
	t.Logf("converged to 50 in %v", converge(50))
	reload(150)
	t.Logf("converged to 150 in %v", converge(150))
	time.Sleep(time.Second) // samples at the new capacity too
	worst.Lock()
	defer worst.Unlock()
	if worst.over > 1e-6 {
		t.Fatalf("at %v the leases summed to %v over the root's capacity %v", worst.at, worst.over, worst.bound)
	}
	if worst.n < 100 {
		t.Fatalf("only %d samples", worst.n)
	}
	t.Logf("%d samples, none over the root's capacity", worst.n)
}

// TestServeCapacityParentTLS: a parent serving TLS grants to a child that
// verifies it with --parent-tls-ca; a child speaking plaintext to it gets
// nothing (and logs why).
func TestServeCapacityParentTLS(t *testing.T) {
	p := newPKI(t)
	cert, key := p.issue(t, "server", x509.ExtKeyUsageServerAuth)
	file := filepath.Join(t.TempDir(), "resources.yaml")
	writeFile(t, file, resourcesFile(100, "10s", "300ms"))
	root := capServer(t, file, "--tls-cert", cert, "--tls-key", key)
	good := capServer(t, file, "--parent", root.grpc, "--parent-tls-ca", p.caPath)
	plain := capServer(t, file, "--parent", root.grpc)
	a := newLeaseClient(t, "a", "db", 30, good.grpc)
	waitFor(t, "a lease through the TLS parent", func() bool { a.refresh(); return a.holds(time.Now()) == 30 })
	b := newLeaseClient(t, "b", "db", 30, plain.grpc)
	waitFor(t, "the plaintext child's failure logged", func() bool {
		b.refresh()
		return strings.Contains(plain.logs(), "parent unreachable")
	})
	if h := b.holds(time.Now()); h != 0 {
		t.Fatalf("a child that cannot reach its parent granted %v", h)
	}
}

// TestServeWithoutResources: without --resources there is no lease
// service (the call is Unimplemented) and no lease metric.
func TestServeWithoutResources(t *testing.T) {
	s := startServer(t, "--data", t.TempDir())
	_, err := pb.NewCapacityClient(s.conn).Discovery(context.Background(), &pb.DiscoveryRequest{})
	if status.Code(err) != codes.Unimplemented {
		t.Fatalf("Discovery without --resources: %v, want Unimplemented", err)
	}
	if _, err := scrape(s.http, "floodgate_capacity_master"); err == nil {
		t.Fatal("a lease metric without --resources")
	}
}

package capacity

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/internal/etcdtest"
	"github.com/floodgate/floodgate/internal/testproc"
)

// The client against `floodgate serve --resources` processes: the binary
// built once per test run, killed with SIGKILL.

var (
	buildOnce sync.Once
	binDir    string
	binary    string
	buildErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// floodgateBinary builds cmd/floodgate once.
func floodgateBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		if binDir, buildErr = os.MkdirTemp("", "floodgate-capacity-test"); buildErr != nil {
			return
		}
		binary = filepath.Join(binDir, "floodgate")
		out, err := exec.Command("go", "build", "-o", binary, "../cmd/floodgate").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("building floodgate: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binary
}

// serveProc is one `floodgate serve` process.
type serveProc struct {
	cmd  *exec.Cmd
	addr string // its gRPC address
	done chan struct{}
	mu   sync.Mutex
	log  strings.Builder
}

// startServe runs `floodgate serve --resources file` with extra flags
// until it logs its gRPC address.
func startServe(t *testing.T, file string, extra ...string) *serveProc {
	t.Helper()
	args := append([]string{"serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
		"--admin-addr", "127.0.0.1:0", "--log-format", "json", "--resources", file, "--data", t.TempDir()}, extra...)
	p := &serveProc{cmd: exec.Command(floodgateBinary(t), args...), done: make(chan struct{})}
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	proc, err := testproc.Start(p.cmd) // dies with the test binary
	if err != nil {
		t.Fatal(err)
	}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			p.mu.Lock()
			p.log.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
			var m struct{ Msg, API, Addr string }
			if json.Unmarshal(sc.Bytes(), &m) == nil && m.Msg == "listening" && m.API == "grpc" {
				select {
				case addr <- m.Addr:
				default:
				}
			}
		}
	}()
	go func() { proc.Wait(); close(p.done) }()
	t.Cleanup(p.kill)
	select {
	case p.addr = <-addr:
	case <-p.done:
		t.Fatalf("floodgate serve exited:\n%s", p.logs())
	case <-time.After(60 * time.Second):
		t.Fatalf("floodgate serve did not listen in 60s:\n%s", p.logs())
	}
	return p
}

func (p *serveProc) logs() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()
}

// kill sends SIGKILL and waits for the process to end.
func (p *serveProc) kill() {
	p.cmd.Process.Kill()
	<-p.done
}

func writeResources(t *testing.T, body string) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "resources.yaml")
	if err := os.WriteFile(file, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return file
}

// Each mode with its server process killed (SIGKILL): three clients, one
// per mode, on one resource; each client's clock is a manual one started
// at the wall time, set to its lease's expiry (the server's wall-clock
// timestamp) after the kill.
func TestServeProcessModes(t *testing.T) {
	p := startServe(t, writeResources(t, `resources:
  - id: db
    capacity: 90
    algorithm: fair_share
    lease_length: 60s
    refresh_interval: 5s
  - id: "*"
    capacity: 0
`))
	modes := []Mode{Pessimistic, Optimistic, Safe}
	want := map[Mode]float64{Pessimistic: 0, Optimistic: 20, Safe: 30} // safe: 90 / 3 clients
	cs := make([]*Client, len(modes))
	rs := make([]*Resource, len(modes))
	clks := make([]*clock.Manual, len(modes))
	for i, m := range modes {
		clks[i] = clock.NewManual(time.Now())
		cs[i] = newClient(t, clks[i], p.addr)
		rs[i] = mustResource(t, cs[i], "db", Options{Wants: 20, Mode: m})
	}
	for range 2 { // the second round's leases count all three clients
		for i := range cs {
			settle(t, cs[i])
			refresh(t, cs[i])
		}
	}
	leases := make([]Lease, len(modes))
	for i := range modes {
		l, ok := rs[i].Lease()
		if !ok || l.Capacity != 20 || l.Safe != 30 {
			t.Fatalf("%s: lease %+v, want capacity 20, safe 30", modes[i], l)
		}
		leases[i] = l
	}
	p.kill()
	for i, m := range modes {
		if err := cs[i].Refresh(context.Background()); err == nil {
			t.Fatalf("%s: refresh with the server killed: no error", m)
		}
		clks[i].Set(leases[i].Expiry.Add(-time.Microsecond))
		if got := rs[i].Capacity(); got != 20 || !rs[i].Leased() {
			t.Fatalf("%s: 1µs before expiry, server dead: capacity %v (leased %v), want the lease's 20", m, got, rs[i].Leased())
		}
		clks[i].Set(leases[i].Expiry)
		if got := rs[i].Capacity(); got != want[m] || rs[i].Leased() {
			t.Fatalf("%s: at expiry: capacity %v (leased %v), want %v", m, got, rs[i].Leased(), want[m])
		}
		if got := admit(t, rs[i], 100); got != int(want[m]) {
			t.Fatalf("%s: at expiry: admitted %d at once, want %v", m, got, want[m])
		}
	}
}

// Failover between two `floodgate serve` replicas electing a master
// through a real etcd: the master is killed (SIGKILL); the client, on the
// system clock, finds the new master through the survivor's redirect or
// its own Discovery, and holds its lease all along (pessimistic mode, so a
// lapse would show as capacity 0).
func TestServeProcessFailover(t *testing.T) {
	start := time.Now()
	etcd := etcdtest.Start(t)
	file := writeResources(t, `resources:
  - id: db
    capacity: 100
    algorithm: fair_share
    lease_length: 4s
    refresh_interval: 300ms
  - id: "*"
    capacity: 0
`)
	addrs := []string{closedAddr(t), closedAddr(t)}
	ps := make([]*serveProc, len(addrs))
	for i, a := range addrs {
		ps[i] = startServe(t, file, "--grpc-addr", a, "--etcd", etcd.ClientURL, "--advertise", a, "--etcd-ttl", "1")
	}
	t.Logf("etcd and 2 replicas up in %v", time.Since(start))
	c, err := New(ClientOptions{Addrs: addrs, Logger: quietLogger(), Backoff: 50 * time.Millisecond, MaxBackoff: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	r := mustResource(t, c, "db", Options{Wants: 20, Mode: Pessimistic})
	// The first master learns for a lease length (4s), granting newcomers
	// nothing; then 20.
	waitFor(t, c, "a lease of 20", func() bool { return r.Leased() && r.Capacity() == 20 && c.Master() != "" })
	t.Logf("a lease of 20 at %v", time.Since(start))
	old := c.Master()
	for i, a := range addrs {
		if a == old {
			ps[i].kill()
		}
	}
	killed := time.Now()
	var lapses []string
	deadline := time.Now().Add(30 * time.Second)
	for c.Master() == old || c.Master() == "" || !renewedSince(r, killed) {
		if got := r.Capacity(); got != 20 {
			lapses = append(lapses, fmt.Sprintf("capacity %v at %v after the kill", got, time.Since(killed)))
		}
		if time.Now().After(deadline) {
			t.Fatalf("30s after the master was killed: master %q (old %q), lease %+v", c.Master(), old, must(r.Lease()))
		}
		c.mu.Lock()
		ch := c.event
		c.mu.Unlock()
		select {
		case <-ch:
		case <-time.After(100 * time.Millisecond):
		}
	}
	if len(lapses) > 0 {
		t.Fatalf("the lease lapsed during the failover: %v", lapses)
	}
	t.Logf("new master %s, lease renewed %v after the kill", c.Master(), time.Since(killed))
}

// renewedSince reports whether r's lease was granted after t: its expiry
// is more than a lease length after t less the refresh.
func renewedSince(r *Resource, t time.Time) bool {
	l, ok := r.Lease()
	return ok && l.Expiry.After(t.Add(4*time.Second))
}

func must(l Lease, _ bool) Lease { return l }

package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	pb "github.com/floodgate/floodgate/capacity/capacitypb"
)

// TestServeCapacityRestart: a single server (no etcd) killed with SIGKILL
// and restarted while its clients hold leases does not grant again what
// they hold: its lease watermark (capacity.state in --data) says leases
// may be outstanding, so it restarts in learning mode, and the sum of the
// leases the clients hold never exceeds the capacity. Without the
// watermark the restarted server grants from an empty table: the first
// client back gets the whole capacity while the other still holds half.
// A first start (no state file) grants at once.
func TestServeCapacityRestart(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "resources.yaml")
	writeFile(t, file, resourcesFile(100, "20s", "1s"))
	data := filepath.Join(dir, "data")
	s := startServer(t, "--resources", file, "--data", data)
	a := newLeaseClient(t, "a", "db", 100, s.grpc)
	b := newLeaseClient(t, "b", "db", 100, s.grpc)
	if !a.refresh() || a.holds(time.Now()) != 100 {
		t.Fatalf("first start: a holds %v, want 100 at once (no learning)", a.holds(time.Now()))
	}
	if l := metricValue(t, s.http, `floodgate_capacity_learning{resource="db"}`); l != 0 {
		t.Fatalf("first start: learning metric %v", l)
	}
	clients := []*leaseClient{a, b}
	check := func(when string) {
		t.Helper()
		if sum := sumHolds(clients, time.Now()); sum > 100+1e-6 {
			t.Fatalf("%s: the clients hold %v of a capacity of 100 (a %v, b %v)", when, sum, a.holds(time.Now()), b.holds(time.Now()))
		}
	}
	waitFor(t, "fair shares of 50", func() bool {
		a.refresh()
		check("before the kill")
		b.refresh()
		check("before the kill")
		return a.holds(time.Now()) == 50 && b.holds(time.Now()) == 50
	})
	st, err := os.ReadFile(filepath.Join(data, "capacity.state"))
	if err != nil || !strings.HasPrefix(string(st), "floodgate-capacity-watermark v1 ") {
		t.Fatalf("state file: %q, %v", st, err)
	}

	s.cmd.Process.Kill() // SIGKILL: nothing saved at exit
	<-s.done
	s2 := startServer(t, "--resources", file, "--data", data)
	for _, c := range clients {
		c.addrs, c.at = []string{s2.grpc}, 0
	}
	for i := range 10 {
		for _, c := range clients {
			if !c.refresh() {
				t.Fatalf("refresh %d of %s failed", i, c.id)
			}
			check("after the restart")
		}
	}
	if ga, gb := a.holds(time.Now()), b.holds(time.Now()); ga != 50 || gb != 50 {
		t.Fatalf("after the restart a holds %v, b %v; want their 50 back", ga, gb)
	}
	if l := metricValue(t, s2.http, `floodgate_capacity_learning{resource="db"}`); l != 1 {
		t.Fatalf("restart: learning metric %v, want 1", l)
	}
	// A newcomer gets nothing while the old leases may be outstanding.
	c := newLeaseClient(t, "c", "db", 10, s2.grpc)
	if !c.refresh() || c.holds(time.Now()) != 0 {
		t.Fatalf("a newcomer got %v while learning", c.holds(time.Now()))
	}
}

// TestServeCapacityStateFlag: a corrupt state file is refused at start,
// naming it; --capacity-state with --etcd is refused.
func TestServeCapacityStateFlag(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "resources.yaml")
	writeFile(t, file, resourcesFile(100, "20s", "1s"))
	state := filepath.Join(dir, "cap.state")
	writeFile(t, state, "garbage\n")
	var out, errb strings.Builder
	code := run([]string{"serve", "--resources", file, "--data", filepath.Join(dir, "data"), "--capacity-state", state,
		"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"}, &out, &errb)
	if code == 0 || !strings.Contains(errb.String(), state+":1") {
		t.Fatalf("corrupt state: exit %d: %s", code, errb.String())
	}
	errb.Reset()
	code = run([]string{"serve", "--resources", file, "--capacity-state", state, "--etcd", "http://127.0.0.1:1", "--advertise", "x:1"}, &out, &errb)
	if code != 2 || !strings.Contains(errb.String(), "--capacity-state") {
		t.Fatalf("--capacity-state with --etcd: exit %d: %s", code, errb.String())
	}
}

// TestServeCapacityCleanStop: a server stopped with SIGTERM lowers its
// watermark to the end of the last lease still held, so a restart learns
// only while leases are out. With every lease released before the stop, a
// restart grants at once; with a lease still held, it learns (a newcomer
// gets 0, the holder gets its lease back) and never grants past the
// capacity.
func TestServeCapacityCleanStop(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "resources.yaml")
	writeFile(t, file, resourcesFile(100, "20s", "1s"))
	data := filepath.Join(dir, "data")

	s := startServer(t, "--resources", file, "--data", data)
	a := newLeaseClient(t, "a", "db", 100, s.grpc)
	if !a.refresh() || a.holds(time.Now()) != 100 {
		t.Fatalf("first start: a holds %v, want 100", a.holds(time.Now()))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_, err := a.conn(s.grpc).ReleaseCapacity(ctx, &pb.ReleaseCapacityRequest{ClientId: "a", ResourceId: []string{"db"}})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	s.stop(t)
	s2 := startServer(t, "--resources", file, "--data", data)
	b := newLeaseClient(t, "b", "db", 100, s2.grpc)
	if !b.refresh() || b.holds(time.Now()) != 100 {
		t.Fatalf("restart after a clean stop with nothing held: b holds %v, want 100 at once", b.holds(time.Now()))
	}
	if l := metricValue(t, s2.http, `floodgate_capacity_learning{resource="db"}`); l != 0 {
		t.Fatalf("restart after a clean stop with nothing held: learning metric %v, want 0", l)
	}

	// b holds 100 through a clean stop: the restart learns.
	s2.stop(t)
	s3 := startServer(t, "--resources", file, "--data", data)
	c := newLeaseClient(t, "c", "db", 100, s3.grpc)
	if !c.refresh() || c.holds(time.Now()) != 0 {
		t.Fatalf("restart with b's lease out: newcomer c got %v, want 0", c.holds(time.Now()))
	}
	b.addrs, b.at = []string{s3.grpc}, 0
	if !b.refresh() || b.holds(time.Now()) != 100 {
		t.Fatalf("restart with b's lease out: b got %v back, want 100", b.holds(time.Now()))
	}
	if sum := b.holds(time.Now()) + c.holds(time.Now()); sum > 100 {
		t.Fatalf("b and c hold %v of 100", sum)
	}
}

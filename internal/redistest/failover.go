package redistest

import (
	"context"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// StandaloneWith starts one Redis server with extra redis-server
// arguments after the harness's own (e.g. "--maxmemory", "2mb").
func StandaloneWith(t testing.TB, extra ...string) *Server {
	t.Helper()
	Require(t)
	return start(t, t.TempDir(), extra...)
}

// ReplicaOf starts a Redis server replicating m, and waits until it has
// synced. It sets m's repl-diskless-sync-delay to 0 (5 s by default), so
// the sync starts at once.
func ReplicaOf(t testing.TB, m *Server) *Server {
	t.Helper()
	Require(t)
	if out, err := Cmd(m.Addr, "CONFIG", "SET", "repl-diskless-sync-delay", "0"); err != nil || out != "OK" {
		t.Fatalf("CONFIG SET repl-diskless-sync-delay on %s: %s %v", m.Addr, out, err)
	}
	r := start(t, t.TempDir(), "--replicaof", "127.0.0.1", strconv.Itoa(m.Port))
	WaitFor(t, 10*time.Second, "replica "+r.Addr+" synced", func() bool {
		out, _ := Cmd(r.Addr, "INFO", "replication")
		return strings.Contains(out, "master_link_status:up")
	})
	return r
}

// WaitFor polls cond until it holds, failing the test if limit passes
// first.
func WaitFor(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A ReplicatedCluster is a Redis Cluster whose masters each have one
// replica.
type ReplicatedCluster struct {
	Masters, Replicas []*Server // Replicas[i] replicates Masters[i]
}

// Addrs returns every node's address, masters first.
func (c *ReplicatedCluster) Addrs() []string {
	var out []string
	for _, n := range append(append([]*Server{}, c.Masters...), c.Replicas...) {
		out = append(out, n.Addr)
	}
	return out
}

// ClusterWithReplicas starts n (at least 3) masters and a replica of each,
// with a short node timeout (1 s) so that a killed master's replica is
// promoted within a few seconds, and waits until the cluster is ok and
// every replica has synced.
func ClusterWithReplicas(t testing.TB, n int) *ReplicatedCluster {
	t.Helper()
	Require(t)
	dir := t.TempDir()
	var nodes []*Server
	for range 2 * n {
		nodes = append(nodes, start(t, dir, "--cluster-enabled", "yes", "--cluster-node-timeout", "1000",
			"--cluster-replica-validity-factor", "0", "--repl-diskless-sync-delay", "0"))
	}
	// redis-cli pairs the first n as masters, the rest as their replicas
	// (it may shuffle which replica follows which master: read it back)
	args := []string{"--cluster", "create"}
	for _, s := range nodes {
		args = append(args, s.Addr)
	}
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	for _, node := range nodes {
		WaitFor(t, 20*time.Second, "cluster ok on "+node.Addr, func() bool {
			out, _ := Cmd(node.Addr, "CLUSTER", "INFO")
			return strings.Contains(out, "cluster_state:ok")
		})
	}
	c := &ReplicatedCluster{}
	id := map[string]*Server{}
	for _, s := range nodes {
		out, _ := Cmd(s.Addr, "CLUSTER", "MYID")
		id[out] = s
	}
	for _, s := range nodes[n:] {
		WaitFor(t, 20*time.Second, "replica "+s.Addr+" synced", func() bool {
			out, _ := Cmd(s.Addr, "INFO", "replication")
			return strings.Contains(out, "master_link_status:up")
		})
		out, _ := Cmd(s.Addr, "INFO", "replication")
		var master *Server
		for _, line := range strings.Split(out, "\n") {
			if p, ok := strings.CutPrefix(strings.TrimSpace(line), "master_port:"); ok {
				for _, m := range nodes[:n] {
					if strconv.Itoa(m.Port) == p {
						master = m
					}
				}
			}
		}
		if master == nil {
			t.Fatalf("replica %s follows no master of the cluster:\n%s", s.Addr, out)
		}
		c.Masters = append(c.Masters, master)
		c.Replicas = append(c.Replicas, s)
	}
	return c
}

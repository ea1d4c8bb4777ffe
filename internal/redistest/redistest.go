// Package redistest starts real Redis servers for tests: a standalone
// server, a master with a replica and a sentinel, and a three-master
// Cluster, each on free loopback ports in a temporary directory, removed
// when the test ends.
//
// Without redis-server on PATH the tests that need it are skipped with a
// clear message, unless FLOODGATE_REQUIRE_REDIS=1 (set by .ci/run), which
// makes them fail instead.
package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/floodgate/floodgate/internal/testproc"
)

// Require skips (or, with FLOODGATE_REQUIRE_REDIS=1, fails) the test when
// redis-server or redis-cli is missing.
func Require(t testing.TB) {
	t.Helper()
	for _, bin := range []string{"redis-server", "redis-cli"} {
		if _, err := exec.LookPath(bin); err != nil {
			msg := bin + " is not on PATH: install Debian's redis-server package (.ci/run does) to run the Redis tests"
			if os.Getenv("FLOODGATE_REQUIRE_REDIS") == "1" {
				t.Fatal(msg + " (FLOODGATE_REQUIRE_REDIS=1)")
			}
			t.Skip(msg)
		}
	}
}

// A Server is one redis-server process.
type Server struct {
	Addr string // host:port
	Port int
	Dir  string
	cmd  *exec.Cmd
	args []string
	mu   sync.Mutex
	done chan struct{}
}

// freePort returns a loopback port that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// start runs redis-server with args (after the config file) on a free
// port and waits until it answers PING.
func start(t testing.TB, dir string, extra ...string) *Server {
	t.Helper()
	for attempt := 0; ; attempt++ {
		port := freePort(t)
		sdir := filepath.Join(dir, strconv.Itoa(port))
		if err := os.MkdirAll(sdir, 0o755); err != nil {
			t.Fatal(err)
		}
		args := append([]string{
			"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", sdir,
			"--save", "", "--appendonly", "no", "--protected-mode", "no",
			"--logfile", filepath.Join(sdir, "redis.log"),
		}, extra...)
		s := &Server{Addr: "127.0.0.1:" + strconv.Itoa(port), Port: port, Dir: sdir, args: args}
		if err := s.launch(); err != nil {
			t.Fatal(err)
		}
		if err := s.waitReady(10 * time.Second); err != nil {
			s.kill()
			if attempt < 3 {
				continue // the port was taken meanwhile
			}
			t.Fatalf("redis-server on %s: %v\n%s", s.Addr, err, s.Log())
		}
		t.Cleanup(s.kill)
		return s
	}
}

func (s *Server) launch() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	cmd := exec.Command("redis-server", s.args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// started so that it dies with the test binary even when no cleanup
	// runs (a panic, -test.timeout, a kill): see testproc
	p, err := testproc.Start(cmd)
	if err != nil {
		return err
	}
	s.cmd, s.done = cmd, make(chan struct{})
	go func(done chan struct{}) { p.Wait(); close(done) }(s.done)
	return nil
}

func (s *Server) waitReady(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		out, err := Cmd(s.Addr, "PING")
		if err == nil && out == "PONG" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no PONG within %s: %v %q", limit, err, out)
		}
		select {
		case <-s.done:
			return fmt.Errorf("redis-server exited")
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Log returns the server's log file.
func (s *Server) Log() string {
	b, _ := os.ReadFile(filepath.Join(s.Dir, "redis.log"))
	return string(b)
}

func (s *Server) kill() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	select {
	case <-done: // gone already, its pid perhaps another's
		return
	default:
	}
	// SIGKILL to its process group: the server and any child it forked (a
	// save, a replica's sync); SIGCONT before and after, for one paused
	syscall.Kill(-cmd.Process.Pid, syscall.SIGCONT)
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	syscall.Kill(-cmd.Process.Pid, syscall.SIGCONT)
	cmd.Process.Kill()
	<-done
}

// Kill stops the server at once (SIGKILL), as a crash would.
func (s *Server) Kill() { s.kill() }

// Restart starts a killed server again on the same port.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.kill()
	if err := s.launch(); err != nil {
		t.Fatal(err)
	}
	if err := s.waitReady(10 * time.Second); err != nil {
		t.Fatalf("restart %s: %v", s.Addr, err)
	}
}

// Pause freezes the server (SIGSTOP): connections stay open and nothing
// answers, as with a server stuck in a long command or a network stall.
func (s *Server) Pause() { s.signal(syscall.SIGSTOP) }

// Resume continues a paused server (SIGCONT).
func (s *Server) Resume() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil && s.cmd.Process != nil {
		s.cmd.Process.Signal(sig)
	}
}

// Cmd runs one command through redis-cli against addr and returns its
// trimmed output.
func Cmd(addr string, args ...string) (string, error) {
	host, port, _ := net.SplitHostPort(addr)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := testproc.CombinedOutput(exec.CommandContext(ctx, "redis-cli", append([]string{"-h", host, "-p", port}, args...)...))
	return strings.TrimSpace(string(out)), err
}

// Standalone starts one Redis server.
func Standalone(t testing.TB) *Server {
	t.Helper()
	Require(t)
	return start(t, t.TempDir())
}

// StandaloneUnix starts one Redis server that also listens on a Unix
// socket, whose path it returns.
func StandaloneUnix(t testing.TB) (*Server, string) {
	t.Helper()
	Require(t)
	// a short directory: a socket's path is at most 107 bytes
	dir, err := os.MkdirTemp("", "rs")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "redis.sock")
	return start(t, t.TempDir(), "--unixsocket", sock, "--unixsocketperm", "700"), sock
}

// A SentinelSet is a master, a replica and a sentinel watching them.
type SentinelSet struct {
	Master, Replica, Sentinel *Server
	Name                      string // the master's name in the sentinel
}

// Sentinel starts a master, a replica and one sentinel (quorum 1) that
// fails over after the master is down for a second.
func Sentinel(t testing.TB) *SentinelSet {
	t.Helper()
	Require(t)
	dir := t.TempDir()
	m := start(t, dir)
	r := start(t, dir, "--replicaof", "127.0.0.1", strconv.Itoa(m.Port))
	port := freePort(t)
	sdir := filepath.Join(dir, "sentinel")
	os.MkdirAll(sdir, 0o755)
	conf := filepath.Join(sdir, "sentinel.conf")
	body := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nlogfile %s\n"+
		"sentinel monitor fg 127.0.0.1 %d 1\nsentinel down-after-milliseconds fg 1000\n"+
		"sentinel failover-timeout fg 5000\nsentinel parallel-syncs fg 1\n",
		port, sdir, filepath.Join(sdir, "redis.log"), m.Port)
	if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	s := &Server{Addr: "127.0.0.1:" + strconv.Itoa(port), Port: port, Dir: sdir, args: []string{conf, "--sentinel"}}
	if err := s.launch(); err != nil {
		t.Fatal(err)
	}
	if err := s.waitReady(10 * time.Second); err != nil {
		s.kill()
		t.Fatalf("sentinel: %v\n%s", err, s.Log())
	}
	t.Cleanup(s.kill)
	// Wait until the replica has synced, so a failover has somewhere to go.
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, _ := Cmd(r.Addr, "INFO", "replication")
		if strings.Contains(out, "master_link_status:up") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica never synced:\n%s", out)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return &SentinelSet{Master: m, Replica: r, Sentinel: s, Name: "fg"}
}

// A ClusterSet is a Redis Cluster of masters without replicas.
type ClusterSet struct {
	Nodes []*Server
}

// Addrs returns the nodes' addresses.
func (c *ClusterSet) Addrs() []string {
	out := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		out[i] = n.Addr
	}
	return out
}

// Cluster starts n (at least 3) masters and joins them with
// redis-cli --cluster create, waiting until the cluster is ok.
func Cluster(t testing.TB, n int) *ClusterSet {
	t.Helper()
	Require(t)
	dir := t.TempDir()
	c := &ClusterSet{}
	for range n {
		c.Nodes = append(c.Nodes, start(t, dir, "--cluster-enabled", "yes", "--cluster-node-timeout", "2000"))
	}
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := testproc.CombinedOutput(exec.CommandContext(ctx, "redis-cli", args...)); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, node := range c.Nodes {
		for {
			out, _ := Cmd(node.Addr, "CLUSTER", "INFO")
			if strings.Contains(out, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("cluster never became ok on %s:\n%s", node.Addr, out)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return c
}

// Slowest calls call from workers goroutines at once, each again and
// again (5 ms apart) for d, each under a context of timeout, and returns
// the longest any took: what a test of answering by the deadline against
// a paused server measures.
func Slowest(workers int, d, timeout time.Duration, call func(ctx context.Context)) time.Duration {
	var mu sync.Mutex
	var worst time.Duration
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for start := time.Now(); time.Since(start) < d; {
				ctx, cancel := context.WithTimeout(context.Background(), timeout)
				t0 := time.Now()
				call(ctx)
				el := time.Since(t0)
				cancel()
				mu.Lock()
				worst = max(worst, el)
				mu.Unlock()
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	return worst
}

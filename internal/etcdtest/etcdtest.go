// Package etcdtest starts a real etcd server (/usr/bin/etcd, Debian's
// etcd-server package) for a test: one member on free loopback ports, its
// data in the test's temporary directory, killed when the test ends (or,
// through internal/testproc, when the test binary dies).
//
// Without an etcd binary the test is skipped, unless
// FLOODGATE_REQUIRE_ETCD=1 (CI sets it), when it fails.
package etcdtest

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/floodgate/floodgate/internal/testproc"
)

// Binary is the etcd binary the harness runs: $FLOODGATE_ETCD, else etcd
// on PATH, else /usr/bin/etcd.
func Binary() string {
	if b := os.Getenv("FLOODGATE_ETCD"); b != "" {
		return b
	}
	if b, err := exec.LookPath("etcd"); err == nil {
		return b
	}
	return "/usr/bin/etcd"
}

// Require skips the test when there is no etcd binary, or fails it when
// FLOODGATE_REQUIRE_ETCD=1.
func Require(t testing.TB) {
	t.Helper()
	if _, err := os.Stat(Binary()); err != nil {
		msg := "no etcd binary (" + Binary() + "): install Debian's etcd-server package (.ci/run does) to run the etcd tests"
		if os.Getenv("FLOODGATE_REQUIRE_ETCD") == "1" {
			t.Fatal(msg + " (FLOODGATE_REQUIRE_ETCD=1)")
		}
		t.Skip(msg)
	}
}

// A Server is one etcd process.
type Server struct {
	// ClientURL is where clients reach it: http://127.0.0.1:PORT.
	ClientURL string
	Dir       string
	log       bytes.Buffer
	logMu     sync.Mutex
	cmd       *exec.Cmd
	done      chan struct{}
}

// Start starts an etcd server and waits until it is healthy. It is killed
// when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	Require(t)
	dir := t.TempDir()
	for attempt := 0; ; attempt++ {
		s, err := launch(filepath.Join(dir, strconv.Itoa(attempt)))
		if err == nil {
			err = s.waitHealthy(20 * time.Second)
		}
		if err == nil {
			t.Cleanup(s.Kill)
			return s
		}
		if s != nil {
			s.Kill()
		}
		if attempt >= 3 { // else a port was taken meanwhile: again
			log := ""
			if s != nil {
				log = s.Log()
			}
			t.Fatalf("etcd: %v\n%s", err, log)
		}
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func launch(dir string) (*Server, error) {
	cport, err := freePort()
	if err != nil {
		return nil, err
	}
	pport, err := freePort()
	if err != nil {
		return nil, err
	}
	client := "http://127.0.0.1:" + strconv.Itoa(cport)
	peer := "http://127.0.0.1:" + strconv.Itoa(pport)
	s := &Server{ClientURL: client, Dir: dir, done: make(chan struct{})}
	cmd := exec.Command(Binary(), "--name", "t", "--data-dir", dir,
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "t="+peer, "--initial-cluster-state", "new")
	cmd.Stdout, cmd.Stderr = (*logWriter)(s), (*logWriter)(s)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p, err := testproc.Start(cmd)
	if err != nil {
		return nil, err
	}
	s.cmd = cmd
	go func() { p.Wait(); close(s.done) }()
	return s, nil
}

type logWriter Server

func (w *logWriter) Write(b []byte) (int, error) {
	w.logMu.Lock()
	defer w.logMu.Unlock()
	return w.log.Write(b)
}

// Log returns what etcd has written so far.
func (s *Server) Log() string {
	s.logMu.Lock()
	defer s.logMu.Unlock()
	return s.log.String()
}

func (s *Server) waitHealthy(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	c := &http.Client{Timeout: time.Second}
	for {
		resp, err := c.Get(s.ClientURL + "/health")
		if err == nil {
			var b bytes.Buffer
			b.ReadFrom(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 && bytes.Contains(b.Bytes(), []byte(`"true"`)) {
				return nil
			}
			err = fmt.Errorf("health %d %s", resp.StatusCode, b.String())
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not healthy within %s: %v", limit, err)
		}
		select {
		case <-s.done:
			return fmt.Errorf("etcd exited")
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Kill kills the server (SIGKILL) and waits for it to go.
func (s *Server) Kill() {
	select {
	case <-s.done:
		return
	default:
	}
	syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	s.cmd.Process.Kill()
	<-s.done
}

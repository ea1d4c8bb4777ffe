package redistest

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

const leakChildEnv = "FLOODGATE_REDISTEST_CHILD"

// A test binary that dies without running its cleanups leaves no
// redis-server behind, paused or not: after loaded CI runs, servers of
// tests that had timed out (two of them paused) were left running,
// orphaned, in their test directories.
func TestNoServerOutlivesItsTestBinary(t *testing.T) {
	Require(t)
	for _, mode := range []string{"panic", "timeout", "sigkill"} {
		t.Run(mode, func(t *testing.T) {
			// past its timeout the binary panics, without cleanups; the
			// child prints each server's pid as it starts it, and one that
			// timed out before it started any runs again with twice the
			// time
			for timeout := 10 * time.Second; ; timeout *= 2 {
				if pids := runLeakChild(t, mode, timeout); len(pids) > 0 {
					waitGone(t, mode, pids)
					return
				}
				if mode != "timeout" || timeout > time.Minute {
					t.Fatalf("the child test binary (%s) started no server", mode)
				}
			}
		})
	}
}

// runLeakChild runs TestLeakChild in mode until it has died, and returns
// the pids of the servers it started. It removes the temporary directory
// the child left (no cleanup of the child's ran) when the test ends.
func runLeakChild(t *testing.T, mode string, timeout time.Duration) []int {
	args := []string{"-test.run=^TestLeakChild$", "-test.count=1"}
	if mode == "timeout" {
		args = append(args, "-test.timeout="+timeout.String())
	}
	child := exec.Command(os.Args[0], args...)
	child.Env = append(os.Environ(), leakChildEnv+"="+mode)
	child.Stderr = io.Discard // the panic's trace, on purpose
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer child.Process.Kill()
	var pids []int
	sc := bufio.NewScanner(out)
	for sc.Scan() && sc.Text() != "ready" {
		if n, ok := strings.CutPrefix(sc.Text(), "pid "); ok {
			pid, _ := strconv.Atoi(n)
			pids = append(pids, pid)
		}
		if dir, ok := strings.CutPrefix(sc.Text(), "dir "); ok &&
			filepath.Dir(dir) == filepath.Clean(os.TempDir()) && strings.HasPrefix(filepath.Base(dir), "TestLeakChild") {
			t.Cleanup(func() { os.RemoveAll(dir) }) // when the subtest ends, its servers gone
		}
	}
	go io.Copy(io.Discard, out)
	if mode == "sigkill" {
		child.Process.Kill()
	}
	if err := child.Wait(); err == nil {
		t.Fatal("the child test binary exited 0")
	}
	return pids
}

// waitGone waits until every one of pids has exited, and kills those left
// when it fails. It waits for an event, not a budget: the limit only ends
// a test that would otherwise hang.
func waitGone(t *testing.T, mode string, pids []int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for _, pid := range pids {
		for running(pid) {
			if time.Now().After(deadline) {
				syscall.Kill(pid, syscall.SIGKILL)
				syscall.Kill(pid, syscall.SIGCONT)
				t.Errorf("redis-server %d outlived its test binary (%s)", pid, mode)
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// running reports whether pid runs and is not a zombie.
func running(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	f := strings.Fields(string(b[i+1:]))
	return len(f) > 0 && f[0] != "Z" && f[0] != "X"
}

// TestLeakChild is the child test binary of
// TestNoServerOutlivesItsTestBinary: it starts a server and pauses it,
// then (but in mode timeout, to be quick) a master, replica and sentinel,
// printing each pid as it goes, and dies as its mode says.
func TestLeakChild(t *testing.T) {
	mode := os.Getenv(leakChildEnv)
	if mode == "" {
		t.Skip("the child test binary of TestNoServerOutlivesItsTestBinary")
	}
	fmt.Printf("dir %s\n", filepath.Dir(t.TempDir())) // the test's own, left behind
	s := Standalone(t)
	s.Pause()
	fmt.Printf("pid %d\n", s.cmd.Process.Pid)
	if mode != "timeout" {
		set := Sentinel(t)
		for _, srv := range []*Server{set.Master, set.Replica, set.Sentinel} {
			fmt.Printf("pid %d\n", srv.cmd.Process.Pid)
		}
	}
	fmt.Println("ready")
	if mode == "panic" {
		go func() { panic("a test's goroutine panicked") }() // no cleanup runs
	}
	time.Sleep(time.Hour) // until the panic, the timeout or the kill
}

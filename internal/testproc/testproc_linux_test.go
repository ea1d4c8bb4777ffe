package testproc

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The child test binary's modes: how it dies after starting its children.
const childEnv = "FLOODGATE_TESTPROC_CHILD"

// Each way a test binary can die without running its cleanups leaves no
// child behind: one running and one paused (SIGSTOP), like a test's
// redis-server it had paused.
func TestChildrenDieWithTheTestBinary(t *testing.T) {
	for _, mode := range []string{"panic", "timeout", "sigquit", "sigkill"} {
		t.Run(mode, func(t *testing.T) {
			pids, child := runChild(t, mode)
			switch mode {
			case "sigquit": // what go test sends a binary past its timeout
				child.Process.Signal(syscall.SIGQUIT)
			case "sigkill":
				child.Process.Kill()
			}
			err := child.Wait()
			if err == nil {
				t.Fatalf("the child test binary exited 0 in mode %s", mode)
			}
			waitGone(t, pids...)
		})
	}
}

// A child started without the death signal (as a process on another OS
// would be, or one whose creating thread the signal missed) outlives its
// test binary, and the next sweep kills it.
func TestSweepKillsOrphans(t *testing.T) {
	useRecordDir(t, t.TempDir())
	pids, child := runChild(t, "nodeath")
	child.Process.Kill()
	child.Wait()
	for _, pid := range pids {
		st, ok := startTime(pid)
		if !ok || !alive(pid, st) {
			t.Fatalf("pid %d died with its test binary without the death signal: nothing left to sweep", pid)
		}
	}
	Sweep()
	waitGone(t, pids...)
	if left, _ := os.ReadDir(recordDir); len(left) != 0 {
		t.Fatalf("records left after the sweep: %v", left)
	}
}

// The sweep leaves a live test binary's children alone, and Wait drops a
// child's record.
func TestSweepSparesLiveOwners(t *testing.T) {
	useRecordDir(t, t.TempDir())
	p, err := Start(exec.Command("sleep", "1000"))
	if err != nil {
		t.Fatal(err)
	}
	Sweep()
	st, ok := startTime(p.Cmd.Process.Pid)
	if !ok || !alive(p.Cmd.Process.Pid, st) {
		t.Fatal("the sweep killed a live test binary's child")
	}
	if left, _ := os.ReadDir(recordDir); len(left) != 1 {
		t.Fatalf("want one record for the running child, have %v", left)
	}
	p.Cmd.Process.Kill()
	p.Wait()
	if left, _ := os.ReadDir(recordDir); len(left) != 0 {
		t.Fatalf("records left after Wait: %v", left)
	}
}

func TestCombinedOutput(t *testing.T) {
	out, err := CombinedOutput(exec.Command("sh", "-c", "echo out; echo err >&2"))
	if err != nil || string(out) != "out\nerr\n" {
		t.Fatalf("%q %v", out, err)
	}
	if _, err := CombinedOutput(exec.Command("sh", "-c", "exit 3")); err == nil {
		t.Fatal("exit 3 gave no error")
	}
}

// useRecordDir makes dir the records' directory for the test, so that no
// other test binary's sweep reaps what the test means to.
func useRecordDir(t *testing.T, dir string) {
	old := recordDir
	recordDir = dir
	t.Cleanup(func() { recordDir = old })
}

// runChild runs this test binary as TestChild in mode and returns the
// pids its children printed, with the child still running.
func runChild(t *testing.T, mode string) ([]int, *exec.Cmd) {
	t.Helper()
	args := []string{"-test.run=^TestChild$", "-test.count=1"}
	if mode == "timeout" {
		args = append(args, "-test.timeout=1s")
	}
	child := exec.Command(os.Args[0], args...)
	child.Env = append(os.Environ(), childEnv+"="+mode, "FLOODGATE_TESTPROC_DIR="+recordDir)
	child.Stderr = io.Discard // a panic's trace, or a timeout's, on purpose
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { child.Process.Kill() })
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "pids "); ok {
			var pids []int
			for _, f := range strings.Fields(rest) {
				pid, _ := strconv.Atoi(f)
				pids = append(pids, pid)
			}
			go func() {
				for sc.Scan() {
				}
			}()
			return pids, child
		}
	}
	child.Wait()
	t.Fatalf("the child test binary printed no pids (mode %s)", mode)
	return nil, nil
}

// waitGone waits until each of pids has exited (a zombie counts: it runs
// no more), and kills those left when it fails. The wait is for an event,
// not a budget: its limit only ends a test that would otherwise hang.
func waitGone(t *testing.T, pids ...int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for _, pid := range pids {
		for {
			_, state, ok := stat(pid)
			if !ok || state == 'Z' || state == 'X' {
				break
			}
			if time.Now().After(deadline) {
				syscall.Kill(pid, syscall.SIGKILL)
				syscall.Kill(pid, syscall.SIGCONT)
				t.Errorf("pid %d (state %c) outlived its test binary", pid, state)
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// TestChild is the child test binary of the tests above: it starts two
// children, pauses one, prints their pids and dies as its mode says.
func TestChild(t *testing.T) {
	mode := os.Getenv(childEnv)
	if mode == "" {
		t.Skip("the child test binary of TestChildrenDieWithTheTestBinary and TestSweepKillsOrphans")
	}
	recordDir = os.Getenv("FLOODGATE_TESTPROC_DIR")
	var pids []string
	for i := range 2 {
		p, err := start(exec.Command("sleep", "1000"), mode != "nodeath")
		if err != nil {
			t.Fatal(err)
		}
		if i == 1 {
			p.Cmd.Process.Signal(syscall.SIGSTOP)
		}
		pids = append(pids, strconv.Itoa(p.Cmd.Process.Pid))
	}
	fmt.Printf("pids %s\n", strings.Join(pids, " "))
	switch mode {
	case "panic":
		go func() { panic("a test's goroutine panicked") }() // no cleanup runs
		time.Sleep(time.Hour)
	default: // killed from outside or by -test.timeout
		time.Sleep(time.Hour)
	}
}

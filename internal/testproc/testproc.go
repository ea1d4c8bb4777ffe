// Package testproc starts a test's child processes (redis-server, a
// floodgate binary, a helper shell) so that none outlives the test binary,
// however it ends: a failed test's cleanups kill its children, and when
// the binary itself dies without running them (a panic in a goroutine,
// -test.timeout, go test's SIGQUIT, SIGKILL) the kernel kills them.
//
// On Linux each child gets a parent-death signal (SIGKILL). The kernel
// sends it when the thread that created the child exits, not the process,
// so every child is started from one goroutine locked to its thread for
// the life of the process. A paused (SIGSTOPped) child dies of SIGKILL all
// the same.
//
// As a last resort each child is recorded in a directory under the
// temporary directory until it is waited for; the first Start in a
// process kills the children of records whose test binary has gone
// (identified by pid and start time, so a reused pid is never hit) and
// drops stale records. Elsewhere than Linux only the cleanups apply.
package testproc

import (
	"bytes"
	"os/exec"
	"runtime"
	"sync"
)

// A Proc is a started child process.
type Proc struct {
	Cmd    *exec.Cmd
	record string // the file naming it for the sweep, "" if none
}

// Start starts cmd (as cmd.Start) so that it dies with this process.
// Wait for it with Proc.Wait, which drops its record.
func Start(cmd *exec.Cmd) (*Proc, error) {
	return start(cmd, true)
}

func start(cmd *exec.Cmd, deathSignal bool) (*Proc, error) {
	sweepOnce.Do(func() { Sweep() })
	if deathSignal {
		setDeathSignal(cmd)
	}
	var err error
	onLauncherThread(func() { err = cmd.Start() })
	if err != nil {
		return nil, err
	}
	return &Proc{Cmd: cmd, record: register(cmd.Process.Pid)}, nil
}

// Wait waits for the process to exit (as cmd.Wait) and drops its record.
func (p *Proc) Wait() error {
	err := p.Cmd.Wait()
	unregister(p.record)
	return err
}

// CombinedOutput runs cmd as cmd.CombinedOutput does, started as Start
// starts a child: for short commands (redis-cli) that must not outlive
// the test either.
func CombinedOutput(cmd *exec.Cmd) ([]byte, error) {
	var b bytes.Buffer // one writer for both: exec gives them one pipe
	cmd.Stdout, cmd.Stderr = &b, &b
	p, err := Start(cmd)
	if err != nil {
		return nil, err
	}
	err = p.Wait()
	return b.Bytes(), err
}

var sweepOnce sync.Once

// The launcher is a goroutine locked to its OS thread that never returns,
// so the thread every child is created from lives as long as the process
// and the parent-death signal fires only when the process dies.
var launcher struct {
	once sync.Once
	reqs chan func()
}

func onLauncherThread(f func()) {
	launcher.once.Do(func() {
		launcher.reqs = make(chan func())
		go func() {
			runtime.LockOSThread() // never unlocked: the thread is this goroutine's for good
			for f := range launcher.reqs {
				f()
			}
		}()
	})
	done := make(chan struct{})
	launcher.reqs <- func() { defer close(done); f() }
	<-done
}

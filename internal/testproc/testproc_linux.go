package testproc

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// recordDir holds one file per running child, named owner-child by pid.
// A variable so that this package's tests can sweep a directory of their
// own.
var recordDir = filepath.Join(os.TempDir(), "floodgate-testproc-"+strconv.Itoa(os.Getuid()))

func setDeathSignal(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
}

// A record names a child and the process that started it, each by pid
// and start time (clock ticks since boot), and the boot.
type record struct {
	boot              string
	owner, ownerStart int
	child, childStart int
}

// register records pid as this process's child; it returns the record's
// path, or "" when there is none (the child has already gone, or the
// directory cannot be written: the death signal still applies).
func register(pid int) string {
	self, ok1 := startTime(os.Getpid())
	child, ok2 := startTime(pid)
	if !ok1 || !ok2 || os.MkdirAll(recordDir, 0o700) != nil {
		return ""
	}
	r := record{boot: bootID(), owner: os.Getpid(), ownerStart: self, child: pid, childStart: child}
	path := filepath.Join(recordDir, fmt.Sprintf("%d-%d", r.owner, r.child))
	body := fmt.Sprintf("%s %d %d %d %d\n", r.boot, r.owner, r.ownerStart, r.child, r.childStart)
	// written whole under another name, so a sweep never reads half of it
	if os.WriteFile(path+".tmp", []byte(body), 0o600) != nil || os.Rename(path+".tmp", path) != nil {
		os.Remove(path + ".tmp")
		return ""
	}
	return path
}

func unregister(path string) {
	if path != "" {
		os.Remove(path)
	}
}

// Sweep kills every recorded child whose test binary has gone (SIGKILL,
// then SIGCONT in case it was paused) and drops the records of children
// that have gone. Start calls it once per process; it is the last resort
// for a child the death signal missed.
func Sweep() {
	entries, err := os.ReadDir(recordDir)
	if err != nil {
		return
	}
	boot := bootID()
	for _, e := range entries {
		path := filepath.Join(recordDir, e.Name())
		if strings.HasSuffix(e.Name(), ".tmp") {
			// left by a process that died between the two steps of register
			if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > time.Minute {
				os.Remove(path)
			}
			continue
		}
		r, ok := readRecord(path)
		switch {
		case !ok || r.boot != boot:
			os.Remove(path)
		case !alive(r.child, r.childStart):
			os.Remove(path)
		case alive(r.owner, r.ownerStart):
			// its test binary still runs and will stop it
		default:
			kill(r.child, r.childStart)
			os.Remove(path)
		}
	}
}

func readRecord(path string) (record, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return record{}, false
	}
	var r record
	n, err := fmt.Sscanf(string(b), "%s %d %d %d %d", &r.boot, &r.owner, &r.ownerStart, &r.child, &r.childStart)
	return r, err == nil && n == 5
}

// kill sends SIGKILL and SIGCONT to pid if it is still the process that
// started at start. The process is held by a pidfd (os.FindProcess on
// Linux) before its start time is checked, so a pid reused meanwhile is
// never signalled.
func kill(pid, start int) {
	p, err := os.FindProcess(pid)
	if err != nil {
		return
	}
	defer p.Release()
	if !alive(pid, start) {
		return
	}
	p.Signal(syscall.SIGKILL)
	p.Signal(syscall.SIGCONT)
}

// alive reports whether pid runs (and is not a zombie) and started at
// start.
func alive(pid, start int) bool {
	st, state, ok := stat(pid)
	return ok && st == start && state != 'Z' && state != 'X'
}

func startTime(pid int) (int, bool) {
	st, _, ok := stat(pid)
	return st, ok
}

// stat reads a process's start time and state from /proc/pid/stat.
func stat(pid int) (start int, state byte, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	// the command name, in parentheses, may hold spaces: fields count
	// from the last ')'; state is field 3, starttime field 22
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 || len(f[0]) != 1 {
		return 0, 0, false
	}
	start, err = strconv.Atoi(f[19])
	return start, f[0][0], err == nil
}

func bootID() string {
	b, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if id := strings.TrimSpace(string(b)); id != "" {
		return id
	}
	return "unknown"
}

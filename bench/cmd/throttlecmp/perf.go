package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
)

// Instructions, not seconds.
//
// Goodput per server CPU-second divides by a capacity measured seconds
// earlier, and a shared host's speed drifts in between: the CPU time one
// unit of work took differed by 8 % between two peers' runs of the same
// round (other tenants on the sibling hyperthread, the clock's
// frequency). That noise is larger than the differences between peers
// near capacity. The number of instructions a unit of work retires does
// not drift, so the same goodput, counted in instructions the server
// process retired (user and kernel: net/http, the runtime and the
// network stack are the server's overhead too), separates peers whose
// CPU-time goodput is within the noise: it answers "of what this server
// executed, how much was answered work", relative to the same ratio with
// no admission control in the way (the capacity phases).
//
// The counts come from perf stat attached to the server process
// (-p PID: its threads and, inherited, every thread it starts after),
// started with the counters off and switched on and off through its
// control pipe (--control fd:ctl,ack: each command is acknowledged once
// done), so a phase's count starts and ends where the phase does. Where
// perf or the counters are unavailable (not Linux, perf_event_paranoid,
// a VM without a PMU), the instruction figures are left out.

// recordTo, if set (-perf-record DIR), makes each counted phase a perf
// record profile of the server's instructions in DIR (PID-N.perf.data,
// N counting the phases of the run: the capacity before, the window,
// the capacity after), for perf report; the instruction figures are
// then not printed.
var recordTo string

var recordSeq atomic.Int64

// perfCounter is one perf stat process counting a server's instructions.
type perfCounter struct {
	cmd *exec.Cmd
	ctl *os.File      // commands to perf
	ack *bufio.Reader // its acknowledgements
	out string        // the file perf writes its count into
}

// startPerf attaches perf stat to pid with its counter off.
func startPerf(pid int) (*perfCounter, error) {
	path, err := exec.LookPath("perf")
	if err != nil {
		return nil, err
	}
	ctlR, ctlW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	ackR, ackW, err := os.Pipe()
	if err != nil {
		ctlR.Close()
		ctlW.Close()
		return nil, err
	}
	f, err := os.CreateTemp("", "throttlecmp-perf-*.csv")
	if err != nil {
		return nil, err
	}
	f.Close()
	// fds 3 and 4 in perf: ExtraFiles[0] and [1]
	args := []string{"stat", "-x,", "-e", "instructions", "-D", "-1", "--control", "fd:3,4", "-p", strconv.Itoa(pid), "-o", f.Name()}
	if recordTo != "" { // a profile of where the instructions go, instead of their count
		args = []string{"record", "-q", "-e", "instructions", "-F", "4000", "-D", "-1", "--control", "fd:3,4", "-p", strconv.Itoa(pid),
			"-o", fmt.Sprintf("%s/%d-%d.perf.data", recordTo, pid, recordSeq.Add(1))}
	}
	cmd := exec.Command(path, args...)
	cmd.ExtraFiles = []*os.File{ctlR, ackW}
	if err := cmd.Start(); err != nil {
		os.Remove(f.Name())
		return nil, err
	}
	ctlR.Close()
	ackW.Close()
	return &perfCounter{cmd: cmd, ctl: ctlW, ack: bufio.NewReader(ackR), out: f.Name()}, nil
}

// command sends enable or disable and waits until perf has done it.
func (p *perfCounter) command(c string) error {
	if _, err := p.ctl.WriteString(c + "\n"); err != nil {
		return err
	}
	line, err := p.ack.ReadString('\n')
	if err != nil {
		return fmt.Errorf("perf %s: %w", c, err)
	}
	if strings.Trim(line, "\x00 \n") != "ack" { // perf ends each ack with a NUL
		return fmt.Errorf("perf %s: %q", c, line)
	}
	return nil
}

func (p *perfCounter) on() error  { return p.command("enable") }
func (p *perfCounter) off() error { return p.command("disable") }

// count stops perf and returns the instructions counted while on.
func (p *perfCounter) count() (float64, error) {
	defer os.Remove(p.out)
	p.ctl.Close()
	p.cmd.Process.Signal(syscall.SIGINT) //nolint:errcheck
	p.cmd.Wait()                         //nolint:errcheck
	b, err := os.ReadFile(p.out)
	if err != nil {
		return 0, err
	}
	return parsePerfCount(string(b))
}

// parsePerfCount reads the instruction count from perf stat -x, output.
func parsePerfCount(out string) (float64, error) {
	for _, line := range strings.Split(out, "\n") {
		f := strings.Split(line, ",")
		if len(f) >= 3 && strings.HasPrefix(f[2], "instructions") {
			n, err := strconv.ParseFloat(f[0], 64)
			if err != nil {
				return 0, fmt.Errorf("perf: %q: %v", line, err) // "<not supported>", "<not counted>"
			}
			return n, nil
		}
	}
	return 0, errors.New("perf: no instruction count in its output")
}

// counting runs phase with the server's instructions counted, and
// returns them (0 and the error when they cannot be counted).
func counting(pid int, phase func()) (float64, error) {
	p, err := startPerf(pid)
	if err != nil {
		phase()
		return 0, err
	}
	if err := p.on(); err != nil {
		p.count() //nolint:errcheck
		phase()
		return 0, err
	}
	phase()
	if err := p.off(); err != nil {
		p.count() //nolint:errcheck
		return 0, err
	}
	return p.count()
}

package main

import (
	"os/exec"
	"strings"
	"testing"
)

func TestParsePerfCount(t *testing.T) {
	for _, c := range []struct {
		out  string
		want float64
		err  string
	}{
		{"# started on Fri Nov 27 11:04:06 2026\n\n9609691899,,instructions,1850418578,100.00,,\n", 9609691899, ""},
		{"199728,,instructions:u,17110800,100.00,,\n", 199728, ""},
		{"<not supported>,,instructions,0,100.00,,\n", 0, "not supported"},
		{"# started\n\n", 0, "no instruction count"},
	} {
		got, err := parsePerfCount(c.out)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%q: error %v, want one with %q", c.out, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%q: %v, %v; want %v", c.out, got, err, c.want)
		}
	}
}

// A phase's count is what the process retired while it ran, through
// perf's control pipe: a child burning a known loop counts at least its
// loop's instructions, and a phase that does nothing counts far fewer.
func TestCountingControlsPerf(t *testing.T) {
	if _, err := exec.LookPath("perf"); err != nil {
		t.Skip("no perf here")
	}
	cmd := exec.Command("sh", "-c", "read x; i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; read y")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait() //nolint:errcheck
	defer in.Close()
	idle, err := counting(cmd.Process.Pid, func() {})
	if err != nil && !strings.Contains(err.Error(), "<not counted>") { // asleep throughout: perf ran no counter
		if strings.Contains(err.Error(), "not supported") {
			t.Skipf("instructions cannot be counted here: %v", err)
		}
		t.Fatal(err)
	}
	busy, err := counting(cmd.Process.Pid, func() {
		in.Write([]byte("go\n")) //nolint:errcheck
		// the loop runs until the second line; give it until it has
		// retired a good many instructions by waiting for it to finish
		// reading: the shell reads the second line only after the loop
		in.Write([]byte("end\n")) //nolint:errcheck
		cmd.Wait()                //nolint:errcheck
	})
	if err != nil {
		t.Fatal(err)
	}
	if busy < 10*idle || busy < 1e7 {
		t.Errorf("a 200,000-iteration shell loop counted %.0f instructions, an idle phase %.0f", busy, idle)
	}
}

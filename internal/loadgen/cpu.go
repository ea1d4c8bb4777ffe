package loadgen

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"
)

// procCPU returns the user+system CPU time consumed so far by all threads of
// process pid, from fields 14 and 15 (utime, stime) of /proc/PID/stat.
// Their unit is the clock tick (USER_HZ, normally 100 per second), so the
// result has a resolution of 10 ms: over a 10 s run at one busy core that is
// 0.1%.
func procCPU(pid int) (time.Duration, error) {
	path := "/proc/" + strconv.Itoa(pid) + "/stat"
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return parseProcStat(b, clockTicks())
}

// parseProcStat extracts utime+stime from the text of /proc/PID/stat. The
// command name (field 2) is in parentheses and may itself hold spaces or
// parentheses, so fields are counted from the last ')'.
func parseProcStat(b []byte, hz int64) (time.Duration, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("malformed stat line")
	}
	f := bytes.Fields(b[i+1:])
	// f[0] is field 3 (state); utime is field 14, stime field 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("malformed stat line: %d fields after the name", len(f))
	}
	ut, err1 := strconv.ParseInt(string(f[11]), 10, 64)
	st, err2 := strconv.ParseInt(string(f[12]), 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("malformed utime/stime %q %q", f[11], f[12])
	}
	ticks := ut + st
	return time.Duration(ticks * int64(time.Second) / hz), nil
}

var (
	clkOnce sync.Once
	clkTck  int64
)

// clockTicks is the kernel's USER_HZ (sysconf(_SC_CLK_TCK)), read without cgo
// from the AT_CLKTCK entry of this process's ELF auxiliary vector; 100, the
// value on every mainstream Linux architecture, if that cannot be read.
func clockTicks() int64 {
	clkOnce.Do(func() {
		clkTck = 100
		b, err := os.ReadFile("/proc/self/auxv")
		if err != nil {
			return
		}
		const atClkTck = 17
		w := strconv.IntSize / 8
		for len(b) >= 2*w {
			var k, v uint64
			if w == 8 {
				k, v = binary.NativeEndian.Uint64(b), binary.NativeEndian.Uint64(b[8:])
			} else {
				k, v = uint64(binary.NativeEndian.Uint32(b)), uint64(binary.NativeEndian.Uint32(b[4:]))
			}
			b = b[2*w:]
			if k == 0 {
				break
			}
			if k == atClkTck && v > 0 {
				clkTck = int64(v)
				return
			}
		}
	})
	return clkTck
}

//go:build unix

package loadgen

import (
	"syscall"
	"time"
)

// selfCPU is the user+system CPU time of this process (microsecond
// resolution), for the load generator's own cost per request.
func selfCPU() (time.Duration, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}

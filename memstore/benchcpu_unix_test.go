//go:build unix

package memstore_test

import "syscall"

// cpuNanos is the CPU time (user and system) this process has used: on a
// shared machine a benchmark's wall time counts the time other processes
// held the CPU, its CPU time does not.
func cpuNanos() int64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

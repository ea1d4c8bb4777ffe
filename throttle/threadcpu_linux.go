package throttle

import (
	"net/http"
	"runtime"
	"syscall"
	"time"
)

const threadCPUSupported = true

// rusageThread is RUSAGE_THREAD (linux/resource.h): the calling thread's
// usage.
const rusageThread = 1

// threadCPU returns the calling thread's CPU time (user + system).
func threadCPU() (time.Duration, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(rusageThread, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}

// runThreadCPU runs next with the goroutine locked to its thread, so the
// thread's CPU time before and after is the handler's (its own
// goroutine's; the thread runs nothing else while locked).
func runThreadCPU(tk *Ticket, w http.ResponseWriter, r *http.Request, next http.Handler) {
	runtime.LockOSThread()
	before, ok := threadCPU()
	defer func() {
		after, ok2 := threadCPU()
		runtime.UnlockOSThread()
		if ok && ok2 {
			tk.DoneCost(after - before)
		} else {
			tk.Done()
		}
	}()
	next.ServeHTTP(w, r)
}

// processCPU returns the process's CPU time (user + system).
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return -1
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

package loadgen

import (
	"os"
	"runtime"
	"syscall"
	"time"
	"unsafe"
)

// Go's timers are checked whenever the scheduler runs, so they are precise
// on a busy runtime; but an idle runtime sleeps in epoll_wait, whose timeout
// is in milliseconds, so there a sleep shorter than 1 ms lasts about 1 ms —
// which would show as send lag, and latency, in the open loop at moderate
// rates. A timerfd in Go's netpoller is the reverse: its expiry wakes an idle
// epoll_wait at once, but a busy runtime polls the network only now and then.
// The dispatcher arms both and goes with the first.
type preciseTimer struct {
	f     *os.File
	fd    uintptr
	fired chan struct{} // a tick per timerfd expiry
}

func newPreciseTimer() *preciseTimer {
	const clockMonotonic = 1
	fd, _, errno := syscall.Syscall(syscall.SYS_TIMERFD_CREATE, clockMonotonic, syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if errno != 0 {
		return nil
	}
	f := os.NewFile(fd, "timerfd") // non-blocking: goes to the netpoller
	if f == nil {
		return nil
	}
	p := &preciseTimer{f: f, fd: fd, fired: make(chan struct{}, 1)}
	go func() {
		var buf [8]byte
		for {
			if _, err := f.Read(buf[:]); err != nil {
				return // closed
			}
			select {
			case p.fired <- struct{}{}:
			default:
			}
		}
	}()
	return p
}

// arm sets the timerfd to fire in d and returns the channel its expiry is
// signalled on, or nil if there is no timerfd. A tick may be stale (from an
// earlier arming), so the receiver must check the time.
func (p *preciseTimer) arm(d time.Duration) <-chan struct{} {
	if p == nil {
		return nil
	}
	spec := [2]syscall.Timespec{{}, syscall.NsecToTimespec(int64(d))} // interval 0, relative value d
	_, _, errno := syscall.Syscall6(syscall.SYS_TIMERFD_SETTIME, p.fd, 0, uintptr(unsafe.Pointer(&spec)), 0, 0, 0)
	runtime.KeepAlive(p.f)
	if errno != 0 {
		return nil
	}
	return p.fired
}

func (p *preciseTimer) close() {
	if p != nil {
		p.f.Close() // ends the reader
	}
}

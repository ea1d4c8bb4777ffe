//go:build unix

package proxy

import (
	"net"
	"syscall"
)

// connAlive peeks at an idle connection's socket without waiting: an open,
// quiet connection has nothing to read (EAGAIN); a closed one reads EOF.
func connAlive(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	alive := false
	var buf [1]byte
	err = rc.Read(func(fd uintptr) bool {
		_, _, rerr := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		alive = rerr == syscall.EAGAIN || rerr == syscall.EWOULDBLOCK
		return true // never wait
	})
	return err == nil && alive
}

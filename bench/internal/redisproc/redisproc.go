// Package redisproc starts a throwaway redis-server on a free loopback port
// for the benchmark tools.
package redisproc

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"time"
)

// Start runs redis-server on a free loopback port, without persistence,
// and returns its address once it answers, and a function that stops it
// and removes its directory.
func Start() (addr string, stop func(), err error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	dir, err := os.MkdirTemp("", "redisproc")
	if err != nil {
		return "", nil, err
	}
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "no", "--dir", dir, "--logfile", dir+"/redis.log")
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("start redis-server: %w", err)
	}
	stop = func() { cmd.Process.Kill(); cmd.Wait(); os.RemoveAll(dir) }
	addr = "127.0.0.1:" + strconv.Itoa(port)
	for i := 0; ; i++ {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			_, werr := c.Write([]byte("PING\r\n"))
			buf := make([]byte, 7)
			_, rerr := c.Read(buf)
			c.Close()
			if werr == nil && rerr == nil && string(buf) == "+PONG\r\n" {
				return addr, stop, nil
			}
		}
		if i > 200 {
			stop()
			return "", nil, errors.New("redis-server did not answer")
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// Use returns addr when it is given (with a stop that does nothing), or
// starts a redis-server as Start does.
func Use(addr string) (string, func(), error) {
	if addr != "" {
		return addr, func() {}, nil
	}
	return Start()
}

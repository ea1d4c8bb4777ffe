package redisstore

import (
	"bytes"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// A Redis on this host (a loopback address, a Unix socket) is starved with
// this process when the host is busy: on 2 cores with a load of 15, it
// waits for a CPU as long as this process does, and a call times out
// because Redis was not running, while this process's lag monitor (see
// starve.go) woke on time. So for a Redis on this host the store also
// reads the host's CPU pressure: Linux's pressure stall information,
// /proc/pressure/cpu, whose "some" line counts the time during which at
// least one runnable task waited for a CPU. Over a call's time that is an
// upper bound of how long Redis (or this process) waited; the store takes
// it as the call's lost time when it is more than this process's lag. It
// excuses a timeout only on the terms starve.go gives (a quarter of the
// call's time, and Redis's answers within the last max(500ms, 2 × the
// timeout) this process ran, this process's lag alone excluded): a busy
// host does not hide a local Redis that is dead. Without PSI (before Linux
// 4.20, or not mounted) only this process's lag counts.

// pressureFile is the host's CPU pressure (PSI).
const pressureFile = "/proc/pressure/cpu"

// pressureEvery is how often the lag monitor reads it, in its wake-ups:
// every 50ms.
const pressureEvery = 10

// pressureRing is how many readings are kept: 6.4 s of them.
const pressureRing = 128

// A pressureReading is the host's total CPU stall time (µs, PSI's "some
// total") at a time (µs since the epoch).
type pressureReading struct{ at, total int64 }

// hostPressure keeps the recent readings of the host's CPU pressure.
type hostPressure struct {
	read func() (int64, bool) // the stall total now; false: none to read

	mu sync.Mutex
	r  [pressureRing]pressureReading
	n  int // readings so far; the next goes at n % pressureRing
}

// sample reads the pressure at time now (µs).
func (h *hostPressure) sample(now int64) {
	total, ok := h.read()
	if !ok {
		return
	}
	h.mu.Lock()
	h.r[h.n%pressureRing] = pressureReading{now, total}
	h.n++
	h.mu.Unlock()
}

// starved returns the host's stall time over [from, to]: the readings'
// total, interpolated between them, and beyond the last one at the last
// interval's rate. 0 with fewer than two readings.
func (h *hostPressure) starved(from, to int64) time.Duration {
	if to <= from {
		return 0
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	k := min(h.n, pressureRing)
	if k < 2 {
		return 0
	}
	at := func(i int) pressureReading { return h.r[(h.n-k+i)%pressureRing] } // i-th oldest kept
	// total(t): interpolated within the readings, extrapolated past them
	// at the rate of the two nearest, never below 0
	total := func(t int64) float64 {
		i := 1
		for i < k-1 && at(i).at < t {
			i++
		}
		a, b := at(i-1), at(i)
		if b.at == a.at {
			return float64(b.total)
		}
		rate := float64(b.total-a.total) / float64(b.at-a.at)
		return float64(a.total) + rate*float64(t-a.at)
	}
	us := total(to) - total(max(from, at(0).at))
	return time.Duration(max(0, min(us, float64(to-from)))) * time.Microsecond
}

// readPressureFile returns a reader of the host's CPU stall total from
// pressureFile, or nil where it cannot be read.
func readPressureFile() func() (int64, bool) {
	f, err := os.Open(pressureFile)
	if err != nil {
		return nil
	}
	buf := make([]byte, 256)
	read := func() (int64, bool) {
		n, err := f.ReadAt(buf, 0)
		if n == 0 && err != nil {
			return 0, false
		}
		return parsePressure(buf[:n])
	}
	if _, ok := read(); !ok {
		f.Close()
		return nil
	}
	return read
}

// parsePressure reads the "some" line's total from a PSI file's text:
//
//	some avg10=0.00 avg60=0.00 avg300=0.00 total=12345
func parsePressure(b []byte) (int64, bool) {
	line, _, _ := bytes.Cut(b, []byte("\n"))
	if !bytes.HasPrefix(line, []byte("some ")) {
		return 0, false
	}
	_, v, ok := bytes.Cut(line, []byte("total="))
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64)
	return n, err == nil && n >= 0
}

// onThisHost reports whether every one of addrs (a client's nodes) is on
// this host: a loopback address or "localhost", or a Unix socket's path.
func onThisHost(addrs []string) bool {
	if len(addrs) == 0 {
		return false
	}
	for _, a := range addrs {
		if strings.HasPrefix(a, "/") {
			continue
		}
		host, _, err := net.SplitHostPort(a)
		if err != nil {
			return false
		}
		if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return false
		}
	}
	return true
}

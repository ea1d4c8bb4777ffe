package inflightredis_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/floodgate/floodgate/inflight/inflightredis"
	"github.com/floodgate/floodgate/internal/redistest"
	"github.com/floodgate/floodgate/internal/testproc"
)

const (
	procLimit = 5               // the cap on the one key
	procHeld  = 2               // slots the victim holds when it is killed
	procTTL   = 6 * time.Second // slot expiry; heartbeat every TTL/3
	// the victim's slots are surely still live this long after the kill:
	// its last heartbeat was at most TTL/3 before (2s), so they expire at
	// the kill + 4s at the earliest; 2.5s is left for a heartbeat a busy
	// host made late
	procDeadFor = 1500 * time.Millisecond
)

// tally is the test's own count of holders. A child reports a slot (and
// waits for the answer) after Acquire returned it and before it calls
// Release, so each interval the tally counts lies inside the real one: if
// the limiter ever let more than procLimit hold at once, so would the
// tally, whenever the overlap outlasts a round trip.
type tally struct {
	mu        sync.Mutex
	live      map[string]int // holders per child process
	dead      int            // the killed child's slots
	deadUntil time.Time      // until when they count
	peak      int            // most holders counted at once since reset
	livePeak  int            // most holders in live processes at once since reset
	err       error
}

func (ta *tally) total(now time.Time) int {
	n := 0
	for _, v := range ta.live {
		n += v
	}
	if now.Before(ta.deadUntil) {
		n += ta.dead
	}
	return n
}

func (ta *tally) apply(proc, op string) {
	ta.mu.Lock()
	defer ta.mu.Unlock()
	if op == "rel" {
		ta.live[proc]--
		return
	}
	ta.live[proc]++
	n := ta.total(time.Now())
	ta.peak = max(ta.peak, n)
	live := 0
	for _, v := range ta.live {
		live += v
	}
	ta.livePeak = max(ta.livePeak, live)
	if n > procLimit && ta.err == nil {
		ta.err = fmt.Errorf("%d holders at %v (limit %d): %v, dead %d until %v", n, time.Now().Format(time.StampMilli), procLimit, ta.live, ta.dead, ta.deadUntil.Format(time.StampMilli))
	}
}

func (ta *tally) serve(l net.Listener) {
	for {
		conn, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer conn.Close()
			sc := bufio.NewScanner(conn)
			for sc.Scan() {
				var proc, op string
				if _, err := fmt.Sscan(sc.Text(), &proc, &op); err != nil {
					return
				}
				ta.apply(proc, op)
				if _, err := conn.Write([]byte("ok\n")); err != nil {
					return
				}
			}
		}()
	}
}

// Three processes on one real redis-server share a cap of 5 on one key.
// One of them holds 2 slots and is killed with SIGKILL; the tally of
// holders never passes 5 at any instant, the dead slots stay counted
// (and so unusable) for a while after the kill, and come back after the
// expiry: the two live processes then reach 5 holders between them.
func TestCapAcrossProcessesWithKill(t *testing.T) {
	srv := redistest.Standalone(t)
	sock := filepath.Join(t.TempDir(), "tally.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ta := &tally{live: map[string]int{}}
	go ta.serve(l)
	t.Cleanup(func() { l.Close() })

	victim := startChild(t, srv.Addr, sock, "victim", "hold")
	redistest.WaitFor(t, 20*time.Second, "the victim to hold its slots", func() bool {
		ta.mu.Lock()
		defer ta.mu.Unlock()
		return ta.live["victim"] == procHeld
	})
	startChild(t, srv.Addr, sock, "a", "churn")
	startChild(t, srv.Addr, sock, "b", "churn")
	waitPeak(t, ta, procLimit, "the three processes to reach the limit")

	ta.mu.Lock()
	ta.dead, ta.deadUntil = ta.live["victim"], time.Now().Add(procDeadFor)
	delete(ta.live, "victim")
	ta.peak, ta.livePeak = 0, 0
	ta.mu.Unlock()
	killed := time.Now()
	if err := victim.Cmd.Process.Kill(); err != nil { // SIGKILL: no release, no goodbye
		t.Fatal(err)
	}
	_ = victim.Wait()
	waitPeak(t, ta, procLimit-procHeld, "the live processes to use the free slots")
	// only after the expiry can the live processes hold all 5
	waitLivePeak(t, ta, procLimit, "the dead process's slots to come back after the expiry")
	if el := time.Since(killed); el < procDeadFor {
		t.Fatalf("the dead slots came back %v after the kill, before their expiry", el)
	}
	t.Logf("dead slots back within %v of the kill (TTL %v)", time.Since(killed), procTTL)

	ta.mu.Lock()
	defer ta.mu.Unlock()
	if ta.err != nil {
		t.Fatal(ta.err)
	}
}

func waitPeak(t *testing.T, ta *tally, want int, what string) {
	t.Helper()
	redistest.WaitFor(t, 20*time.Second, what, func() bool {
		ta.mu.Lock()
		defer ta.mu.Unlock()
		if ta.err != nil {
			t.Fatal(ta.err)
		}
		return ta.peak >= want
	})
}

func waitLivePeak(t *testing.T, ta *tally, want int, what string) {
	t.Helper()
	redistest.WaitFor(t, 20*time.Second, what, func() bool {
		ta.mu.Lock()
		defer ta.mu.Unlock()
		if ta.err != nil {
			t.Fatal(ta.err)
		}
		return ta.livePeak >= want
	})
}

func startChild(t *testing.T, addr, sock, name, mode string) *testproc.Proc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestInflightChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), "FLOODGATE_INFLIGHT_CHILD="+mode, "FLOODGATE_INFLIGHT_NAME="+name,
		"FLOODGATE_INFLIGHT_REDIS="+addr, "FLOODGATE_INFLIGHT_SOCK="+sock)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	p, err := testproc.Start(cmd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Cmd.Process.Kill(); _ = p.Wait() })
	return p
}

// TestInflightChild is a child process of TestCapAcrossProcessesWithKill;
// it does nothing unless started by it.
func TestInflightChild(t *testing.T) {
	mode := os.Getenv("FLOODGATE_INFLIGHT_CHILD")
	if mode == "" {
		t.Skip("a helper process")
	}
	name, sock := os.Getenv("FLOODGATE_INFLIGHT_NAME"), os.Getenv("FLOODGATE_INFLIGHT_SOCK")
	r := newRedisOn(t, redisClient(t, os.Getenv("FLOODGATE_INFLIGHT_REDIS")),
		inflightredis.Options{Limit: procLimit, TTL: procTTL, Prefix: "procs:"})
	workers := 6
	if mode == "hold" {
		workers = procHeld
	}
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() { childWorker(r, name, sock, mode == "hold") })
	}
	wg.Wait()
	os.Exit(0) // the tally has gone: the test is over
}

// childWorker takes a slot, reports it, holds it (forever if hold), reports
// its end and releases it, until the tally's socket closes.
func childWorker(r *inflightredis.Redis, name, sock string, hold bool) {
	conn, err := net.Dial("unix", sock)
	if err != nil {
		return
	}
	defer conn.Close()
	rd := bufio.NewReader(conn)
	say := func(op string) bool {
		if _, err := conn.Write([]byte(name + " " + op + "\n")); err != nil {
			return false
		}
		_, err := rd.ReadString('\n')
		return err == nil
	}
	for i := 0; ; i++ {
		tok, ok, err := r.Acquire(context.Background(), "k")
		if err != nil || !ok {
			time.Sleep(time.Millisecond)
			continue
		}
		if !say("acq") {
			tok.Release()
			return
		}
		if hold {
			select {} // until SIGKILL
		}
		time.Sleep(time.Duration(1+i%3) * time.Millisecond)
		if !say("rel") {
			tok.Release()
			return
		}
		tok.Release()
	}
}

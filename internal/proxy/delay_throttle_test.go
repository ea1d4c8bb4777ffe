package proxy

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/gate"
	"github.com/floodgate/floodgate/throttle"
)

// delayLimit delays requests under /slow/ at one an hour (a bucket of
// one: the first passes, the next waits an hour, the one after two),
// for up to 10 hours.
func delayLimit() gate.Limit {
	pol := floodgate.MustPolicy("slow", floodgate.Rule{Algorithm: floodgate.TokenBucket, Limit: 1, Period: time.Hour})
	return gate.Limit{Name: "slow", Policy: pol, Match: gate.Match{PathPrefix: "/slow/"}, Action: gate.Delay, MaxDelay: 10 * time.Hour}
}

// sendDelayed sends GET path on a connection of its own and reports the
// answer's status on the channel (-1: none, the connection closed). The
// connection is returned, for the test to close.
func (tp *throttledProxy) sendDelayed(t *testing.T, path string) (net.Conn, chan int) {
	t.Helper()
	c := dialFrom(t, "127.0.0.1", tp.addr)
	io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n") //nolint:errcheck
	done := make(chan int, 1)
	go func() {
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			done <- -1
			return
		}
		io.Copy(io.Discard, resp.Body) //nolint:errcheck
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	return c, done
}

// sleepers waits until clk has n sleepers (the gate's delays).
func sleepers(t *testing.T, clk *clock.Manual, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := clk.WaitForSleepers(ctx, n); err != nil {
		t.Fatalf("%d requests in their delay: only %d after 10 s", n, clk.Sleepers())
	}
}

// TestDelayHoldsNoSlot: with the throttler's limit at 2 and no queue, 4
// requests waiting out a delay action (on the gate's manual clock) hold
// no slot and no queued cost: a request of another route is served at
// once (before the change it was shed with 503: the 2 slots were held by
// sleeping requests, the rest queued or shed). A delay that ends while
// both slots are held is shed like any arrival (503, never reaching the
// upstream); one that ends with a slot free is admitted and forwarded. A
// client that leaves during its delay frees everything; the in-flight
// count is right at every step, and each request is counted admitted
// once (the one served after its delay is readmitted).
func TestDelayHoldsNoSlot(t *testing.T) {
	clk := clock.NewManual(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	tp := serveThrottledClock(t, throttle.Config{Limit: 2}, clk, nil, delayLimit())
	if st := tp.get(t, "127.0.0.1", "/slow/first"); st != 200 {
		t.Fatalf("the first /slow/ request: %d, want 200 (the bucket's one)", st)
	}
	conns := make([]net.Conn, 4)
	dones := make([]chan int, 4)
	for i := range 4 {
		conns[i], dones[i] = tp.sendDelayed(t, "/slow/d")
	}
	sleepers(t, clk, 4)
	if st := tp.th.Stats(); st.InFlight != 0 || st.Queued != 0 || st.QueuedCost != 0 || st.Admitted != 5 {
		t.Fatalf("4 requests in their delay: %+v; want nothing in flight or queued, 5 admitted (the first and the 4 before the gate)", st)
	}
	for i := range 3 {
		if st := tp.get(t, "127.0.0.1", "/free"); st != 200 {
			t.Fatalf("a request of another route while 4 are delayed, try %d: %d, want 200 at once", i+1, st)
		}
	}

	// both slots held by the upstream: the delay that ends is shed
	arrived := tp.arrived.Load() + 2
	held := make([]chan int, 2)
	for i := range held {
		held[i] = make(chan int, 1)
		go func() {
			resp, err := http.Get("http://" + tp.addr + "/held")
			if err != nil {
				held[i] <- -1
				return
			}
			resp.Body.Close()
			held[i] <- resp.StatusCode
		}()
	}
	waitUntil(t, "both slots held", func() bool { return tp.th.Stats().InFlight == 2 && tp.arrived.Load() == arrived })
	refused := tp.th.Stats().Refused[throttle.Critical]
	clk.Advance(time.Hour) // the first delay ends
	shed := -1
	waitUntil(t, "a delayed request answered", func() bool {
		for i, d := range dones {
			select {
			case st := <-d:
				if st != 503 {
					t.Fatalf("a delay ending with every slot held: %d, want 503", st)
				}
				shed = i
				return true
			default:
			}
		}
		return false
	})
	if st := tp.th.Stats(); st.Refused[throttle.Critical] != refused+1 || st.InFlight != 2 || tp.arrived.Load() != arrived {
		t.Errorf("after the shed delay: %+v, upstream %d (was %d); want one more refused, 2 in flight, no new arrival", st, tp.arrived.Load(), arrived)
	}
	tp.release()
	for _, h := range held {
		if st := <-h; st != 200 {
			t.Errorf("a held request: %d", st)
		}
	}
	waitUntil(t, "the slots back", func() bool { return tp.th.Stats().InFlight == 0 })

	// the next delay ends with the slots free: admitted and forwarded
	clk.Advance(time.Hour)
	next := -1
	waitUntil(t, "the next delayed request answered", func() bool {
		for i, d := range dones {
			if i == shed {
				continue
			}
			select {
			case st := <-d:
				if st != 200 {
					t.Fatalf("a delay ending with the slots free: %d, want 200", st)
				}
				next = i
				return true
			default:
			}
		}
		return false
	})

	// the other two leave during their delay
	for i, c := range conns {
		if i != shed && i != next {
			c.Close()
		}
	}
	waitUntil(t, "the delays ended by their clients", func() bool { return clk.Sleepers() == 0 })
	if st := tp.th.Stats(); st.InFlight != 0 || st.Queued != 0 || st.Completions != 7 {
		t.Errorf("throttler at the end: %+v; want nothing in flight or queued, 7 completions (first, 3 free, 2 held, the delayed one)", st)
	}
	// each request admitted once: the delayed one served was readmitted,
	// not admitted a second time (admitted_total against completions)
	if st := tp.th.Stats(); st.Admitted != 10 || st.Suspended != 4 || st.Readmitted != 1 {
		t.Errorf("throttler at the end: %+v; want 10 admitted (first, 4 delayed, 3 free, 2 held), 4 suspended, 1 readmitted", st)
	}
}

// TestDelayEndsQueuedClientLeaves: a delay that ends while the one slot
// is held waits in the throttler's queue like any arrival, and its
// client's leaving there takes it out (withdrawn): nothing stays queued
// or in flight.
func TestDelayEndsQueuedClientLeaves(t *testing.T) {
	clk := clock.NewManual(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	tp := serveThrottledClock(t, throttle.Config{Limit: 1, MaxQueueCost: time.Hour}, clk, nil, delayLimit())
	if st := tp.get(t, "127.0.0.1", "/slow/first"); st != 200 {
		t.Fatalf("the first /slow/ request: %d", st)
	}
	c, done := tp.sendDelayed(t, "/slow/d")
	sleepers(t, clk, 1)
	held := tp.hold(t)
	clk.Advance(time.Hour)
	waitUntil(t, "the delayed request queued", func() bool { return tp.th.Stats().Queued == 1 })
	c.Close()
	waitUntil(t, "it left the queue", func() bool { return tp.th.Stats().Queued == 0 })
	if st := <-done; st != -1 {
		t.Errorf("the client that left read %d", st)
	}
	tp.release()
	<-held
	waitUntil(t, "nothing in flight", func() bool { return tp.th.Stats().InFlight == 0 })
	if st := tp.th.Stats(); st.Withdrawn[throttle.Critical] != 1 || st.Queued != 0 {
		t.Errorf("throttler: %+v; want 1 withdrawn", st)
	}
	if n := tp.arrived.Load(); n != 2 {
		t.Errorf("the upstream saw %d requests, want 2 (the first and the held)", n)
	}
}

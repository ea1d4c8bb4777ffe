package capacity

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/floodgate/floodgate/capacity/server"
	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/internal/lease"
)

// The bottom half's tests, against the real server (capacity/server over
// gRPC on loopback), on a manual clock shared by the servers and clients.

// resourcesYAML: "r" has no safe capacity (the server's is capacity /
// clients), "s" a configured one.
const resourcesYAML = `resources:
  - id: r
    capacity: 100
    algorithm: fair_share
    lease_length: 60s
    refresh_interval: 5s
  - id: s
    capacity: 100
    safe_capacity: 30
    algorithm: fair_share
    lease_length: 60s
    refresh_interval: 5s
  - id: "*"
    capacity: 10
`

type testServer struct {
	*server.Server
	addr string
	gs   *grpc.Server
}

// startServer serves resources on a free loopback port (or on addr when
// given: a restart).
func startServer(t *testing.T, clk *clock.Manual, addr string, opts server.Options) *testServer {
	t.Helper()
	cfg, err := lease.ParseConfig("resources.yaml", []byte(resourcesYAML))
	if err != nil {
		t.Fatal(err)
	}
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	opts.Clock, opts.Logger = clk, quietLogger()
	s := &testServer{Server: server.New(cfg, opts), addr: ln.Addr().String(), gs: grpc.NewServer()}
	s.Register(s.gs)
	go s.gs.Serve(ln)
	t.Cleanup(s.gs.Stop)
	return s
}

// kill stops the server at once: its listener and connections close.
func (s *testServer) kill() { s.gs.Stop() }

func newClient(t *testing.T, clk *clock.Manual, addrs ...string) *Client {
	t.Helper()
	c, err := New(ClientOptions{Addrs: addrs, Clock: clk, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

func refresh(t *testing.T, cs ...*Client) {
	t.Helper()
	for _, c := range cs {
		if err := c.Refresh(context.Background()); err != nil {
			t.Fatalf("client %s: %v", c.ID(), err)
		}
	}
}

func mustResource(t *testing.T, c *Client, id string, o Options) *Resource {
	t.Helper()
	r, err := c.Resource(id, o)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// Each mode with its server killed: the lease runs on to its expiry on the
// clock, then the capacity is exactly 0, the wants, or the safe capacity
// (the server's capacity / clients, or the configured one), and Allow
// admits exactly that.
func TestModesWithServerKilled(t *testing.T) {
	cases := []struct {
		mode     Mode
		r, s     float64 // the capacity after expiry
		admitted int     // Allow on r after expiry, at one instant
	}{
		{Pessimistic, 0, 0, 0},
		{Optimistic, 80, 80, 80},
		{Safe, 50, 30, 50},
	}
	for _, tc := range cases {
		t.Run(string(tc.mode), func(t *testing.T) {
			clk := clock.NewManual(t0)
			srv := startServer(t, clk, "", server.Options{})
			a, b := newClient(t, clk, srv.addr), newClient(t, clk, srv.addr)
			ra := mustResource(t, a, "r", Options{Wants: 80, Mode: tc.mode})
			sa := mustResource(t, a, "s", Options{Wants: 80, Mode: tc.mode})
			mustResource(t, b, "r", Options{Wants: 80, Mode: tc.mode})
			mustResource(t, b, "s", Options{Wants: 80, Mode: tc.mode})
			settle(t, a)
			settle(t, b)
			// Both loops asleep till the next refresh: A's first lease
			// predates B; a round gives leases that count both.
			refresh(t, a, b, a, b)
			l, ok := ra.Lease()
			if !ok || l.Capacity <= 0 || l.Safe != 50 {
				t.Fatalf("lease on r: %+v (%v), want a capacity and safe 50 (100 / 2 clients)", l, ok)
			}
			if got := ra.Capacity(); got != l.Capacity || !ra.Leased() {
				t.Fatalf("capacity %v, want the lease's %v", got, l.Capacity)
			}
			pre := ra.Stats()
			n := admit(t, ra, 5)
			if st := ra.Stats(); st.LeasedRefused != pre.LeasedRefused+uint64(5-n) || st.Fallback != pre.Fallback {
				t.Fatalf("5 decisions under the lease counted %+v (before %+v), want none under Fallback", st, pre)
			}
			srv.kill()
			if err := a.Refresh(context.Background()); err == nil {
				t.Fatal("refresh with the server killed: no error")
			}
			clk.Set(l.Expiry.Add(-time.Microsecond))
			if got := ra.Capacity(); got != l.Capacity {
				t.Fatalf("server down, 1µs before expiry: capacity %v, want the lease's %v", got, l.Capacity)
			}
			clk.Set(l.Expiry)
			if got := ra.Capacity(); got != tc.r || ra.Leased() {
				t.Fatalf("at expiry: capacity of r %v (leased %v), want %v", got, ra.Leased(), tc.r)
			}
			if got := sa.Capacity(); got != tc.s {
				t.Fatalf("at expiry: capacity of s %v, want %v", got, tc.s)
			}
			before := ra.Stats()
			if got := admit(t, ra, 200); got != tc.admitted {
				t.Fatalf("at expiry: Allow admitted %d, want %d", got, tc.admitted)
			}
			// The 200 decisions after expiry are the mode's, none the
			// lease's: refusals by mode.
			st := ra.Stats()
			want := Stats{Mode: tc.mode, LeasedRefused: before.LeasedRefused,
				Fallback: Counts{Allowed: before.Fallback.Allowed + uint64(tc.admitted),
					Refused: before.Fallback.Refused + uint64(200-tc.admitted)}}
			if st != want {
				t.Fatalf("stats after 200 decisions past expiry: %+v, want %+v", st, want)
			}
		})
	}
}

// A client given only a replica follows the redirect to the master, and
// after a failover follows the old master's redirect to the new one,
// keeping its lease (the new master learns it).
func TestRedirectToMaster(t *testing.T) {
	clk := clock.NewManual(t0)
	m := startServer(t, clk, "", server.Options{})
	rep := startServer(t, clk, "", server.Options{Replica: true})
	rep.SetMastership(false, m.addr)
	c := newClient(t, clk, rep.addr) // the replica only
	r := mustResource(t, c, "r", Options{Wants: 40})
	refresh(t, c)
	if c.Master() != m.addr {
		t.Fatalf("master %q, want %q (named by the replica)", c.Master(), m.addr)
	}
	if got := r.Capacity(); got != 40 {
		t.Fatalf("capacity %v, want 40", got)
	}
	if got := m.Outstanding("r"); got != 40 {
		t.Fatalf("master's outstanding %v, want 40", got)
	}
	if got := rep.Outstanding("r"); got != 0 {
		t.Fatalf("replica's outstanding %v, want 0 (it grants nothing)", got)
	}

	// Failover: the replica becomes master; the old one redirects to it.
	rep.SetMastership(true, rep.addr)
	m.SetMastership(false, rep.addr)
	clk.Advance(5 * time.Second)
	refresh(t, c)
	if c.Master() != rep.addr {
		t.Fatalf("after failover: master %q, want %q", c.Master(), rep.addr)
	}
	if got := r.Capacity(); got != 40 || !r.Leased() {
		t.Fatalf("after failover: capacity %v (leased %v), want 40 kept through learning mode", got, r.Leased())
	}
	if got := rep.Outstanding("r"); got != 40 {
		t.Fatalf("new master's outstanding %v, want 40", got)
	}
}

// Close gives the lease back: another client gets the capacity at once,
// at the same instant, not when the lease would have expired.
func TestReleaseOnCloseFreesCapacity(t *testing.T) {
	clk := clock.NewManual(t0)
	srv := startServer(t, clk, "", server.Options{})
	a, b := newClient(t, clk, srv.addr), newClient(t, clk, srv.addr)
	ra := mustResource(t, a, "r", Options{Wants: 100, Mode: Pessimistic})
	settle(t, a)
	if got := ra.Capacity(); got != 100 {
		t.Fatalf("a: capacity %v, want 100", got)
	}
	rb := mustResource(t, b, "r", Options{Wants: 100, Mode: Pessimistic})
	settle(t, b) // and asleep till its next refresh: the clock does not move
	if got := rb.Capacity(); got != 0 {
		t.Fatalf("b while a holds all: capacity %v, want 0 (never over-grant)", got)
	}
	if err := a.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := ra.Capacity(); got != 0 {
		t.Fatalf("a after Close: capacity %v, want 0 (pessimistic, no lease)", got)
	}
	if got := srv.Outstanding("r"); got != 0 {
		t.Fatalf("outstanding after a's Close: %v, want 0", got)
	}
	refresh(t, b)
	if got := rb.Capacity(); got != 100 {
		t.Fatalf("b after a's Close, same instant: capacity %v, want 100", got)
	}
}

// waitFor waits until cond holds of the client, checked each time its
// loop moves on (an attempt, going to sleep).
func waitFor(t *testing.T, c *Client, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		c.mu.Lock()
		ch := c.event
		c.mu.Unlock()
		if cond() {
			return
		}
		select {
		case <-ch:
		case <-ctx.Done():
			t.Fatalf("waiting for %s: not after 30s", what)
		}
	}
}

// waitAttempts waits until the client's loop has made n refresh attempts.
func waitAttempts(t *testing.T, c *Client, n int64) {
	t.Helper()
	waitFor(t, c, "refresh attempts", func() bool { return c.attempts.Load() >= n })
}

// settle waits until the client's loop sleeps with no wake-up pending:
// it has refreshed for every resource added.
func settle(t *testing.T, c *Client) {
	t.Helper()
	waitFor(t, c, "the loop asleep", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.wakeSleep != nil && !c.woken
	})
}

// advanceWhenAsleep advances the clock by d once the client's loop sleeps
// on it with no wake-up pending.
func advanceWhenAsleep(t *testing.T, c *Client, clk *clock.Manual, d time.Duration) {
	t.Helper()
	settle(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := clk.WaitForSleepers(ctx, 1); err != nil {
		t.Fatal("the refresh loop does not sleep:", err)
	}
	clk.Advance(d)
}

// The loop refreshes at the lease's refresh interval less at most the
// jitter, with one GetCapacity for all resources; and backs off, doubling,
// while the server is down.
func TestRefreshLoop(t *testing.T) {
	clk := clock.NewManual(t0)
	srv := startServer(t, clk, "", server.Options{})
	c := newClient(t, clk, srv.addr)
	r := mustResource(t, c, "r", Options{Wants: 10})
	s := mustResource(t, c, "s", Options{Wants: 20})
	// The refreshes new resources bring, then the loop asleep till the next.
	advanceWhenAsleep(t, c, clk, 0)
	base := c.attempts.Load()
	for i := base + 1; i <= base+3; i++ {
		now := clk.NowMicro()
		next := c.nextRefresh.Load() - now
		if next < (4500*time.Millisecond).Microseconds() || next > (5*time.Second).Microseconds() {
			t.Fatalf("next refresh in %dµs, want between 4.5s and 5s (5s less a jitter of 10%%)", next)
		}
		advanceWhenAsleep(t, c, clk, time.Duration(next)*time.Microsecond)
		waitAttempts(t, c, i)
		for _, x := range []*Resource{r, s} {
			l, _ := x.Lease()
			if want := clk.Now().Add(time.Minute); !l.Expiry.Equal(want) {
				t.Fatalf("refresh %d: %s's lease ends %v, want %v (renewed now)", i, x.ID(), l.Expiry, want)
			}
		}
	}
	// One client all along (a stable id): its renewals replace its lease
	// rather than add to what the server counts as held.
	if got := srv.Outstanding("r"); got != 10 {
		t.Fatalf("outstanding on r after 3 renewals: %v, want the one client's 10", got)
	}
	ok := c.refreshes.Load()
	if ok != base+3 {
		t.Fatalf("%d successful refreshes of %d, want all", ok, base+3)
	}

	srv.kill()
	want := c.opts.Backoff
	for i := base + 4; i <= base+7; i++ {
		advanceWhenAsleep(t, c, clk, time.Duration(c.nextRefresh.Load()-clk.NowMicro())*time.Microsecond)
		waitAttempts(t, c, i)
		next := time.Duration(c.nextRefresh.Load()-clk.NowMicro()) * time.Microsecond
		if next > want || next < want-time.Duration(c.opts.Jitter*float64(want)) {
			t.Fatalf("failure %d: retry in %v, want %v less at most 10%%", i-base-3, next, want)
		}
		want *= 2
	}
	if got := c.refreshes.Load(); got != ok {
		t.Fatalf("%d successful refreshes with the server down, want %d", got, ok)
	}

	// The server back on its address: the next attempt renews.
	startServer(t, clk, srv.addr, server.Options{})
	n := c.attempts.Load()
	advanceWhenAsleep(t, c, clk, time.Duration(c.nextRefresh.Load()-clk.NowMicro())*time.Microsecond)
	waitAttempts(t, c, n+1)
	if got := c.refreshes.Load(); got != ok+1 {
		t.Fatalf("the first attempt after the server came back failed (%d successful refreshes, want %d)", got, ok+1)
	}
	if l, _ := r.Lease(); !l.Expiry.Equal(clk.Now().Add(time.Minute)) || !r.Leased() {
		t.Fatalf("after the server came back: lease %+v, want one renewed now", l)
	}
}

// Wants that change a lot bring the refresh forward to MinInterval after
// the last one; a small change waits for the interval.
func TestSetWantsRefreshesEarly(t *testing.T) {
	clk := clock.NewManual(t0)
	srv := startServer(t, clk, "", server.Options{})
	c := newClient(t, clk, srv.addr)
	r := mustResource(t, c, "r", Options{Wants: 10})
	advanceWhenAsleep(t, c, clk, 0)
	n := c.attempts.Load()
	if err := r.SetWants(11); err != nil { // 9%: no wake-up
		t.Fatal(err)
	}
	c.mu.Lock()
	woken := c.woken
	c.mu.Unlock()
	if woken {
		t.Fatal("a 9% change of wants woke the refresh loop")
	}
	if err := r.SetWants(60); err != nil {
		t.Fatal(err)
	}
	advanceWhenAsleep(t, c, clk, c.opts.MinInterval)
	waitAttempts(t, c, n+1)
	if got := r.Capacity(); got != 60 {
		t.Fatalf("capacity %v one MinInterval after wanting 60, want 60", got)
	}
}

// A client with more resources than a call may carry splits its refresh
// and its release into calls of MaxBatch: the server refuses a call of
// more than its MaxResources, whole.
func TestBatches(t *testing.T) {
	clk := clock.NewManual(t0)
	srv := startServer(t, clk, "", server.Options{MaxResources: 2})
	c, err := New(ClientOptions{Addrs: []string{srv.addr}, Clock: clk, Logger: quietLogger(), MaxBatch: 2})
	if err != nil {
		t.Fatal(err)
	}
	var rs []*Resource
	for _, id := range []string{"a", "b", "c", "d", "e"} {
		rs = append(rs, mustResource(t, c, id, Options{Wants: 1, Mode: Pessimistic}))
	}
	refresh(t, c)
	for _, r := range rs {
		if got := r.Capacity(); got != 1 {
			t.Fatalf("%s: capacity %v, want 1", r.ID(), got)
		}
	}
	if err := c.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		if got := srv.Outstanding(r.ID()); got != 0 {
			t.Fatalf("%s: outstanding %v after Close, want 0 (released)", r.ID(), got)
		}
	}
}

// While no server answers, wants that change a lot do not bring the next
// attempt forward: the backoff holds.
func TestWantsWaitForBackoff(t *testing.T) {
	clk := clock.NewManual(t0)
	c := newClient(t, clk, closedAddr(t))
	r := mustResource(t, c, "r", Options{Wants: 10})
	waitAttempts(t, c, 1) // failed
	advanceWhenAsleep(t, c, clk, 0)
	next := c.nextRefresh.Load()
	for w := range 20 {
		if err := r.SetWants(float64(100 * (w%2 + 1))); err != nil {
			t.Fatal(err)
		}
	}
	advanceWhenAsleep(t, c, clk, 0)
	if got := c.attempts.Load(); got != 1 {
		t.Fatalf("%d attempts after 20 large changes of wants, want 1 (the backoff holds)", got)
	}
	if got := c.nextRefresh.Load(); got != next {
		t.Fatalf("next attempt moved from %d to %d", next, got)
	}
}

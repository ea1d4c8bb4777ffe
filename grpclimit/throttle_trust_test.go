package grpclimit_test

import (
	"context"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/floodgate/floodgate/grpclimit"
	"github.com/floodgate/floodgate/throttle"
)

// trustedAddr is the loopback source address the tests' trusted clients
// dial from (Linux routes all of 127.0.0.0/8 to lo); public clients come
// from 127.0.0.1.
const trustedAddr = "127.0.0.2"

// fromTrusted is a ThrottleOptions.Trusted by peer address.
func fromTrusted(ctx context.Context) bool {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return false
	}
	host, _, err := net.SplitHostPort(p.Addr.String())
	return err == nil && host == trustedAddr
}

// fromTrustedAddr dials from trustedAddr.
func fromTrustedAddr() grpc.DialOption {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(trustedAddr)}}
	return grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		return d.DialContext(ctx, "tcp", addr)
	})
}

// seenCall is what a handler saw: its level and the metadata key.
type seenCall struct {
	level throttle.Criticality
	set   bool
	md    []string
}

// levelHealth records what each call saw; service "hold" blocks until
// release is closed (after sending on held).
func levelHealth(seen chan<- seenCall, held chan<- struct{}, release <-chan struct{}) *ctlHealth {
	return &ctlHealth{check: func(ctx context.Context, svc string) error {
		if svc == "hold" {
			held <- struct{}{}
			<-release
			return nil
		}
		c, ok := throttle.FromContext(ctx)
		md, _ := metadata.FromIncomingContext(ctx)
		seen <- seenCall{c, ok, md["x-criticality"]}
		return nil
	}}
}

// callHealth makes a unary Check (or, with stream, a Watch and its first
// message) for svc, claiming claim in x-criticality (none if empty).
func callHealth(ctx context.Context, conn *grpc.ClientConn, svc, claim string, stream bool) error {
	if claim != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "x-criticality", claim)
	}
	cl := healthpb.NewHealthClient(conn)
	if !stream {
		_, err := cl.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
		return err
	}
	st, err := cl.Watch(ctx, &healthpb.HealthCheckRequest{Service: svc})
	if err == nil {
		_, err = st.Recv()
	}
	return err
}

func async(f func() error) chan error {
	ch := make(chan error, 1)
	go func() { ch <- f() }()
	return ch
}

// shedFor reports whether err is UNAVAILABLE for reason.
func shedFor(err error, reason string) bool {
	return status.Code(err) == codes.Unavailable && strings.Contains(status.Convert(err).Message(), "("+reason+")")
}

// TestThrottleUntrustedClaimAtCeiling over real gRPC, one slot and a
// queue of one call: an untrusted call claiming CRITICAL_PLUS is treated
// at the ceiling (CRITICAL): a real CRITICAL_PLUS from a trusted peer
// evicts it (a believed claim would have refused the trusted call at the
// full queue), and it cannot evict a queued CRITICAL call (a believed
// claim would have jumped the queue), unary or streaming.
func TestThrottleUntrustedClaimAtCeiling(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, stream := range []bool{false, true} {
		seen, held, release := make(chan seenCall, 4), make(chan struct{}, 1), make(chan struct{})
		th := throttle.New(throttle.Config{Limit: 1, MaxQueueCost: time.Millisecond})
		addr := serveThrottledWith(t, grpclimit.ThrottleOptions{Throttler: th, Trusted: fromTrusted}, levelHealth(seen, held, release))
		public, trusted := dialTo(t, addr), dialTo(t, addr, fromTrustedAddr())
		hold := async(func() error { return callHealth(ctx, public, "hold", "", false) })
		<-held
		fake := async(func() error { return callHealth(ctx, public, "fake", "CRITICAL_PLUS", stream) })
		waitFor(t, "the untrusted CRITICAL_PLUS queued", func() bool { return th.Stats().Queued == 1 })
		plus := async(func() error { return callHealth(ctx, trusted, "trusted", "CRITICAL_PLUS", stream) })
		select {
		case err := <-fake:
			if !shedFor(err, "evicted") {
				close(release)
				t.Fatalf("stream %v: untrusted CRITICAL_PLUS at a full queue: %v; want UNAVAILABLE, evicted", stream, err)
			}
		case err := <-plus:
			close(release)
			t.Fatalf("stream %v: the trusted CRITICAL_PLUS was answered first (%v): the untrusted claim held the queue", stream, err)
		}
		waitFor(t, "the trusted CRITICAL_PLUS queued", func() bool { return th.Stats().Queued == 1 })
		close(release)
		if err := <-plus; err != nil {
			t.Fatalf("stream %v: trusted CRITICAL_PLUS: %v", stream, err)
		}
		if s := <-seen; s.level != throttle.CriticalPlus {
			t.Errorf("stream %v: the trusted call ran at %v", stream, s.level)
		}
		if err := <-hold; err != nil {
			t.Fatal(err)
		}
		if st := th.Stats(); st.Evicted != [4]uint64{0, 0, 1, 0} || st.Refused != [4]uint64{} {
			t.Errorf("stream %v: stats %+v; want one CRITICAL evicted and nothing else shed", stream, st)
		}

		// a new throttler (no completions: the queue holds one call): a
		// genuine CRITICAL queued, the untrusted CRITICAL_PLUS refused
		th = throttle.New(throttle.Config{Limit: 1, MaxQueueCost: time.Millisecond})
		release = make(chan struct{})
		addr = serveThrottledWith(t, grpclimit.ThrottleOptions{Throttler: th, Trusted: fromTrusted}, levelHealth(seen, held, release))
		public = dialTo(t, addr)
		hold = async(func() error { return callHealth(ctx, public, "hold", "", false) })
		<-held
		genuine := async(func() error { return callHealth(ctx, public, "genuine", "CRITICAL", stream) })
		waitFor(t, "the CRITICAL call queued", func() bool { return th.Stats().Queued == 1 })
		err := callHealth(ctx, public, "fake", "critical-plus", stream)
		close(release)
		if !shedFor(err, "queue_full") {
			t.Fatalf("stream %v: untrusted CRITICAL_PLUS against a queued CRITICAL: %v; want UNAVAILABLE, queue_full", stream, err)
		}
		if err := <-genuine; err != nil {
			t.Fatalf("stream %v: the queued CRITICAL: %v", stream, err)
		}
		if s := <-seen; s.level != throttle.Critical {
			t.Errorf("stream %v: the queued call ran at %v", stream, s.level)
		}
		<-hold
		if st := th.Stats(); st.Refused != [4]uint64{0, 0, 1, 0} || st.Evicted != [4]uint64{} {
			t.Errorf("stream %v: stats %+v; want one CRITICAL refused and nothing else shed", stream, st)
		}
	}
}

// TestThrottleClaimLevels over real gRPC: the level a call runs at (in
// its context) and the incoming metadata its handler sees, by source,
// claim and ceiling, unary and streaming. Untrusted: a claim lowers,
// never raises; garbage and no claim are the ceiling. Trusted: the
// claim as it is. Criticality overrides everything. Trusted is asked
// only for a call with the key.
func TestThrottleClaimLevels(t *testing.T) {
	var asked atomic.Int64
	trust := func(ctx context.Context) bool { asked.Add(1); return fromTrusted(ctx) }
	shedPlus := func(context.Context, string) throttle.Criticality { return throttle.SheddablePlus }
	seen := make(chan seenCall, 1)
	h := levelHealth(seen, nil, nil)
	serve := func(o grpclimit.ThrottleOptions) string {
		o.Throttler = throttle.New(throttle.Config{Limit: 8})
		return serveThrottledWith(t, o, h)
	}
	plain := serve(grpclimit.ThrottleOptions{Trusted: trust})
	capped := serve(grpclimit.ThrottleOptions{Trusted: trust, Ceiling: shedPlus})
	invalid := serve(grpclimit.ThrottleOptions{Ceiling: func(context.Context, string) throttle.Criticality { return 7 }})
	decided := serve(grpclimit.ThrottleOptions{Trusted: trust, Ceiling: shedPlus,
		Criticality: func(context.Context, string) throttle.Criticality { return throttle.CriticalPlus }})
	nobody := serve(grpclimit.ThrottleOptions{})
	conns := map[string][2]*grpc.ClientConn{}
	for _, a := range []string{plain, capped, invalid, decided, nobody} {
		conns[a] = [2]*grpc.ClientConn{dialTo(t, a), dialTo(t, a, fromTrustedAddr())}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i, c := range []struct {
		name    string
		addr    string
		trusted bool
		claim   string
		want    throttle.Criticality
		md      string // what the handler's incoming metadata says; "" for nothing
	}{
		{"untrusted raises", plain, false, "CRITICAL_PLUS", throttle.Critical, "CRITICAL"},
		{"untrusted lowers", plain, false, "SHEDDABLE", throttle.Sheddable, "SHEDDABLE"},
		{"untrusted lowers, lower case", plain, false, "sheddable-plus", throttle.SheddablePlus, "SHEDDABLE_PLUS"},
		{"untrusted garbage", plain, false, "URGENT", throttle.Critical, "CRITICAL"},
		{"untrusted none", plain, false, "", throttle.Critical, ""},
		{"trusted raises", plain, true, "CRITICAL_PLUS", throttle.CriticalPlus, "CRITICAL_PLUS"},
		{"trusted lowers", plain, true, "SHEDDABLE", throttle.Sheddable, "SHEDDABLE"},
		{"trusted garbage", plain, true, "9", throttle.Critical, "CRITICAL"},
		{"ceiling: untrusted CRITICAL_PLUS", capped, false, "CRITICAL_PLUS", throttle.SheddablePlus, "SHEDDABLE_PLUS"},
		{"ceiling: untrusted lowers", capped, false, "SHEDDABLE", throttle.Sheddable, "SHEDDABLE"},
		{"ceiling: untrusted garbage", capped, false, "x", throttle.SheddablePlus, "SHEDDABLE_PLUS"},
		{"ceiling: untrusted none", capped, false, "", throttle.SheddablePlus, ""},
		{"ceiling: trusted raises", capped, true, "CRITICAL_PLUS", throttle.CriticalPlus, "CRITICAL_PLUS"},
		{"invalid ceiling: the default", invalid, false, "CRITICAL_PLUS", throttle.Critical, "CRITICAL"},
		{"Criticality decides", decided, false, "SHEDDABLE", throttle.CriticalPlus, "CRITICAL_PLUS"},
		{"no Trusted: nobody is", nobody, true, "CRITICAL_PLUS", throttle.Critical, "CRITICAL"},
	} {
		stream := i%2 == 1
		conn := conns[c.addr][0]
		if c.trusted {
			conn = conns[c.addr][1]
		}
		before := asked.Load()
		if err := callHealth(ctx, conn, "x", c.claim, stream); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		s := <-seen
		if s.level != c.want || s.set != (c.want != throttle.DefaultCriticality || c.claim != "") {
			t.Errorf("%s (stream %v): level %v (in the context: %v), want %v", c.name, stream, s.level, s.set, c.want)
		}
		if (c.md == "" && s.md != nil) || (c.md != "" && (len(s.md) != 1 || s.md[0] != c.md)) {
			t.Errorf("%s (stream %v): the handler's metadata says %q, want %q", c.name, stream, s.md, c.md)
		}
		if n := asked.Load() - before; (c.claim == "" || c.addr == decided) && n != 0 {
			t.Errorf("%s: Trusted asked %d times", c.name, n)
		}
	}
}

// TestThrottlePropagatesCappedLevel: a throttled front's handler calls a
// back that trusts it, through ThrottleClient, once on its context and
// once forwarding its incoming x-criticality: the back receives the level
// the front ran the call at — an untrusted caller's CRITICAL_PLUS as
// CRITICAL, so the back does not run it at CRITICAL_PLUS — and a trusted
// caller's claim as it is.
func TestThrottlePropagatesCappedLevel(t *testing.T) {
	seen := make(chan seenCall, 1)
	back := serveThrottledWith(t, grpclimit.ThrottleOptions{Throttler: throttle.New(throttle.Config{Limit: 4}),
		Trusted: func(context.Context) bool { return true }}, levelHealth(seen, nil, nil))
	u, s := grpclimit.ThrottleClient("")
	backConn := dialTo(t, back, grpc.WithUnaryInterceptor(u), grpc.WithStreamInterceptor(s))
	front := serveThrottledWith(t, grpclimit.ThrottleOptions{Throttler: throttle.New(throttle.Config{Limit: 4}), Trusted: fromTrusted},
		&ctlHealth{check: func(ctx context.Context, svc string) error {
			out := metadata.MD{}
			if svc == "forward" {
				md, _ := metadata.FromIncomingContext(ctx)
				out["x-criticality"] = md["x-criticality"]
			}
			return callHealth(metadata.NewOutgoingContext(ctx, out), backConn, "", "", false)
		}})
	public, trusted := dialTo(t, front), dialTo(t, front, fromTrustedAddr())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, c := range []struct {
		trusted bool
		claim   string
		want    throttle.Criticality
	}{
		{false, "CRITICAL_PLUS", throttle.Critical},
		{false, "junk", throttle.Critical},
		{false, "sheddable", throttle.Sheddable},
		{true, "CRITICAL_PLUS", throttle.CriticalPlus},
	} {
		conn := public
		if c.trusted {
			conn = trusted
		}
		for i, svc := range []string{"context", "forward"} {
			if err := callHealth(ctx, conn, svc, c.claim, i == 1); err != nil {
				t.Fatalf("%+v %s: %v", c, svc, err)
			}
			got := <-seen
			if got.level != c.want || len(got.md) != 1 || got.md[0] != c.want.String() {
				t.Errorf("trusted %v claiming %q, %s: the back received %q and ran at %v; want %v", c.trusted, c.claim, svc, got.md, got.level, c.want)
			}
		}
	}
}

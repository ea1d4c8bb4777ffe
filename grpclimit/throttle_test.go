package grpclimit_test

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/floodgate/floodgate/grpclimit"
	"github.com/floodgate/floodgate/throttle"
)

// ctlHealth is a health service whose Check and Watch run a function of
// the test's: block, record the level, panic.
type ctlHealth struct {
	healthpb.UnimplementedHealthServer
	check func(ctx context.Context, service string) error
}

func (h *ctlHealth) Check(ctx context.Context, r *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if err := h.check(ctx, r.Service); err != nil {
		return nil, err
	}
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

func (h *ctlHealth) Watch(r *healthpb.HealthCheckRequest, ss healthpb.Health_WatchServer) error {
	if err := h.check(ss.Context(), r.Service); err != nil {
		return err
	}
	return ss.Send(&healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING})
}

// recoverUnary turns a handler's panic into INTERNAL, as a server's
// recovery interceptor does; it runs outside the throttle's.
func recoverUnary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = status.Errorf(codes.Internal, "panic: %v", r)
		}
	}()
	return h(ctx, req)
}

func recoverStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = status.Errorf(codes.Internal, "panic: %v", r)
		}
	}()
	return h(srv, ss)
}

// serveThrottled serves h behind the throttle's interceptors on loopback
// and returns a client connection (with extra dial options).
func serveThrottled(t *testing.T, th *throttle.Throttler, h *ctlHealth, dial ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	return dialTo(t, serveThrottledWith(t, grpclimit.ThrottleOptions{Throttler: th, RetryAfter: 2 * time.Second}, h), dial...)
}

// serveThrottledWith serves h behind interceptors made with o on
// loopback and returns the server's address.
func serveThrottledWith(t *testing.T, o grpclimit.ThrottleOptions, h *ctlHealth) string {
	t.Helper()
	it, err := grpclimit.NewThrottle(o)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(recoverUnary, it.Unary()), grpc.ChainStreamInterceptor(recoverStream, it.Stream()))
	healthpb.RegisterHealthServer(srv, h)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return ln.Addr().String()
}

// dialTo returns a client connection to addr (with extra dial options).
func dialTo(t *testing.T, addr string, dial ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, append(dial, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func withLevel(ctx context.Context, c throttle.Criticality) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "x-criticality", c.String())
}

// One slot, a queue holding one call (an unseen route is predicted at
// 1 ms): a SHEDDABLE call queues; a CRITICAL one evicts it (UNAVAILABLE,
// retry-after 2) and queues; another CRITICAL is refused (queue full);
// the queued CRITICAL runs when the slot frees. Refused calls never reach
// the handler.
func TestThrottleShedsAtFullQueue(t *testing.T) {
	th := throttle.New(throttle.Config{Limit: 1, MaxQueueCost: time.Millisecond})
	release := make(chan struct{})
	ran := make(chan string, 8)
	conn := serveThrottled(t, th, &ctlHealth{check: func(ctx context.Context, s string) error {
		ran <- s
		if s == "hold" {
			<-release
		}
		return nil
	}})
	client := healthpb.NewHealthClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	call := func(c throttle.Criticality, svc string) chan error {
		ch := make(chan error, 1)
		go func() {
			var tr metadata.MD
			_, err := client.Check(withLevel(ctx, c), &healthpb.HealthCheckRequest{Service: svc}, grpc.Trailer(&tr))
			if status.Code(err) == codes.Unavailable && (len(tr["retry-after"]) != 1 || tr["retry-after"][0] != "2") {
				t.Errorf("%s: shed without retry-after 2: trailer %v", svc, tr)
			}
			ch <- err
		}()
		return ch
	}
	hold := call(throttle.Critical, "hold")
	if s := <-ran; s != "hold" {
		t.Fatalf("ran %q first", s)
	}
	shed := call(throttle.Sheddable, "sheddable")
	waitFor(t, "the sheddable call queued", func() bool { return th.Stats().Queued == 1 })
	crit := call(throttle.Critical, "critical")
	if err := <-shed; status.Code(err) != codes.Unavailable {
		t.Fatalf("evicted sheddable call: %v, want UNAVAILABLE", err)
	}
	waitFor(t, "the critical call queued", func() bool { return th.Stats().Queued == 1 })
	if err := <-call(throttle.Critical, "refused"); status.Code(err) != codes.Unavailable {
		t.Fatalf("call at a full queue: %v, want UNAVAILABLE", err)
	}
	close(release)
	for _, ch := range []chan error{hold, crit} {
		if err := <-ch; err != nil {
			t.Fatal(err)
		}
	}
	close(ran)
	var got []string
	for s := range ran {
		got = append(got, s)
	}
	if len(got) != 1 || got[0] != "critical" {
		t.Fatalf("after hold, the handler ran %v, want [critical]", got)
	}
	st := th.Stats()
	if st.Evicted[throttle.Sheddable] != 1 || st.Refused[throttle.Critical] != 1 || st.InFlight != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// The front's handler calls the back through ThrottleClient: the level
// the front ran the call at reaches the back's handler, unary and
// streaming — a lower claim as it is, an untrusted caller's CRITICAL_PLUS
// capped at CRITICAL; a caller naming none arrives as the default.
func TestThrottleCriticalityPropagated(t *testing.T) {
	seen := make(chan throttle.Criticality, 8)
	u, s := grpclimit.ThrottleClient("")
	back := serveThrottled(t, throttle.New(throttle.Config{Limit: 4}), &ctlHealth{check: func(ctx context.Context, _ string) error {
		c, _ := throttle.FromContext(ctx)
		seen <- c
		return nil
	}}, grpc.WithUnaryInterceptor(u), grpc.WithStreamInterceptor(s))
	backClient := healthpb.NewHealthClient(back)
	front := serveThrottled(t, throttle.New(throttle.Config{Limit: 4}), &ctlHealth{check: func(ctx context.Context, svc string) error {
		ctx = metadata.NewOutgoingContext(ctx, nil) // a server must not forward its incoming metadata
		if svc == "stream" {
			st, err := backClient.Watch(ctx, &healthpb.HealthCheckRequest{})
			if err != nil {
				return err
			}
			_, err = st.Recv()
			return err
		}
		_, err := backClient.Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}})
	client := healthpb.NewHealthClient(front)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, tc := range []struct {
		send []string
		svc  string
		want throttle.Criticality
	}{
		{[]string{"SHEDDABLE"}, "unary", throttle.Sheddable},
		{[]string{"critical_plus"}, "unary", throttle.Critical},
		{[]string{"CRITICAL_PLUS"}, "stream", throttle.Critical},
		{[]string{"sheddable-plus"}, "stream", throttle.SheddablePlus},
		{nil, "unary", throttle.DefaultCriticality},
	} {
		c := ctx
		for _, v := range tc.send {
			c = metadata.AppendToOutgoingContext(c, "x-criticality", v)
		}
		if _, err := client.Check(c, &healthpb.HealthCheckRequest{Service: tc.svc}); err != nil {
			t.Fatal(err)
		}
		if got := <-seen; got != tc.want {
			t.Errorf("sent %v via %s: the back saw %v, want %v", tc.send, tc.svc, got, tc.want)
		}
	}
}

// A handler that panics (unary or streaming) or returns an error gives
// its slot back: with one slot and no queue, every call after it is
// admitted, none refused.
func TestThrottleReleasesSlot(t *testing.T) {
	th := throttle.New(throttle.Config{Limit: 1})
	conn := serveThrottled(t, th, &ctlHealth{check: func(_ context.Context, s string) error {
		switch s {
		case "panic":
			panic("handler bug")
		case "error":
			return status.Error(codes.NotFound, "no such service")
		}
		return nil
	}})
	client := healthpb.NewHealthClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := range 3 {
		for _, svc := range []string{"panic", "error", "ok"} {
			_, err := client.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
			want := map[string]codes.Code{"panic": codes.Internal, "error": codes.NotFound, "ok": codes.OK}[svc]
			if status.Code(err) != want {
				t.Fatalf("round %d, unary %s: %v, want %v", i, svc, err, want)
			}
			st, err := client.Watch(ctx, &healthpb.HealthCheckRequest{Service: svc})
			if err == nil {
				_, err = st.Recv()
			}
			if status.Code(err) != want {
				t.Fatalf("round %d, stream %s: %v, want %v", i, svc, err, want)
			}
		}
	}
	waitFor(t, "the last stream's slot released", func() bool { return th.Stats().InFlight == 0 })
	if st := th.Stats(); st.Refused != [4]uint64{} || st.Admitted != 18 {
		t.Fatalf("stats %+v: want 18 admitted, none refused", st)
	}
}

func TestNewThrottleErrors(t *testing.T) {
	if _, err := grpclimit.NewThrottle(grpclimit.ThrottleOptions{}); err == nil {
		t.Error("no throttler: no error")
	}
	if _, err := grpclimit.NewThrottle(grpclimit.ThrottleOptions{Throttler: throttle.New(throttle.Config{}), RetryAfter: -time.Second}); err == nil {
		t.Error("negative RetryAfter: no error")
	}
}

package grpclimit_test

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/gate"
	"github.com/floodgate/floodgate/grpclimit"
	"github.com/floodgate/floodgate/throttle"
)

// TestThrottleGateCapsCriticality: with ThrottleOptions.Gate, a call's
// metadata may lower its level but not raise it past its method's limit
// (SHEDDABLE for Health/Watch, the default CRITICAL for Check); a trusted
// peer's claim is taken as it is.
func TestThrottleGateCapsCriticality(t *testing.T) {
	for _, c := range []struct {
		trusted bool
		method  string
		claim   string
		want    throttle.Criticality
	}{
		{false, "Check", "CRITICAL_PLUS", throttle.Critical},
		{false, "Check", "SHEDDABLE", throttle.Sheddable},
		{false, "Check", "", throttle.Critical},
		{false, "Watch", "CRITICAL_PLUS", throttle.Sheddable},
		{true, "Watch", "CRITICAL_PLUS", throttle.CriticalPlus},
		{true, "Watch", "", throttle.Sheddable},
	} {
		pol := floodgate.MustPolicy("big", floodgate.Rule{Algorithm: floodgate.TokenBucket, Limit: 1000, Period: time.Second})
		var trusted []netip.Prefix
		if c.trusted {
			trusted = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
		}
		g, err := gate.New(gate.Config{ClientIP: gate.ClientIP{TrustedProxies: trusted}, Limits: []gate.Limit{
			{Name: "watch", Policy: pol, Match: gate.Match{Path: "/grpc.health.v1.Health/Watch"}, Criticality: "SHEDDABLE"},
		}})
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan throttle.Criticality, 1)
		h := &ctlHealth{check: func(ctx context.Context, _ string) error {
			lv, _ := throttle.FromContext(ctx)
			got <- lv
			return nil
		}}
		it, err := grpclimit.NewThrottle(grpclimit.ThrottleOptions{Throttler: throttle.New(throttle.Config{Limit: 4}), Gate: g})
		if err != nil {
			t.Fatal(err)
		}
		srv := grpc.NewServer(grpc.UnaryInterceptor(it.Unary()), grpc.StreamInterceptor(it.Stream()))
		healthpb.RegisterHealthServer(srv, h)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go srv.Serve(ln)
		conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if c.claim != "" {
			lv, _ := throttle.ParseCriticality(c.claim)
			ctx = withLevel(ctx, lv)
		}
		cl := healthpb.NewHealthClient(conn)
		if c.method == "Check" {
			_, err = cl.Check(ctx, &healthpb.HealthCheckRequest{})
		} else {
			var st healthpb.Health_WatchClient
			if st, err = cl.Watch(ctx, &healthpb.HealthCheckRequest{}); err == nil {
				_, err = st.Recv()
			}
		}
		if err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		if lv := <-got; lv != c.want {
			t.Errorf("trusted %v, %s claiming %q: level %v, want %v", c.trusted, c.method, c.claim, lv, c.want)
		}
		cancel()
		conn.Close()
		srv.Stop()
		g.Close()
	}
}

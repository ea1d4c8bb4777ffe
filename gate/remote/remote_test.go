package remote_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http/httptest"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/gate"
	"github.com/floodgate/floodgate/gate/remote"
	"github.com/floodgate/floodgate/memstore"
	"github.com/floodgate/floodgate/rules"
	"github.com/floodgate/floodgate/service"
)

// serve starts floodgate's service with rules on a loopback gRPC server
// and returns a client of it.
func serve(t *testing.T, rulesYAML string) rlsv3.RateLimitServiceClient {
	t.Helper()
	return serveTraced(t, rulesYAML, nil)
}

// serveTraced is serve, the service tracing to tp.
func serveTraced(t *testing.T, rulesYAML string, tp trace.TracerProvider) rlsv3.RateLimitServiceClient {
	t.Helper()
	d, err := rules.Parse("remote.yaml", []byte(rulesYAML))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := rules.NewConfig(d)
	if err != nil {
		t.Fatal(err)
	}
	clk := clock.NewManual(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	ms, err := memstore.New(memstore.Options{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ms.Close() })
	svc := service.New(cfg, service.Options{Store: ms, Clock: clk, Logger: slog.New(slog.DiscardHandler), TracerProvider: tp})
	gs := grpc.NewServer()
	svc.RegisterGRPC(gs)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(ln)
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}

// A gate asks floodgate's service over gRPC: a value with '|' and '%'
// reaches the service's rules as the client sent it, a limit's cost is
// the descriptor's hits_addend, and the service's decisions and RateLimit
// fields come back.
func TestGateOverGRPC(t *testing.T) {
	rc, err := remote.New(serve(t, `domain: web
descriptors:
  - key: tier
    value: "a|b%c"
    rate_limit: {unit: hour, requests_per_unit: 5, name: tier-abc}
`), remote.Options{Domain: "web", Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	g, err := gate.New(gate.Config{Remote: rc, Limits: []gate.Limit{{Name: "tiers", Cost: 2, Key: []gate.Part{gate.Header("X-Tier").As("tier")}}}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	for i, want := range []struct {
		allowed   bool
		remaining int64
	}{{true, 3}, {true, 1}, {false, 1}} {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("X-Tier", "a|b%c")
		var v gate.Verdict
		g.Check(&gate.Request{HTTP: r, Peer: "192.0.2.1:1"}, &v)
		if v.Err != nil || v.Allowed != want.allowed || v.Deciding == nil {
			t.Fatalf("request %d: allowed %v, deciding %+v, err %v", i, v.Allowed, v.Deciding, v.Err)
		}
		d := v.Deciding.Decision
		if d.Limit != 5 || d.Remaining != want.remaining || d.Rule != "tier-abc" || len(v.RemoteHeaders) == 0 {
			t.Errorf("request %d: decision %+v, headers %v; want remaining %d", i, d, v.RemoteHeaders, want.remaining)
		}
		if !want.allowed && (d.RetryAfter <= 0 || !v.Deciding.Over) {
			t.Errorf("request %d: refused with %+v", i, v.Deciding)
		}
	}
}

// deadlineRLS records its call's deadline and domain, and answers OK.
type deadlineRLS struct {
	left   time.Duration
	domain string
}

func (d *deadlineRLS) ShouldRateLimit(ctx context.Context, in *rlsv3.RateLimitRequest, _ ...grpc.CallOption) (*rlsv3.RateLimitResponse, error) {
	if dl, ok := ctx.Deadline(); ok {
		d.left = time.Until(dl)
	}
	d.domain = in.Domain
	return &rlsv3.RateLimitResponse{}, nil
}

// A call is bounded by Options.Timeout, 100 ms by default, and carries
// the domain.
func TestTimeout(t *testing.T) {
	for _, c := range []struct {
		timeout, want time.Duration
	}{{0, remote.DefaultTimeout}, {time.Hour, time.Hour}} {
		rls := &deadlineRLS{}
		rc, err := remote.New(rls, remote.Options{Domain: "web", Timeout: c.timeout})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := rc.Decide(context.Background(), nil); err != nil {
			t.Fatal(err)
		}
		if rls.left <= 0 || rls.left > c.want || rls.domain != "web" {
			t.Errorf("timeout %v: the call had %v left, domain %q; want at most %v", c.timeout, rls.left, rls.domain, c.want)
		}
	}
}

// New refuses a client it cannot use, naming what is wrong.
func TestNewErrors(t *testing.T) {
	for _, c := range []struct {
		rls  remote.RateLimitClient
		opts remote.Options
		want string
	}{
		{nil, remote.Options{Domain: "web"}, "remote: the RateLimitClient is nil"},
		{&deadlineRLS{}, remote.Options{}, "remote: Options.Domain is empty"},
		{&deadlineRLS{}, remote.Options{Domain: "web", Timeout: -time.Second}, "remote: Options.Timeout is negative"},
	} {
		if _, err := remote.New(c.rls, c.opts); err == nil || err.Error() != c.want {
			t.Errorf("%+v: error %v, want %q", c.opts, err, c.want)
		}
	}
}

// errRLS fails every call.
type errRLS struct{}

func (errRLS) ShouldRateLimit(context.Context, *rlsv3.RateLimitRequest, ...grpc.CallOption) (*rlsv3.RateLimitResponse, error) {
	return nil, errors.New("down")
}

// A failed call is the gate's failure, its error passed on.
func TestCallError(t *testing.T) {
	rc, err := remote.New(errRLS{}, remote.Options{Domain: "web"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rc.Decide(context.Background(), []gate.Descriptor{{Cost: 1}}); err == nil || err.Error() != "down" {
		t.Fatalf("error %v", err)
	}
}

// A nil Client (New's error ignored) fails its calls rather than panic:
// the gate's failure policy decides.
func TestNilClient(t *testing.T) {
	var rc *remote.Client
	g, err := gate.New(gate.Config{Remote: rc, Logger: slog.New(slog.DiscardHandler), Limits: []gate.Limit{{Name: "per-ip", Key: []gate.Part{gate.IP()}}}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	var v gate.Verdict
	g.Check(&gate.Request{HTTP: httptest.NewRequest("GET", "/", nil), Peer: "192.0.2.1:1"}, &v)
	if v.Err == nil || !v.Allowed || !v.Degraded() {
		t.Fatalf("allowed %v, err %v", v.Allowed, v.Err)
	}
}

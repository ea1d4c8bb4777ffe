package httplimit_test

import (
	"net"
	"net/http"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/floodgate/floodgate/gate"
	"github.com/floodgate/floodgate/gate/remote"
	"github.com/floodgate/floodgate/httplimit"
	"github.com/floodgate/floodgate/memstore"
	"github.com/floodgate/floodgate/rules"
	"github.com/floodgate/floodgate/service"
)

// The middleware asks a remote rate limit service (floodgate's, over
// Envoy's generated gRPC client): the key parts become descriptor entries,
// the service's rules decide, and its RateLimit headers pass through.
func TestRemoteService(t *testing.T) {
	d, err := rules.Parse("remote.yaml", []byte(`domain: web
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 3, algorithm: token_bucket}
  - key: tier
    value: free
    descriptors:
      - key: user
        rate_limit: {unit: hour, requests_per_unit: 1, algorithm: token_bucket}
`))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := rules.NewConfig(d)
	if err != nil {
		t.Fatal(err)
	}
	ms, err := memstore.New(memstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ms.Close()
	svc := service.New(cfg, service.Options{Store: ms})
	gs := grpc.NewServer()
	svc.RegisterGRPC(gs)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(ln)
	defer gs.Stop()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	rc, err := remote.New(rlsv3.NewRateLimitServiceClient(conn), remote.Options{Domain: "web", Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	srv, served := serve(t, httplimit.Options{Config: gate.Config{
		Remote: rc,
		Limits: []gate.Limit{
			{Name: "per-ip", Key: []gate.Part{gate.IP()}},
			{Name: "free-users", Key: []gate.Part{gate.Const("tier", "free"), gate.Header("X-User").As("user").Or(gate.MissingSkip)}},
		},
	}})
	for i := 0; i < 4; i++ {
		resp := get(t, srv.URL)
		resp.Body.Close()
		if (resp.StatusCode == http.StatusOK) != (i < 3) {
			t.Fatalf("request %d: %d", i, resp.StatusCode)
		}
		if resp.Header.Get("RateLimit-Policy") == "" || resp.Header.Get("RateLimit") == "" {
			t.Fatalf("request %d: no RateLimit fields from the service: %v", i, resp.Header)
		}
		if i == 3 && resp.Header.Get("Retry-After") == "" {
			t.Fatal("refusal without Retry-After")
		}
	}
	if served.Load() != 3 {
		t.Fatalf("served %d", served.Load())
	}
}

// A remote service that does not answer: requests pass (fail open) and
// the call is bounded by the timeout.
func TestRemoteServiceDown(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rc, err := remote.New(rlsv3.NewRateLimitServiceClient(conn), remote.Options{Domain: "web", Timeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	srv, served := serve(t, httplimit.Options{Config: gate.Config{
		Remote: rc,
		Limits: []gate.Limit{{Name: "per-ip", Key: []gate.Part{gate.IP()}}},
	}})
	start := time.Now()
	resp := get(t, srv.URL)
	resp.Body.Close()
	if resp.StatusCode != 200 || served.Load() != 1 || time.Since(start) > 2*time.Second {
		t.Fatalf("status %d served %d in %v", resp.StatusCode, served.Load(), time.Since(start))
	}
}

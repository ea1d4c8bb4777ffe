package server_test

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/floodgate/floodgate/capacity/server"
	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/internal/lease"
)

// epoch is the manual clocks' start.
var epoch = time.Date(2026, 11, 27, 0, 0, 0, 0, time.UTC)

// rlqsHarness is a real gRPC server on loopback serving RLQS over a real
// lease Table, on a manual clock.
type rlqsHarness struct {
	t     *testing.T
	clock *clock.Manual
	srv   *server.Server
	table *lease.Table
	rlqs  *server.RLQS
	gs    *grpc.Server
	conn  *grpc.ClientConn
}

// resource is a config entry with every field set.
func resource(id string, capacity float64, alg lease.Algorithm) lease.Resource {
	return lease.Resource{
		ID: id, Capacity: capacity, Algorithm: alg,
		LeaseLength: 60 * time.Second, RefreshInterval: 5 * time.Second, LearningMode: 60 * time.Second,
		Pos: "test:1",
	}
}

// startRLQS serves cfg's resources over RLQS on a free loopback port.
func startRLQS(t *testing.T, cfg *lease.Config, opts server.RLQSOptions) *rlqsHarness {
	t.Helper()
	return startRLQSWith(t, cfg, server.Options{}, opts)
}

// startRLQSWith is startRLQS with the Server's options (its clock is the
// harness's).
func startRLQSWith(t *testing.T, cfg *lease.Config, sopts server.Options, opts server.RLQSOptions) *rlqsHarness {
	t.Helper()
	m := clock.NewManual(epoch)
	sopts.Clock = m
	srv := server.New(cfg, sopts)
	gs := grpc.NewServer()
	r := server.RegisterRLQS(gs, srv, opts)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(lis)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		gs.Stop()
		r.Close()
	})
	return &rlqsHarness{t: t, clock: m, srv: srv, table: srv.Table(), rlqs: r, gs: gs, conn: conn}
}

// envoy is a test RLQS client on go-control-plane's generated client,
// reporting as Envoy's rate_limit_quota filter does: a bucket's first
// report at once (one request, time_elapsed 0), then every bucket each
// reporting interval with the requests its assignment allowed and denied,
// time_elapsed in whole seconds.
type envoy struct {
	t       *testing.T
	h       *rlqsHarness
	domain  string
	stream  grpc.BidiStreamingClient[rlqspb.RateLimitQuotaUsageReports, rlqspb.RateLimitQuotaResponse]
	cancel  context.CancelFunc
	resps   chan *rlqspb.RateLimitQuotaResponse
	errc    chan error
	buckets map[string]*envoyBucket // by the bucket's only value, "name"
}

// envoyBucket is what the test Envoy holds for one bucket.
type envoyBucket struct {
	name    string
	demand  float64 // requests per second it sees
	rate    float64 // its assignment's tokens per second (TokenRate)
	expires time.Time
	has     bool // an assignment arrived (and was not abandoned)
}

// newEnvoy opens a stream.
func (h *rlqsHarness) newEnvoy(domain string) *envoy {
	h.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := rlqspb.NewRateLimitQuotaServiceClient(h.conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		h.t.Fatal(err)
	}
	e := &envoy{
		t: h.t, h: h, domain: domain, stream: stream, cancel: cancel,
		resps: make(chan *rlqspb.RateLimitQuotaResponse, 16), errc: make(chan error, 1),
		buckets: make(map[string]*envoyBucket),
	}
	go func() {
		for {
			r, err := stream.Recv()
			if err != nil {
				e.errc <- err
				return
			}
			e.resps <- r
		}
	}()
	h.t.Cleanup(cancel)
	return e
}

// bid is the bucket id {name: name}.
func bid(name string) *rlqspb.BucketId {
	return &rlqspb.BucketId{Bucket: map[string]string{"name": name}}
}

// send sends m, failing the test on error.
func (e *envoy) send(m *rlqspb.RateLimitQuotaUsageReports) {
	e.t.Helper()
	// io.EOF: the server has ended the stream (its status comes with the
	// next receive, which the test reads).
	if err := e.stream.Send(m); err != nil && !errors.Is(err, io.EOF) {
		e.t.Fatal(err)
	}
}

// subscribe matches the first request into bucket name (demand: its
// requests per second from now on) and sends its first report, then
// applies the answer.
func (e *envoy) subscribe(name string, demand float64) *rlqspb.RateLimitQuotaResponse {
	e.t.Helper()
	e.buckets[name] = &envoyBucket{name: name, demand: demand}
	e.send(&rlqspb.RateLimitQuotaUsageReports{
		Domain: e.domain,
		BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{{
			BucketId: bid(name), TimeElapsed: durationpb.New(0), NumRequestsAllowed: 1,
		}},
	})
	return e.apply(e.recv())
}

// report sends every bucket's usage over the last interval: its demand
// split into what its assignment allowed (no assignment: all allowed, the
// filter's default) and what it denied; then applies the answer.
func (e *envoy) report(interval time.Duration) *rlqspb.RateLimitQuotaResponse {
	e.t.Helper()
	e.sendReport(interval)
	return e.apply(e.recv())
}

// sendReport sends the usage report of report without waiting.
func (e *envoy) sendReport(interval time.Duration) {
	e.t.Helper()
	m := &rlqspb.RateLimitQuotaUsageReports{Domain: e.domain}
	for _, b := range e.buckets {
		n := b.demand * interval.Seconds()
		allowed := n
		if b.has && e.h.clock.Now().Before(b.expires) {
			allowed = min(n, b.rate*interval.Seconds())
		}
		m.BucketQuotaUsages = append(m.BucketQuotaUsages, &rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId:           bid(b.name),
			TimeElapsed:        durationpb.New(interval.Truncate(time.Second)),
			NumRequestsAllowed: uint64(allowed),
			NumRequestsDenied:  uint64(n - allowed),
		})
	}
	e.send(m)
}

// recv returns the next response, failing the test after 10s or on a
// stream error.
func (e *envoy) recv() *rlqspb.RateLimitQuotaResponse {
	e.t.Helper()
	select {
	case r := <-e.resps:
		return r
	case err := <-e.errc:
		e.t.Fatalf("stream ended: %v", err)
	case <-time.After(10 * time.Second):
		e.t.Fatal("no response in 10s")
	}
	return nil
}

// streamErr returns the stream's error, failing the test after 10s or on
// a response.
func (e *envoy) streamErr() error {
	e.t.Helper()
	select {
	case r := <-e.resps:
		e.t.Fatalf("a response, not an error: %v", r)
	case err := <-e.errc:
		return err
	case <-time.After(10 * time.Second):
		e.t.Fatal("no error in 10s")
	}
	return nil
}

// apply applies a response as Envoy does: an assignment replaces the
// bucket's (its TTL from now), an abandon erases the bucket; an action for
// a bucket it does not hold is ignored.
func (e *envoy) apply(r *rlqspb.RateLimitQuotaResponse) *rlqspb.RateLimitQuotaResponse {
	for _, a := range r.GetBucketAction() {
		name := a.GetBucketId().GetBucket()["name"]
		b := e.buckets[name]
		if b == nil {
			continue
		}
		if a.GetAbandonAction() != nil {
			delete(e.buckets, name)
			continue
		}
		qa := a.GetQuotaAssignmentAction()
		b.rate = server.TokenRate(qa.GetRateLimitStrategy().GetTokenBucket())
		b.expires = e.h.clock.Now().Add(time.Duration(qa.GetAssignmentTimeToLive().GetSeconds()) * time.Second)
		b.has = true
	}
	return r
}

// rate returns bucket name's assigned rate now (0 if it has none, or if it
// expired).
func (e *envoy) rate(name string) float64 {
	b := e.buckets[name]
	if b == nil || !b.has || !e.h.clock.Now().Before(b.expires) {
		return 0
	}
	return b.rate
}

// close ends the stream from the Envoy's side.
func (e *envoy) close() {
	e.t.Helper()
	if err := e.stream.CloseSend(); err != nil {
		e.t.Fatal(err)
	}
}

// waitFor polls cond (a state another goroutine reaches) until it holds,
// failing after 10s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after 10s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

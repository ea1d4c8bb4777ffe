package server

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/lease"
)

// RLQSOptions configure the Envoy Rate Limit Quota Service. The zero value
// takes every default.
type RLQSOptions struct {
	// Clock is the time source; nil: the Server's.
	Clock floodgate.Clock
	// MaxStreams bounds the open streams (Envoys); one more is refused
	// with ResourceExhausted. 0: DefaultRLQSMaxStreams.
	MaxStreams int
	// MaxBuckets bounds the buckets one stream may hold; a new bucket
	// beyond it is answered with an abandon action and not tracked.
	// 0: DefaultRLQSMaxBuckets.
	MaxBuckets int
	// MinDemand is the least demand (requests per second) a subscribed
	// bucket counts as wanting, so that an Envoy whose bucket was idle for
	// an interval is not assigned 0 (which refuses its next request).
	// 0: 1 request per second; negative: no floor.
	MinDemand float64
	// FillInterval is the token buckets' fill interval, whole seconds
	// (Envoy reads only the seconds). 0: one second.
	FillInterval time.Duration
	// TTLMargin is taken off a lease's remaining time before it is sent
	// as assignment_time_to_live (then rounded down to whole seconds:
	// Envoy reads only the seconds), so that Envoy's assignment, timed
	// from when it arrives, expires before the lease. 0: 500ms.
	TTLMargin time.Duration
	// IdleAfter is how long a bucket may report no requests before the
	// server abandons it (releasing its share). 0: the resource's lease
	// length.
	IdleAfter time.Duration
	// SweepInterval is how often the expiry pass runs. 0: one second.
	SweepInterval time.Duration
}

// Defaults of RLQSOptions.
const (
	DefaultRLQSMaxStreams = 10_000
	DefaultRLQSMaxBuckets = 1_000
)

// Limits on what a report may hold; beyond them the stream ends with
// InvalidArgument.
const (
	// MaxBucketIDBytes bounds a bucket's resource id (BucketResource:
	// the domain, the pairs and their escapes): the lease Table's bound.
	MaxBucketIDBytes = lease.MaxResourceLen
	// MaxReportElapsed bounds a usage's time_elapsed.
	MaxReportElapsed = 24 * time.Hour
	// maxCount bounds num_requests_allowed and num_requests_denied: 2^53,
	// past which a float64 no longer holds every count.
	maxCount = 1 << 53
	// maxDemand caps a bucket's demand (requests per second).
	maxDemand = 1e15
)

// RLQS is Envoy's Rate Limit Quota Service
// (envoy.service.rate_limit_quota.v3.RateLimitQuotaService) over a
// Server's lease table: each stream is one client of the table, each of
// its buckets a resource (BucketResource) whose wants are the bucket's
// demand, and each answer a token-bucket assignment of the stream's lease.
// It follows the Server: its resources configuration (a reload is seen
// within a SweepInterval, or at once by Sweep) and its mastership (a
// replica that is not the master ends each stream with Unavailable,
// naming the master). Build it with RegisterRLQS; it is safe for
// concurrent use.
type RLQS struct {
	rlqspb.UnimplementedRateLimitQuotaServiceServer

	srv   *Server
	table *lease.Table
	clock floodgate.Clock
	opts  RLQSOptions

	cfg     atomic.Pointer[rlqsConfig]
	metrics rlqsMetrics

	mu      sync.Mutex
	streams map[*rlqsStream]struct{}
	seq     uint64

	stop      context.CancelFunc
	stopped   chan struct{}
	closing   chan struct{} // closed by Close: streams end, new ones are refused
	closeOnce sync.Once
}

// rlqsConfig is a resources configuration and its generation: a bucket
// looked up under an older generation is looked up again.
type rlqsConfig struct {
	cfg *lease.Config
	gen uint64
}

// RegisterRLQS registers Envoy's Rate Limit Quota Service on gs, granting
// from srv's lease table (shared with srv's Capacity service, so both
// protocols split one capacity), and returns it. Close it when the gRPC
// server stops.
//
//	srv, err := server.Open("resources.yaml", server.Options{})
//	...
//	srv.Register(gs)
//	rlqs := server.RegisterRLQS(gs, srv, server.RLQSOptions{})
//	defer rlqs.Close()
func RegisterRLQS(gs grpc.ServiceRegistrar, srv *Server, opts RLQSOptions) *RLQS {
	r := NewRLQS(srv, opts)
	rlqspb.RegisterRateLimitQuotaServiceServer(gs, r)
	return r
}

// NewRLQS returns the service over srv without registering it
// (RegisterRLQS does both). It starts the expiry pass, which runs until
// Close.
func NewRLQS(srv *Server, opts RLQSOptions) *RLQS {
	if opts.Clock == nil {
		opts.Clock = srv.clock
	}
	opts = opts.withDefaults()
	r := &RLQS{
		srv:     srv,
		table:   srv.Table(),
		clock:   opts.Clock,
		opts:    opts,
		streams: make(map[*rlqsStream]struct{}),
		stopped: make(chan struct{}),
		closing: make(chan struct{}),
	}
	r.cfg.Store(&rlqsConfig{cfg: srv.Config(), gen: 1})
	ctx, cancel := context.WithCancel(context.Background())
	r.stop = cancel
	go r.sweepLoop(ctx)
	return r
}

// withDefaults fills in o's zero fields.
func (o RLQSOptions) withDefaults() RLQSOptions {
	if o.MaxStreams <= 0 {
		o.MaxStreams = DefaultRLQSMaxStreams
	}
	if o.MaxBuckets <= 0 {
		o.MaxBuckets = DefaultRLQSMaxBuckets
	}
	switch {
	case o.MinDemand == 0:
		o.MinDemand = 1
	case o.MinDemand < 0:
		o.MinDemand = 0
	}
	if o.FillInterval < time.Second {
		o.FillInterval = time.Second
	}
	if o.TTLMargin <= 0 {
		o.TTLMargin = 500 * time.Millisecond
	}
	if o.SweepInterval <= 0 {
		o.SweepInterval = time.Second
	}
	return o
}

// config returns the Server's live configuration, a new generation when
// it has changed since the last call.
func (r *RLQS) config() *rlqsConfig {
	live := r.srv.Config()
	for {
		cur := r.cfg.Load()
		if cur.cfg == live {
			return cur
		}
		if r.cfg.CompareAndSwap(cur, &rlqsConfig{cfg: live, gen: cur.gen + 1}) {
			return r.cfg.Load()
		}
	}
}

// Reload runs the expiry pass at once after the Server's configuration
// changed (call it from Options.OnReload; cfg is the Server's new
// configuration, which RLQS reads from the Server): a bucket whose entry
// is gone is abandoned, the others are granted again under the new
// capacities. Without it, the change is seen within a SweepInterval.
func (r *RLQS) Reload(cfg *lease.Config) { r.Sweep() }

// Sweep runs the expiry pass now (it runs every SweepInterval on its
// own): on every stream, a bucket not reported for its lease length is
// released and forgotten (Envoy stopped reporting it); a bucket reporting
// no requests for IdleAfter, or served by a configuration entry that a
// reload removed or renamed, is released and Envoy is told to abandon it
// (it subscribes again on its next request, under the entry matching
// now); after a reload the other buckets are granted again at once, under
// the new capacities. The table is updated before Sweep returns; the
// messages follow on each stream.
func (r *RLQS) Sweep() {
	for _, st := range r.snapshot() {
		if st.sweep() {
			st.wake()
		}
	}
}

// Streams returns the number of open streams.
func (r *RLQS) Streams() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.streams)
}

// Close ends every open stream with Unavailable ("the server is
// stopping": Envoy reconnects, through its cluster, to another server),
// refuses new ones the same way, and stops the expiry pass. Call it before
// the gRPC server's GracefulStop, which would otherwise wait for the
// Envoys' long-lived streams. The streams' leases are not released: their
// Envoys keep their assignments until the TTL. Close is idempotent.
func (r *RLQS) Close() {
	r.closeOnce.Do(func() {
		close(r.closing)
		r.stop()
	})
	<-r.stopped
}

// snapshot returns the open streams.
func (r *RLQS) snapshot() []*rlqsStream {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*rlqsStream, 0, len(r.streams))
	for st := range r.streams {
		out = append(out, st)
	}
	return out
}

// sweepLoop runs Sweep every SweepInterval until ctx ends.
func (r *RLQS) sweepLoop(ctx context.Context) {
	defer close(r.stopped)
	for r.clock.Sleep(ctx, r.opts.SweepInterval) == nil {
		r.Sweep()
	}
}

// now returns the clock's time.
func (r *RLQS) now() time.Time { return time.UnixMicro(r.clock.NowMicro()) }

// Package remote is a gate.Remote that asks a rate limit service over
// gRPC: `floodgate serve`, envoyproxy/ratelimit, or any service speaking
// envoy.service.ratelimit.v3.
//
//	conn, err := grpc.NewClient("ratelimit:8081", grpc.WithTransportCredentials(insecure.NewCredentials()))
//	rc, err := remote.New(rlsv3.NewRateLimitServiceClient(conn), remote.Options{Domain: "web"})
//	g, err := gate.New(gate.Config{Remote: rc, Limits: limits})
//
// It is a package of its own so that a gate deciding in process links
// neither Envoy's types nor grpc: httplimit compiles no grpc, grpclimit
// only grpc itself.
package remote

import (
	"context"
	"errors"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/gate"
)

// RateLimitClient is the client side of Envoy's rate limit service, as
// generated in go-control-plane (rlsv3.NewRateLimitServiceClient).
type RateLimitClient interface {
	// ShouldRateLimit asks the service to decide a request's descriptors.
	ShouldRateLimit(ctx context.Context, in *rlsv3.RateLimitRequest, opts ...grpc.CallOption) (*rlsv3.RateLimitResponse, error)
}

// Options configures a Client.
type Options struct {
	// Domain is the requests' domain; required.
	Domain string
	// Timeout bounds one call (default 100ms); past it the request passes
	// unless gate.Config.FailClosed.
	Timeout time.Duration
}

// DefaultTimeout is a call's bound when Options.Timeout is zero.
const DefaultTimeout = 100 * time.Millisecond

// Client asks a rate limit service for a gate's decisions: each limit of a
// request is one descriptor of a ShouldRateLimit call, its key parts the
// entries; the service's rules decide, and the response headers it
// returns are passed on. It is safe for concurrent use.
type Client struct {
	rls     RateLimitClient
	domain  string
	timeout time.Duration
}

// New returns a Client calling rls.
func New(rls RateLimitClient, opts Options) (*Client, error) {
	if rls == nil {
		return nil, errors.New("remote: the RateLimitClient is nil")
	}
	if opts.Domain == "" {
		return nil, errors.New("remote: Options.Domain is empty")
	}
	if opts.Timeout < 0 {
		return nil, errors.New("remote: Options.Timeout is negative")
	}
	if opts.Timeout == 0 {
		opts.Timeout = DefaultTimeout
	}
	return &Client{rls: rls, domain: opts.Domain, timeout: opts.Timeout}, nil
}

// Decide asks the service about descriptors in one ShouldRateLimit call.
func (c *Client) Decide(ctx context.Context, descriptors []gate.Descriptor) (gate.RemoteAnswer, error) {
	if c == nil {
		return gate.RemoteAnswer{}, errors.New("remote: nil Client (New failed?)")
	}
	req := &rlsv3.RateLimitRequest{Domain: c.domain, Descriptors: make([]*rlcommon.RateLimitDescriptor, len(descriptors))}
	for i, gd := range descriptors {
		d := &rlcommon.RateLimitDescriptor{Entries: make([]*rlcommon.RateLimitDescriptor_Entry, len(gd.Entries))}
		for j, e := range gd.Entries {
			d.Entries[j] = &rlcommon.RateLimitDescriptor_Entry{Key: e.Key, Value: e.Value}
		}
		if gd.Cost != 1 {
			d.HitsAddend = wrapperspb.UInt64(uint64(max(gd.Cost, 0)))
		}
		req.Descriptors[i] = d
	}
	cctx, cancel := context.WithTimeout(ctx, c.timeout)
	if trace.SpanContextFromContext(ctx).IsValid() {
		// the service's span continues the caller's trace (the gate's
		// span when it traces): W3C traceparent in the call's metadata
		mc := propagation.MapCarrier{}
		propagation.TraceContext{}.Inject(ctx, mc)
		for k, v := range mc {
			cctx = metadata.AppendToOutgoingContext(cctx, k, v)
		}
	}
	resp, err := c.rls.ShouldRateLimit(cctx, req)
	cancel()
	if err != nil {
		return gate.RemoteAnswer{}, err
	}
	ans := gate.RemoteAnswer{Decisions: make([]floodgate.Decision, len(resp.GetStatuses()))}
	for i, st := range resp.GetStatuses() {
		wait := st.GetDurationUntilReset().AsDuration()
		d := floodgate.Decision{
			Allowed:    st.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT,
			Limit:      int64(st.GetCurrentLimit().GetRequestsPerUnit()),
			Remaining:  int64(st.GetLimitRemaining()),
			ResetAfter: wait,
			RetryAfter: wait,
			Rule:       st.GetCurrentLimit().GetName(),
		}
		if !d.Allowed {
			d.Reason = floodgate.ReasonLimited
		}
		ans.Decisions[i] = d
	}
	for _, h := range resp.GetResponseHeadersToAdd() {
		ans.Headers = append(ans.Headers, [2]string{h.GetKey(), h.GetValue()})
	}
	return ans, nil
}

package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/floodgate/floodgate/gate"
	"github.com/floodgate/floodgate/inflight"
)

// InFlightOptions configure an InFlight cap.
type InFlightOptions struct {
	// Limiter holds the slots (required).
	Limiter inflight.Limiter
	// Key names the call's key from its context (metadata, peer, user)
	// and full method; ok false leaves the call uncapped. nil means
	// PeerKey, the client's address.
	Key func(ctx context.Context, fullMethod string) (key string, ok bool)
	// RetryAfter is the retry-after of a refusal, rounded up to whole
	// seconds; 0 means 1s.
	RetryAfter time.Duration
	// FailOpen lets a call through when its slot could not be asked for
	// (the limiter's store is down); otherwise it fails with UNAVAILABLE.
	FailOpen bool
}

// InFlight caps the calls in flight per key (the concurrent-requests
// limiter): a call past its key's cap fails at once with
// RESOURCE_EXHAUSTED, "too many requests in flight; retry in N s", and a
// retry-after trailer, a quota-like refusal, never queued. A stream holds
// its slot until its handler returns.
type InFlight struct {
	o     InFlightOptions
	retry string
}

// NewInFlight returns an in-flight cap.
func NewInFlight(o InFlightOptions) (*InFlight, error) {
	if o.Limiter == nil {
		return nil, errors.New("grpclimit: InFlightOptions.Limiter is nil")
	}
	if o.RetryAfter < 0 {
		return nil, fmt.Errorf("grpclimit: InFlightOptions.RetryAfter %v is negative", o.RetryAfter)
	}
	if o.Key == nil {
		o.Key = PeerKey
	}
	return &InFlight{o: o, retry: strconv.FormatInt(max(1, int64((o.RetryAfter+time.Second-1)/time.Second)), 10)}, nil
}

// PeerKey is the default key of InFlight: the call's peer address,
// without its port.
func PeerKey(ctx context.Context, _ string) (string, bool) {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return "", false
	}
	a := gate.PeerAddr(p.Addr.String())
	return a.String(), a.IsValid()
}

// acquire takes the call's slot; release is nil when none is held.
func (f *InFlight) acquire(ctx context.Context, method string) (release func(), trailer metadata.MD, err error) {
	k, ok := f.o.Key(ctx, method)
	if !ok {
		return nil, nil, nil
	}
	tok, ok, err := f.o.Limiter.Acquire(ctx, k)
	switch {
	case err != nil && ctx.Err() != nil:
		return nil, nil, status.FromContextError(ctx.Err()).Err()
	case err != nil && f.o.FailOpen:
		return nil, nil, nil
	case err != nil:
		return nil, metadata.Pairs("retry-after", "1"), status.Error(codes.Unavailable, "in-flight limiter unavailable; retry in 1 s")
	case !ok:
		return nil, metadata.Pairs("retry-after", f.retry), status.Error(codes.ResourceExhausted, "too many requests in flight; retry in "+f.retry+" s")
	}
	return tok.Release, nil, nil
}

// Unary returns the unary server interceptor.
func (f *InFlight) Unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		release, trailer, err := f.acquire(ctx, info.FullMethod)
		if err != nil {
			if trailer != nil {
				grpc.SetTrailer(ctx, trailer) //nolint:errcheck // fails only outside a call
			}
			return nil, err
		}
		if release != nil {
			defer release()
		}
		return handler(ctx, req)
	}
}

// Stream returns the stream server interceptor.
func (f *InFlight) Stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		release, trailer, err := f.acquire(ss.Context(), info.FullMethod)
		if err != nil {
			if trailer != nil {
				ss.SetTrailer(trailer)
			}
			return err
		}
		if release != nil {
			defer release()
		}
		return handler(srv, ss)
	}
}

// GateKey returns an InFlightOptions.Key that keys a call as the gate's
// limits would by parts: gate.IP() resolved through the gate's trusted
// proxies, a metadata entry (gate.Header), the method, a user, and so on.
func GateKey(g *gate.Gate, parts ...gate.Part) (func(ctx context.Context, fullMethod string) (string, bool), error) {
	f, err := g.KeyFunc(parts...)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, method string) (string, bool) {
		md, _ := metadata.FromIncomingContext(ctx)
		req := gate.Request{FullMethod: method, MD: md, Ctx: ctx}
		if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
			req.Peer = p.Addr.String()
		}
		return f(&req)
	}, nil
}

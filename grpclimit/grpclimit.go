// Package grpclimit is Floodgate's grpc-go interceptors: unary and stream
// server interceptors that limit calls by method, metadata, peer address
// or user, with the limits and actions of package gate (a gRPC call's path
// is its full method, "/pkg.Service/Method").
//
//	lim, err := grpclimit.New(grpclimit.Options{Config: gate.Config{Limits: limits}})
//	srv := grpc.NewServer(
//		grpc.UnaryInterceptor(lim.Unary()),
//		grpc.StreamInterceptor(lim.Stream()),
//	)
//
// A call refused by a limit fails with RESOURCE_EXHAUSTED, its message
// "rate limit exceeded (NAME); retry in N s"; the RateLimit fields travel
// as trailers (ratelimit-policy, ratelimit, and retry-after when refused)
// on every call a limit applies to. A call refused because the store
// could not be asked (the gate failing closed on a store error, or a rule
// failing closed while its store is unavailable) fails with UNAVAILABLE,
// "rate limiter unavailable (NAME); retry in 1 s", and only a retry-after
// trailer; a call a failure mode let through gets ratelimit-policy but no
// ratelimit trailer, as no remaining quota was counted (see gate.Headers).
//
// A call over a limit whose action is gate.Defer cannot be queued as an
// HTTP request is (gRPC has no 202 Accepted and no location to poll): it
// fails with UNAVAILABLE, "deferred: over the rate limit, not queued
// (NAME); retry in N s", and the retry-after trailer, so that a client
// whose retry policy retries UNAVAILABLE (gRPC's retry throttling bounding
// it) makes the call again later, when the limit has room.
package grpclimit

import (
	"context"
	"strconv"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/floodgate/floodgate/gate"
	"github.com/floodgate/floodgate/throttle"
)

// Options configure the interceptors.
type Options struct {
	gate.Config
	// Legacy adds x-ratelimit-limit, -remaining and -reset.
	Legacy bool
}

// Limiter holds the interceptors' gate.
type Limiter struct {
	gate   *gate.Gate
	legacy bool
}

// New builds the interceptors.
func New(opts Options) (*Limiter, error) {
	// A call Throttle admitted gives its slot back while the gate delays
	// it (throttle.DelayClock); others sleep on Clock as they are.
	opts.Config.Clock = throttle.DelayClock(opts.Config.Clock)
	g, err := gate.New(opts.Config)
	if err != nil {
		return nil, err
	}
	return &Limiter{gate: g, legacy: opts.Legacy}, nil
}

// Gate returns the interceptors' gate.
func (l *Limiter) Gate() *gate.Gate { return l.gate }

// Close releases the store the gate made for itself, if any.
func (l *Limiter) Close() { l.gate.Close() }

// check decides a call; it returns the trailer to send and, when refused,
// the call's error: the throttler's own (throttle.IsShed, no trailer)
// when ctx carries the call's ticket (throttle.Ticket.Context) and the
// call was shed as its delay ended.
func (l *Limiter) check(ctx context.Context, method string) (metadata.MD, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	req := gate.Request{FullMethod: method, MD: md, Ctx: ctx}
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		req.Peer = p.Addr.String()
	}
	var v gate.Verdict
	l.gate.Check(&req, &v)
	if v.Deciding == nil && throttle.IsShed(v.Err) {
		return nil, v.Err // the gate gave back what the delay reserved
	}
	var trailer metadata.MD
	gate.Headers(&v, l.legacy, func(k string, vals []string) {
		if trailer == nil {
			trailer = metadata.MD{}
		}
		trailer[strings.ToLower(k)] = vals
	})
	if v.Allowed {
		return trailer, nil
	}
	if v.Deciding == nil { // the context ended while a delay waited
		return trailer, status.FromContextError(v.Err).Err()
	}
	o := v.Deciding
	code, what := codes.ResourceExhausted, "rate limit exceeded ("
	switch {
	case v.StoreUnavailable():
		code, what = codes.Unavailable, "rate limiter unavailable ("
	case o.Limit.Action == gate.Defer:
		// gRPC has no 202 and no poll location: the call is not queued.
		// UNAVAILABLE is the code gRPC retry policies retry, so a client
		// with one comes back after retry-after: it holds the queue.
		code, what = codes.Unavailable, "deferred: over the rate limit, not queued ("
	}
	retry := max(1, (int64(o.Decision.RetryAfter)+999_999_999)/1_000_000_000)
	return trailer, status.Error(code, what+o.Limit.Name+"); retry in "+strconv.FormatInt(retry, 10)+" s")
}

// Unary returns the unary server interceptor.
func (l *Limiter) Unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		trailer, err := l.check(ctx, info.FullMethod)
		if trailer != nil {
			grpc.SetTrailer(ctx, trailer) //nolint:errcheck // fails only outside a call
		}
		if err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// Stream returns the stream server interceptor; a stream is limited once,
// when it opens.
func (l *Limiter) Stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		trailer, err := l.check(ss.Context(), info.FullMethod)
		if trailer != nil {
			ss.SetTrailer(trailer)
		}
		if err != nil {
			return err
		}
		return handler(srv, ss)
	}
}

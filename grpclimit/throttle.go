package grpclimit

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/floodgate/floodgate/gate"
	"github.com/floodgate/floodgate/throttle"
)

// ThrottleOptions configure the server throttler's interceptors.
type ThrottleOptions struct {
	// Throttler admits the calls (required).
	Throttler *throttle.Throttler
	// Key is the metadata key criticality is read from; "x-criticality"
	// (throttle.DefaultHeader, lower-cased) if empty.
	Key string
	// Criticality, if set, decides a call's level instead of the
	// metadata (by method, by authenticated client, ...).
	Criticality func(ctx context.Context, fullMethod string) throttle.Criticality
	// Gate, if set (and Criticality is not), caps the level a call claims
	// in its metadata at its method's: the Criticality of the first of
	// the gate's limits whose Match the call meets (gate.Gate.Classify;
	// throttle.DefaultCriticality if none sets one), so a client can
	// lower its level but not raise it — unless its peer is one of the
	// gate's trusted proxies (throttle.Claim). Without it the metadata is
	// believed as it is.
	Gate *gate.Gate
	// Route, if set, keys the cost model instead of the default, the
	// full method ("/pkg.Service/Method").
	Route func(ctx context.Context, fullMethod string) throttle.RouteKey
	// RetryAfter is the retry-after of a shed call, rounded up to whole
	// seconds; 1 s if 0.
	RetryAfter time.Duration
}

// Throttle admits calls through a throttle.Throttler: at once, after a
// wait in its cost-bounded queue, or not at all. A shed call (queue full,
// evicted by a more critical call, dropped at its deadline) fails with
// UNAVAILABLE, "server overloaded (REASON); retry in N s", and a
// retry-after trailer: the server, not the client's quota, is out of
// room (a quota refusal is RESOURCE_EXHAUSTED). The call's level is put
// in its context, so ThrottleClient propagates it to the calls it makes.
// A stream holds its slot until its handler returns.
type Throttle struct {
	o       ThrottleOptions
	retry   string
	trailer metadata.MD
}

// NewThrottle returns the throttler's interceptors.
func NewThrottle(o ThrottleOptions) (*Throttle, error) {
	if o.Throttler == nil {
		return nil, errors.New("grpclimit: ThrottleOptions.Throttler is nil")
	}
	if o.RetryAfter < 0 {
		return nil, errors.New("grpclimit: ThrottleOptions.RetryAfter " + o.RetryAfter.String() + " is negative")
	}
	if o.Key == "" {
		o.Key = throttle.DefaultHeader
	}
	o.Key = strings.ToLower(o.Key)
	r := strconv.FormatInt(max(1, int64((o.RetryAfter+time.Second-1)/time.Second)), 10)
	return &Throttle{o: o, retry: r, trailer: metadata.Pairs("retry-after", r)}, nil
}

// admit waits for the call's turn; it returns the call's context (with
// its level) and the ticket to finish, or the call's error.
func (t *Throttle) admit(ctx context.Context, method string) (context.Context, *throttle.Ticket, error) {
	var crit throttle.Criticality
	md, _ := metadata.FromIncomingContext(ctx)
	switch {
	case t.o.Criticality != nil:
		crit = t.o.Criticality(ctx, method)
	case t.o.Gate != nil:
		crit = t.claim(ctx, md, method)
	default:
		crit = throttle.FromValues(md[t.o.Key], throttle.DefaultCriticality)
	}
	if !crit.Valid() {
		crit = throttle.DefaultCriticality
	}
	key := throttle.RouteKey{Route: method}
	if t.o.Route != nil {
		key = t.o.Route(ctx, method)
	}
	var deadline int64
	if d, ok := ctx.Deadline(); ok {
		deadline = d.UnixMicro()
	}
	tk, err := t.o.Throttler.Enter(key, crit, deadline)
	if err == nil {
		err = tk.Wait(ctx)
	}
	if err != nil {
		return nil, nil, t.shedError(ctx, err)
	}
	if crit != throttle.DefaultCriticality {
		ctx = throttle.WithCriticality(ctx, crit)
	}
	return ctx, tk, nil
}

// claim is the call's level: what its metadata claims, capped at its
// method's level unless its peer is a trusted proxy (ThrottleOptions.Gate).
func (t *Throttle) claim(ctx context.Context, md metadata.MD, method string) throttle.Criticality {
	req := gate.Request{FullMethod: method, MD: md, Ctx: ctx}
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		req.Peer = p.Addr.String()
	}
	ceiling := throttle.DefaultCriticality
	if c := t.o.Gate.Classify(&req); c.Criticality != "" {
		ceiling, _ = throttle.ParseCriticality(c.Criticality)
	}
	vals := md[t.o.Key]
	return throttle.Claim(vals, ceiling, len(vals) > 0 && req.Peer != "" && t.o.Gate.TrustedPeer(req.Peer))
}

func (t *Throttle) shedError(ctx context.Context, err error) error {
	var reason string
	switch err {
	case throttle.ErrQueueFull:
		reason = "queue_full"
	case throttle.ErrEvicted:
		reason = "evicted"
	case throttle.ErrExpired:
		reason = "deadline"
	default:
		return status.FromContextError(ctx.Err()).Err() // the caller left
	}
	return status.Error(codes.Unavailable, "server overloaded ("+reason+"); retry in "+t.retry+" s")
}

// Unary returns the unary server interceptor.
func (t *Throttle) Unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		ctx2, tk, err := t.admit(ctx, info.FullMethod)
		if err != nil {
			if status.Code(err) == codes.Unavailable {
				grpc.SetTrailer(ctx, t.trailer) //nolint:errcheck // fails only outside a call
			}
			return nil, err
		}
		defer tk.Done() // also when the handler panics
		return handler(ctx2, req)
	}
}

// Stream returns the stream server interceptor.
func (t *Throttle) Stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx, tk, err := t.admit(ss.Context(), info.FullMethod)
		if err != nil {
			if status.Code(err) == codes.Unavailable {
				ss.SetTrailer(t.trailer)
			}
			return err
		}
		defer tk.Done()
		if ctx != ss.Context() {
			ss = &ctxStream{ServerStream: ss, ctx: ctx}
		}
		return handler(srv, ss)
	}
}

// ctxStream is a server stream with the call's level in its context.
type ctxStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *ctxStream) Context() context.Context { return s.ctx }

// ThrottleClient returns client interceptors (unary, stream) that
// propagate the criticality of each call's context (throttle.FromContext)
// to the outgoing call in metadata key (throttle.DefaultHeader,
// lower-cased, if empty), so that a server down the chain sheds in the
// same order. A context carrying no level sends none (the server applies
// its default); metadata the caller set under key is kept.
func ThrottleClient(key string) (grpc.UnaryClientInterceptor, grpc.StreamClientInterceptor) {
	if key == "" {
		key = throttle.DefaultHeader
	}
	key = strings.ToLower(key)
	with := func(ctx context.Context) context.Context {
		c, ok := throttle.FromContext(ctx)
		if !ok {
			return ctx
		}
		if md, _ := metadata.FromOutgoingContext(ctx); len(md[key]) > 0 {
			return ctx
		}
		return metadata.AppendToOutgoingContext(ctx, key, c.String())
	}
	unary := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		return invoker(with(ctx), method, req, reply, cc, opts...)
	}
	stream := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		return streamer(with(ctx), desc, cc, method, opts...)
	}
	return unary, stream
}

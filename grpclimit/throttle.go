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
	// metadata (by method, by authenticated client, ...), overriding
	// Ceiling, Gate and Trusted.
	Criticality func(ctx context.Context, fullMethod string) throttle.Criticality
	// Ceiling, if set, is the highest level a call may claim in its
	// metadata (by method, by client); throttle.DefaultCriticality
	// (CRITICAL) if nil or if it returns an invalid level. A call that
	// claims no level, or names none of the four, runs at its ceiling;
	// one that claims a lower level runs at that level; one that claims
	// a higher level runs at the ceiling, unless Trusted (or Gate) says
	// its source is trusted (throttle.Claim).
	Ceiling func(ctx context.Context, fullMethod string) throttle.Criticality
	// Trusted, if set, reports whether a call comes from a source whose
	// claimed level is taken as it is, above the ceiling too: a service
	// of yours, recognized by its peer address (peer.FromContext) or its
	// mTLS identity (the peer's AuthInfo, credentials.TLSInfo). It is
	// asked only for a call whose metadata has the key. nil trusts no
	// one (but Gate's trusted proxies): by default any client can lower
	// its own level but never raise it above the ceiling, so a public
	// client cannot send CRITICAL_PLUS to jump the queue or escape
	// shedding.
	Trusted func(ctx context.Context) bool
	// Gate, if set, gives a call's ceiling by method: the Criticality of
	// the first of the gate's limits whose Match the call meets
	// (gate.Gate.Classify), in place of Ceiling's where one sets a level;
	// and a peer among the gate's trusted proxies is trusted, as Trusted
	// trusts. With Limiter set and Gate not, the limiter's gate is used.
	Gate *gate.Gate
	// Limiter, if set, is the quota gate the interceptors ask after the
	// throttler admits a call, never before: a call the throttler sheds
	// (UNAVAILABLE) spends no quota, and a call the quota refuses
	// (RESOURCE_EXHAUSTED, or the Limiter's other refusals) gives its
	// throttler slot back at once, without a completion
	// (throttle.Ticket.Release). A call the quota delays (gate.Delay)
	// holds no slot and no queued cost while it waits: it gives its slot
	// back when the delay starts and is admitted again, as any arrival,
	// when the delay ends (throttle.DelayClock, which New gives the
	// gate); shed then, it fails with UNAVAILABLE and the gate gives back
	// what the delay reserved, so it spends no quota. A caller that
	// leaves during the delay, or while it waits its turn after it, frees
	// everything. Use Throttle's Unary and Stream alone then: chaining
	// Limiter's own interceptors too would charge twice, and chaining
	// them before Throttle's charges calls that are then shed.
	Limiter *Limiter
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
// room (a quota refusal is RESOURCE_EXHAUSTED). A stream holds its slot
// until its handler returns.
//
// A call's level is ThrottleOptions.Criticality's if set; otherwise what
// its metadata claims, capped at its ceiling unless its source is
// trusted (ThrottleOptions.Ceiling, Trusted, Gate): an untrusted client
// may lower its level, never raise it. The level it runs at is put in
// its context (when other than throttle.DefaultCriticality, or when the
// call's metadata had the key), so ThrottleClient propagates that level,
// never the raw claim; and when the metadata said anything else (a claim
// capped or unreadable), the handler's incoming metadata has it replaced
// by that level, so a handler forwarding its incoming metadata does not
// pass the raw claim on either.
//
// With ThrottleOptions.Limiter the same interceptors are the quota gate
// too, after admission: the one right order (see ThrottleOptions.Limiter).
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
	if o.Limiter != nil && o.Limiter.gate == nil {
		return nil, errors.New("grpclimit: ThrottleOptions.Limiter was not made by grpclimit.New")
	}
	if o.Gate == nil && o.Limiter != nil {
		o.Gate = o.Limiter.gate
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
	if t.o.Criticality != nil {
		crit = t.o.Criticality(ctx, method)
	} else {
		crit = t.claim(ctx, md, method)
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
	return t.stamp(ctx, md, crit), tk, nil
}

// stamp returns the context of a call admitted at level crit (see
// Throttle): carrying crit when it is not the default or md has the key,
// and with incoming metadata saying crit where md said anything else.
func (t *Throttle) stamp(ctx context.Context, md metadata.MD, crit throttle.Criticality) context.Context {
	vals, had := md[t.o.Key]
	if !had && crit == throttle.DefaultCriticality {
		return ctx
	}
	ctx = throttle.WithCriticality(ctx, crit)
	if had && (len(vals) != 1 || vals[0] != crit.String()) {
		md = md.Copy()
		md[t.o.Key] = []string{crit.String()}
		ctx = metadata.NewIncomingContext(ctx, md)
	}
	return ctx
}

// claim is the call's level: what its metadata claims, capped at its
// ceiling (the Gate's for its method, else Ceiling's, else the default)
// unless its source is trusted (the Gate's trusted proxies, Trusted).
func (t *Throttle) claim(ctx context.Context, md metadata.MD, method string) throttle.Criticality {
	vals := md[t.o.Key]
	ceiling := throttle.DefaultCriticality
	var peerAddr string
	if t.o.Gate != nil {
		req := gate.Request{FullMethod: method, MD: md, Ctx: ctx}
		if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
			req.Peer = p.Addr.String()
		}
		peerAddr = req.Peer
		if c := t.o.Gate.Classify(&req); c.Criticality != "" {
			ceiling, _ = throttle.ParseCriticality(c.Criticality)
		} else if t.o.Ceiling != nil {
			ceiling = t.o.Ceiling(ctx, method)
		}
	} else if t.o.Ceiling != nil {
		ceiling = t.o.Ceiling(ctx, method) // Claim takes an invalid one as the default
	}
	if len(vals) == 0 {
		return throttle.Claim(nil, ceiling, false)
	}
	trusted := t.o.Gate != nil && peerAddr != "" && t.o.Gate.TrustedPeer(peerAddr) ||
		t.o.Trusted != nil && t.o.Trusted(ctx)
	return throttle.Claim(vals, ceiling, trusted)
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
		defer tk.Done() // also when the handler panics; nothing after Release
		if t.o.Limiter != nil {
			trailer, err := t.o.Limiter.check(tk.Context(ctx), info.FullMethod)
			if throttle.IsShed(err) { // as its delay ended: see ThrottleOptions.Limiter
				grpc.SetTrailer(ctx, t.trailer) //nolint:errcheck // fails only outside a call
				return nil, t.shedError(ctx, err)
			}
			if trailer != nil {
				grpc.SetTrailer(ctx, trailer) //nolint:errcheck // fails only outside a call
			}
			if err != nil {
				tk.Release() // refused by its quota: not run, no completion
				return nil, err
			}
		}
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
		defer tk.Done() // nothing after Release
		if t.o.Limiter != nil {
			trailer, err := t.o.Limiter.check(tk.Context(ss.Context()), info.FullMethod)
			if throttle.IsShed(err) { // as its delay ended: see ThrottleOptions.Limiter
				ss.SetTrailer(t.trailer)
				return t.shedError(ss.Context(), err)
			}
			if trailer != nil {
				ss.SetTrailer(trailer)
			}
			if err != nil {
				tk.Release() // refused by its quota: not run, no completion
				return err
			}
		}
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

package gate

import (
	"context"
	"errors"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/floodgate/floodgate"
)

// RateLimitClient is the client side of Envoy's rate limit service, as
// generated in go-control-plane (rlsv3.NewRateLimitServiceClient).
type RateLimitClient interface {
	// ShouldRateLimit asks the service to decide a request's descriptors.
	ShouldRateLimit(ctx context.Context, in *rlsv3.RateLimitRequest, opts ...grpc.CallOption) (*rlsv3.RateLimitResponse, error)
}

// Remote asks a rate limit service (`floodgate serve`, or any service
// speaking envoy.service.ratelimit.v3) instead of a local store. Each
// matching limit becomes one descriptor of the request, its key parts the
// entries; the service's rules decide, and the RateLimit headers it
// returns are passed on. Ban and Delay actions need the local engine.
type Remote struct {
	// Client calls the service (rlsv3.NewRateLimitServiceClient on a
	// gRPC connection).
	Client RateLimitClient
	// Domain is the request's domain.
	Domain string
	// Timeout bounds one call (default 100ms); past it the request passes
	// unless Config.FailClosed.
	Timeout time.Duration
}

func (r *Remote) check() error {
	if r.Client == nil {
		return errors.New("gate: Remote.Client is nil")
	}
	if r.Domain == "" {
		return errors.New("gate: Remote.Domain is empty")
	}
	return nil
}

// remote decides the outcomes on the rate limit service: in one call of
// at most maxOps descriptors, or, for a request matching more limits, in
// as many as it takes (see Config).
func (g *Gate) remote(ctx context.Context, v *Verdict) {
	var respBuf [1]*rlsv3.RateLimitResponse
	resps := respBuf[:0]
	if len(v.Outcomes) > maxOps && g.split.CompareAndSwap(false, true) {
		g.cfg.Logger.Warn("floodgate: a request matched more limits than one call to the rate limit service takes; they are decided in several calls (logged once)",
			"limits", len(v.Outcomes), "calls", (len(v.Outcomes)+maxOps-1)/maxOps)
	}
	for start := 0; start < len(v.Outcomes); start += maxOps {
		part := v.Outcomes[start:min(start+maxOps, len(v.Outcomes))]
		resp, err := g.remoteCall(ctx, part)
		if err != nil {
			v.Err = err
			g.logf("floodgate: the rate limit service failed; the gate's failure policy decides meanwhile", "err", err)
			v.Allowed = !g.cfg.FailClosed
			for i := range v.Outcomes {
				v.Outcomes[i].op = -1
			}
			if !v.Allowed {
				v.Deciding = &v.Outcomes[0]
				v.Deciding.Over = true
				v.Deciding.Decision = floodgate.Decision{Reason: floodgate.ReasonStoreUnavailable, RetryAfter: time.Second}
			}
			return
		}
		resps = append(resps, resp)
		for i, st := range resp.Statuses {
			o := &part[i]
			wait := st.GetDurationUntilReset().AsDuration()
			o.Decision = floodgate.Decision{
				Allowed:    st.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT,
				Limit:      int64(st.GetCurrentLimit().GetRequestsPerUnit()),
				Remaining:  int64(st.GetLimitRemaining()),
				ResetAfter: wait,
				RetryAfter: wait,
				Rule:       st.GetCurrentLimit().GetName(),
			}
			if !o.Decision.Allowed {
				o.Decision.Reason = floodgate.ReasonLimited
			}
			o.Over = !o.Decision.Allowed && o.l.Action != Shadow
			if o.Over {
				v.Allowed = false
			}
		}
	}
	v.Deciding = deciding(v.Outcomes)
	// The service's fields describe its call's limits: pass on those of
	// the deciding outcome's call.
	resp := resps[0]
	if v.Deciding != nil {
		for i := range v.Outcomes {
			if &v.Outcomes[i] == v.Deciding {
				resp = resps[i/maxOps]
			}
		}
	}
	for _, h := range resp.GetResponseHeadersToAdd() {
		v.RemoteHeaders = append(v.RemoteHeaders, [2]string{h.GetKey(), h.GetValue()})
	}
}

// remoteCall asks the service about outcomes, each one descriptor.
func (g *Gate) remoteCall(ctx context.Context, outcomes []Outcome) (*rlsv3.RateLimitResponse, error) {
	rc := g.cfg.Remote
	req := &rlsv3.RateLimitRequest{Domain: rc.Domain, Descriptors: make([]*rlcommon.RateLimitDescriptor, len(outcomes))}
	for i := range outcomes {
		o := &outcomes[i]
		es := o.entries()
		d := &rlcommon.RateLimitDescriptor{Entries: make([]*rlcommon.RateLimitDescriptor_Entry, len(es))}
		for j, e := range es {
			d.Entries[j] = &rlcommon.RateLimitDescriptor_Entry{Key: e.Key, Value: e.Value}
		}
		if o.l.Cost != 1 {
			d.HitsAddend = wrapperspb.UInt64(uint64(o.l.Cost))
		}
		req.Descriptors[i] = d
		o.op = 0
	}
	timeout := rc.Timeout
	if timeout <= 0 {
		timeout = 100 * time.Millisecond
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	resp, err := rc.Client.ShouldRateLimit(cctx, req)
	cancel()
	if err == nil && len(resp.GetStatuses()) != len(outcomes) {
		err = errors.New("gate: the rate limit service answered a different number of statuses")
	}
	return resp, err
}

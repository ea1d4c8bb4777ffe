package gate

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/rules"
)

// Remote is a rate limit service the gate asks instead of its store
// (Config.Remote). Package gate/remote asks `floodgate serve`, or any
// service speaking envoy.service.ratelimit.v3, over gRPC.
type Remote interface {
	// Decide decides descriptors, each one limit of a request, all or
	// nothing. It returns one decision per descriptor, in order (a
	// refusal without a Reason is ReasonLimited), and the headers the
	// service computed (the RateLimit fields), or an error when the call
	// failed or timed out: the gate's failure policy then decides
	// (Config.FailClosed).
	Decide(ctx context.Context, descriptors []Descriptor) (RemoteAnswer, error)
}

// A Descriptor is one limit of a request as a rate limit service sees it:
// the limit's key parts as entries (their Entry names and values), and
// what the request costs.
type Descriptor struct {
	Entries []rules.Entry
	Cost    int64
}

// RemoteAnswer is a rate limit service's answer to one Remote.Decide.
type RemoteAnswer struct {
	Decisions []floodgate.Decision // one per descriptor, in order
	Headers   [][2]string          // response headers to add, as the service sent them
}

// remote decides the outcomes on the rate limit service: in one call of
// at most maxOps descriptors, or, for a request matching more limits, in
// as many as it takes (see Config).
func (g *Gate) remote(ctx context.Context, v *Verdict) {
	var ansBuf [1]RemoteAnswer
	answers := ansBuf[:0]
	if len(v.Outcomes) > maxOps && g.split.CompareAndSwap(false, true) {
		g.cfg.Logger.Warn("floodgate: a request matched more limits than one call to the rate limit service takes; they are decided in several calls (logged once)",
			"limits", len(v.Outcomes), "calls", (len(v.Outcomes)+maxOps-1)/maxOps)
	}
	for start := 0; start < len(v.Outcomes); start += maxOps {
		part := v.Outcomes[start:min(start+maxOps, len(v.Outcomes))]
		var t0 time.Time
		if g.tracer != nil {
			t0 = time.Now()
		}
		ans, err := g.remoteCall(ctx, part)
		if g.tracer != nil {
			v.storeTook += time.Since(t0)
		}
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
		answers = append(answers, ans)
		for i := range part {
			o := &part[i]
			o.Decision = ans.Decisions[i]
			if !o.Decision.Allowed && o.Decision.Reason == floodgate.ReasonNone {
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
	ans := &answers[0]
	if v.Deciding != nil {
		for i := range v.Outcomes {
			if &v.Outcomes[i] == v.Deciding {
				ans = &answers[i/maxOps]
			}
		}
	}
	v.RemoteHeaders = append(v.RemoteHeaders, ans.Headers...)
	for i := range answers {
		for _, kv := range answers[i].Headers {
			if strings.EqualFold(kv[0], HeaderWarning) {
				v.Soft = true // the service let a descriptor past a soft limit
			}
		}
	}
}

// remoteCall asks the service about outcomes, each one descriptor.
func (g *Gate) remoteCall(ctx context.Context, outcomes []Outcome) (RemoteAnswer, error) {
	ds := make([]Descriptor, len(outcomes))
	for i := range outcomes {
		o := &outcomes[i]
		ds[i] = Descriptor{Entries: o.entries(), Cost: o.l.Cost}
		o.op = 0
	}
	ans, err := g.cfg.Remote.Decide(ctx, ds)
	if err == nil && len(ans.Decisions) != len(ds) {
		err = fmt.Errorf("gate: the rate limit service answered %d statuses for %d descriptors", len(ans.Decisions), len(ds))
	}
	return ans, err
}

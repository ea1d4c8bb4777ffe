package gate

import (
	"context"

	"go.opentelemetry.io/otel/propagation"

	"github.com/floodgate/floodgate/internal/decisiontrace"
)

// decideTraced is decideOutcomes in a span continuing r's trace
// (Config.TracerProvider).
func (g *Gate) decideTraced(ctx context.Context, r *Request, v *Verdict) {
	ctx, span := g.tracer.Start(ctx, r.traceCarrier())
	v.storeTook = 0
	g.decideOutcomes(ctx, v)
	if !span.IsRecording() { // sampled out: nothing to say
		span.End()
		return
	}
	d := decisiontrace.Decision{StoreLatency: v.storeTook, Allowed: v.Allowed}
	shadow := false
	for i := range v.Outcomes {
		o := &v.Outcomes[i]
		if d.Domain == "" {
			d.Domain = o.l.Domain
		}
		if !o.Decided() {
			continue
		}
		d.Add(o.l.Name, o.Key)
		shadow = shadow || !o.Decision.Allowed && o.shadow()
	}
	switch {
	case v.Degraded():
		d.Outcome = decisiontrace.Degraded
	case !v.Allowed:
		d.Outcome = decisiontrace.Refused
	case shadow:
		d.Outcome = decisiontrace.Shadow
	case v.Soft:
		d.Outcome = decisiontrace.Warned
	default:
		d.Outcome = decisiontrace.Allowed
	}
	decisiontrace.End(span, &d, nil)
}

// traceCarrier is where r's caller put its trace context: the HTTP
// headers, or the gRPC metadata (nil if neither).
func (r *Request) traceCarrier() propagation.TextMapCarrier {
	switch {
	case r.HTTP != nil:
		return propagation.HeaderCarrier(r.HTTP.Header)
	case r.Raw != nil && r.Raw.Header != nil:
		return decisiontrace.FuncCarrier(r.Raw.Header)
	case r.MD != nil:
		return decisiontrace.MDCarrier(r.MD)
	}
	return nil
}

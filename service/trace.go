package service

import (
	"context"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.opentelemetry.io/otel/propagation"

	"github.com/floodgate/floodgate/internal/decide"
	"github.com/floodgate/floodgate/internal/decisiontrace"
	"github.com/floodgate/floodgate/rules"
)

// spanDecisionKey keys a traced request's *decisiontrace.Decision in its
// context: decideSpan fills it in, decideTraced says it.
type spanDecisionKey struct{}

// decideTraced is decideObserved in a span continuing the trace carrier
// holds (s.tracer is set).
func (s *Service) decideTraced(ctx context.Context, req *rlsv3.RateLimitRequest, carrier propagation.TextMapCarrier) (*rlsv3.RateLimitResponse, error) {
	ctx, span := s.tracer.Start(ctx, carrier)
	if !span.IsRecording() { // sampled out: nothing to say
		defer span.End()
		return s.decideObserved(ctx, req)
	}
	sd := &decisiontrace.Decision{Domain: req.GetDomain()}
	if cfg := s.rules.Load(); cfg == nil || cfg.Domain(sd.Domain) == nil {
		sd.Domain = "_unknown" // as the metrics say it: callers choose domains
	}
	resp, err := s.decideObserved(context.WithValue(ctx, spanDecisionKey{}, sd), req)
	decisiontrace.End(span, sd, err)
	return resp, err
}

// decideSpan is decide, traced: the store's latency and the results go to
// the span's decision in ctx (none when a library caller's Decide is not
// traced).
func (s *Service) decideSpan(ctx context.Context, cfg *rules.Config, req *rlsv3.RateLimitRequest, descs []decide.Descriptor, res []decide.Result) (*rlsv3.RateLimitResponse, error) {
	sd, _ := ctx.Value(spanDecisionKey{}).(*decisiontrace.Decision)
	start := time.Now()
	err := s.dec.Decide(ctx, s.opts.Store, s.opts.Clock, cfg, req.Domain, descs, res)
	if err != nil {
		return nil, err
	}
	resp := s.respond(req, res)
	if sd != nil {
		sd.StoreLatency = time.Since(start)
		traceResults(sd, resp, res)
	}
	return resp, nil
}

// traceResults records res (answered resp) in sd: each decided
// descriptor's rule and key hash, and the outcome.
func traceResults(sd *decisiontrace.Decision, resp *rlsv3.RateLimitResponse, res []decide.Result) {
	var degraded, shadow, warned bool
	for i := range res {
		r := &res[i]
		if !r.Decided() {
			continue
		}
		rule := requestLimitRule
		if r.Limit != nil && r.Limit.Policy != nil {
			rule = r.Limit.Name
		}
		sd.Add(rule, r.Key)
		degraded = degraded || r.Decision.Degraded
		shadow = shadow || r.Shadow && !r.Decision.Allowed
		warned = warned || r.Enforced() && softCrossed(&r.Decision)
	}
	sd.Allowed = resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT
	switch {
	case degraded:
		sd.Outcome = decisiontrace.Degraded
	case !sd.Allowed:
		sd.Outcome = decisiontrace.Refused
	case shadow:
		sd.Outcome = decisiontrace.Shadow
	case warned:
		sd.Outcome = decisiontrace.Warned
	default:
		sd.Outcome = decisiontrace.Allowed
	}
}

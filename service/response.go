package service

import (
	"math"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/floodgate/floodgate/internal/decide"
	"github.com/floodgate/floodgate/internal/ratehdr"
)

// dynamicMetadata is the response's dynamic_metadata when some matched
// limit has metadata or quota_mode (nil otherwise): "metadata", the
// matched limits' metadata mappings, one per descriptor of the request
// (null where none); and, as envoyproxy/ratelimit names them,
// "quotaModeEnabled" and "quotaModeViolations" (the indexes of the
// descriptors admitted over their quota).
func dynamicMetadata(res []decide.Result, violations []int) *structpb.Struct {
	var meta, quota bool
	for i := range res {
		if l := res[i].Limit; l != nil && !res[i].Replaced {
			meta = meta || l.Metadata != nil
			quota = quota || l.QuotaMode
		}
	}
	if !meta && !quota {
		return nil
	}
	fields := map[string]*structpb.Value{}
	if meta {
		list := make([]*structpb.Value, len(res))
		for i := range res {
			list[i] = structpb.NewNullValue()
			if l := res[i].Limit; l != nil && l.Metadata != nil && !res[i].Replaced {
				if v, err := structpb.NewStruct(l.Metadata); err == nil {
					list[i] = structpb.NewStructValue(v)
				}
			}
		}
		fields["metadata"] = structpb.NewListValue(&structpb.ListValue{Values: list})
	}
	if quota {
		fields["quotaModeEnabled"] = structpb.NewBoolValue(true)
		if len(violations) > 0 {
			list := make([]*structpb.Value, len(violations))
			for i, v := range violations {
				list[i] = structpb.NewNumberValue(float64(v))
			}
			fields["quotaModeViolations"] = structpb.NewListValue(&structpb.ListValue{Values: list})
		}
	}
	return &structpb.Struct{Fields: fields}
}

// A response and the messages it points to are allocated together: one
// block for the usual single descriptor (the response, its status, limit,
// duration and up to three headers), a few slices for more. They are
// ordinary messages to the caller; only the allocations are shared.
type respHead struct {
	resp     rlsv3.RateLimitResponse
	hdrPtrs  [3]*corev3.HeaderValue
	hdrVals  [3]corev3.HeaderValue
	statuses [1]*rlsv3.RateLimitResponse_DescriptorStatus
}

// respPart is one descriptor's status and what it points to.
type respPart struct {
	status   rlsv3.RateLimitResponse_DescriptorStatus
	limit    rlsv3.RateLimitResponse_RateLimit
	duration durationpb.Duration
}

type respOne struct {
	respHead
	part [1]respPart
}

func newResponse(n int) (*rlsv3.RateLimitResponse, []respPart) {
	var h *respHead
	var parts []respPart
	if n == 1 {
		b := &respOne{}
		h, parts = &b.respHead, b.part[:]
		h.resp.Statuses = h.statuses[:]
	} else {
		h, parts = &respHead{}, make([]respPart, n)
		h.resp.Statuses = make([]*rlsv3.RateLimitResponse_DescriptorStatus, n)
	}
	for i := range h.hdrPtrs {
		h.hdrPtrs[i] = &h.hdrVals[i]
	}
	h.resp.OverallCode = rlsv3.RateLimitResponse_OK
	// headers() fills ResponseHeadersToAdd from this (empty) slice.
	h.resp.ResponseHeadersToAdd = h.hdrPtrs[:0]
	return &h.resp, parts
}

// setDuration is durationpb.New(d), into dst.
// setDuration sets dst to d in whole seconds, rounded up, as
// envoyproxy/ratelimit reports duration_until_reset: Envoy's
// X-RateLimit-Reset takes the seconds alone, so 0.3 s would say 0 (retry
// now) and 56.3 s would say 56 where the RateLimit header says 57.
func setDuration(dst *durationpb.Duration, d time.Duration) *durationpb.Duration {
	dst.Seconds, dst.Nanos = ratehdr.CeilSeconds(d), 0
	return dst
}

var envoyUnits = map[string]rlsv3.RateLimitResponse_RateLimit_Unit{
	"second": rlsv3.RateLimitResponse_RateLimit_SECOND, "minute": rlsv3.RateLimitResponse_RateLimit_MINUTE,
	"hour": rlsv3.RateLimitResponse_RateLimit_HOUR, "day": rlsv3.RateLimitResponse_RateLimit_DAY,
	"week": rlsv3.RateLimitResponse_RateLimit_WEEK, "month": rlsv3.RateLimitResponse_RateLimit_MONTH,
	"year": rlsv3.RateLimitResponse_RateLimit_YEAR,
}

// currentLimit reports the deciding rule as Envoy's API can: its name
// (for a one-rule limit, the name given in the file, which Envoy leaves
// empty otherwise; for several rules, the deciding rule's), requests per
// unit, and the unit with its multiplier when the window is one (90 s is
// 90 × SECOND; a calendar window has no unit: the headers carry it).
//
// own is the descriptor's own limit when it decides; ph is the headers'
// description of r's policy (nil when it has none); it names the policy's
// rules, so nothing here copies them.
func currentLimit(cl *rlsv3.RateLimitResponse_RateLimit, r *decide.Result, own *rlcommon.RateLimitDescriptor_RateLimitOverride, ph *policyHeader) *rlsv3.RateLimitResponse_RateLimit {
	d := &r.Decision
	cl.RequestsPerUnit = uint32(min(max(d.Limit, 0), math.MaxUint32))
	if rl := own; r.Own {
		// the descriptor's own limit, said as given (Envoy's units are
		// numbered alike in both enums), unnamed, as envoyproxy/ratelimit does
		cl.Unit = rlsv3.RateLimitResponse_RateLimit_Unit(rl.Unit)
		if m := rl.GetUnitMultiplier().GetValue(); m > 1 {
			cl.UnitMultiplier = wrapperspb.UInt32(m)
		}
		if r.Blocked {
			cl.RequestsPerUnit = 0
		}
		return cl
	}
	l := r.Limit
	if l == nil {
		return cl
	}
	if l.NameGiven {
		cl.Name = l.Name
	}
	several := ph != nil && len(ph.rules) > 1
	if ph != nil && (r.Policy != l.Policy || several) {
		// an override, a request's own limit, or one rule of several:
		// the deciding rule's window (none for a calendar window)
		rh := ph.forRule(d.Rule)
		if several {
			cl.Name = rh.rule
		}
		w := rh.period
		for _, u := range []struct {
			name string
			d    time.Duration
		}{{"day", 24 * time.Hour}, {"hour", time.Hour}, {"minute", time.Minute}, {"second", time.Second}} {
			if w >= u.d && w%u.d == 0 {
				cl.Unit = envoyUnits[u.name]
				if n := w / u.d; n > 1 {
					cl.UnitMultiplier = wrapperspb.UInt32(uint32(n))
				}
				break
			}
		}
		return cl
	}
	if l.Blocked {
		cl.RequestsPerUnit = 0
	}
	if l.MultipliedUnit != "" {
		cl.Unit = envoyUnits[l.MultipliedUnit]
		if l.UnitMultiplier > 1 {
			cl.UnitMultiplier = wrapperspb.UInt32(l.UnitMultiplier)
		}
	}
	return cl
}

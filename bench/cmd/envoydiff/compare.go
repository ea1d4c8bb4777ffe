package main

import (
	"fmt"
	"math"
	"strings"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/status"
)

// resetTolerance is how far two duration_until_reset may differ:
// envoyproxy/ratelimit counts whole seconds of Unix time (a 1 s window
// always says 1 s), Floodgate the exact time left.
const resetTolerance = time.Second

// compare lists how two answers to one request differ (none: they match).
func compare(p *rlsv3.RateLimitResponse, perr error, f *rlsv3.RateLimitResponse, ferr error) []string {
	if (perr != nil) != (ferr != nil) {
		return []string{"error: one call failed, the other did not"}
	}
	if perr != nil {
		return nil // both failed (the gRPC codes may differ: the peer says Unknown)
	}
	var d []string
	if p.OverallCode != f.OverallCode {
		d = append(d, fmt.Sprintf("overall_code %s vs %s", p.OverallCode, f.OverallCode))
	}
	if len(p.Statuses) != len(f.Statuses) {
		return append(d, fmt.Sprintf("%d statuses vs %d", len(p.Statuses), len(f.Statuses)))
	}
	for i := range p.Statuses {
		ps, fs := p.Statuses[i], f.Statuses[i]
		at := func(format string, args ...any) {
			d = append(d, fmt.Sprintf("[%d] ", i)+fmt.Sprintf(format, args...))
		}
		if ps.Code != fs.Code {
			at("code %s vs %s", ps.Code, fs.Code)
		}
		pl, fl := ps.CurrentLimit, fs.CurrentLimit
		switch {
		case (pl == nil) != (fl == nil):
			at("current_limit %s vs %s", limitString(pl), limitString(fl))
		case pl != nil:
			if pl.RequestsPerUnit != fl.RequestsPerUnit {
				at("requests_per_unit %d vs %d", pl.RequestsPerUnit, fl.RequestsPerUnit)
			}
			if pl.Unit != fl.Unit {
				at("unit %s vs %s", pl.Unit, fl.Unit)
			}
			if pl.Name != fl.Name {
				at("name %q vs %q", pl.Name, fl.Name)
			}
			if pl.GetUnitMultiplier().GetValue() != fl.GetUnitMultiplier().GetValue() {
				at("unit_multiplier %d vs %d", pl.GetUnitMultiplier().GetValue(), fl.GetUnitMultiplier().GetValue())
			}
		}
		if ps.LimitRemaining != fs.LimitRemaining {
			at("limit_remaining %d vs %d", ps.LimitRemaining, fs.LimitRemaining)
		}
		pd, fd := ps.DurationUntilReset, fs.DurationUntilReset
		switch {
		case (pd == nil) != (fd == nil):
			at("duration_until_reset %s vs %s", durString(pd.AsDuration(), pd != nil), durString(fd.AsDuration(), fd != nil))
		case pd != nil:
			if delta := pd.AsDuration() - fd.AsDuration(); delta > resetTolerance || delta < -resetTolerance {
				at("duration_until_reset %s vs %s", pd.AsDuration(), fd.AsDuration())
			}
		}
	}
	return d
}

func limitString(l *rlsv3.RateLimitResponse_RateLimit) string {
	if l == nil {
		return "none"
	}
	s := fmt.Sprintf("%d/%s", l.RequestsPerUnit, l.Unit)
	if m := l.GetUnitMultiplier().GetValue(); m > 1 {
		s = fmt.Sprintf("%d/%d×%s", l.RequestsPerUnit, m, l.Unit)
	}
	if l.Name != "" {
		s += fmt.Sprintf(" %q", l.Name)
	}
	return s
}

func durString(d time.Duration, ok bool) string {
	if !ok {
		return "none"
	}
	return d.Round(10 * time.Millisecond).String()
}

// summarize is one line for an answer.
func summarize(r *rlsv3.RateLimitResponse, err error) string {
	if err != nil {
		st := status.Convert(err)
		msg := st.Message()
		if len(msg) > 100 {
			msg = msg[:100] + "…"
		}
		return fmt.Sprintf("error %s: %s", st.Code(), msg)
	}
	var b strings.Builder
	b.WriteString(r.OverallCode.String())
	b.WriteString(" [")
	for i, s := range r.Statuses {
		if i == 8 && len(r.Statuses) > 10 {
			fmt.Fprintf(&b, " … %d more", len(r.Statuses)-i)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		rem := fmt.Sprint(s.LimitRemaining)
		if s.LimitRemaining == math.MaxUint32 {
			rem = "max"
		}
		fmt.Fprintf(&b, "%s limit=%s rem=%s reset=%s", s.Code, limitString(s.CurrentLimit), rem,
			durString(s.DurationUntilReset.AsDuration(), s.DurationUntilReset != nil))
	}
	b.WriteString("]")
	return b.String()
}

// describe is one line for a request.
func describe(req *rlsv3.RateLimitRequest) string {
	var b strings.Builder
	fmt.Fprintf(&b, "domain=%q", req.Domain)
	if req.HitsAddend != 0 {
		fmt.Fprintf(&b, " hits=%d", req.HitsAddend)
	}
	if len(req.Descriptors) > 6 {
		fmt.Fprintf(&b, " %d descriptors like {%s}", len(req.Descriptors), descString(req.Descriptors[0]))
		return b.String()
	}
	for _, d := range req.Descriptors {
		fmt.Fprintf(&b, " {%s}", descString(d))
	}
	return b.String()
}

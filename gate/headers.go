package gate

import (
	"strconv"
	"strings"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/ratehdr"
)

// The response fields, in canonical form.
const (
	HeaderPolicy     = "Ratelimit-Policy"
	HeaderRateLimit  = "Ratelimit"
	HeaderRetryAfter = "Retry-After"
	HeaderLimit      = "X-Ratelimit-Limit"
	HeaderRemaining  = "X-Ratelimit-Remaining"
	HeaderReset      = "X-Ratelimit-Reset"
	// HeaderWarning marks a request let past a soft limit.
	HeaderWarning = "Floodgate-Warning"
)

func sfName(s string) string { return ratehdr.SFString(s) }

func ruleWindow(r floodgate.Rule) time.Duration {
	switch r.Calendar {
	case floodgate.CalendarDay:
		return 24 * time.Hour
	case floodgate.CalendarWeek:
		return 7 * 24 * time.Hour
	case floodgate.CalendarMonth:
		return 30 * 24 * time.Hour
	}
	return r.Period
}

func policyItem(sf string, r floodgate.Rule) string {
	return ratehdr.PolicyItem(sf, r.Limit, ruleWindow(r))
}

var warningValue = []string{`soft limit exceeded`}

// Headers calls set with each response field of v, per
// draft-ietf-httpapi-ratelimit-headers-11: RateLimit-Policy (every limit
// that applied), RateLimit (the deciding one: remaining and seconds until
// reset, or until a retry may succeed), Retry-After when refused, and the
// legacy X-RateLimit-Limit/Remaining/Reset when legacy is set. The slices
// passed to set are the caller's to keep but not to modify.
func Headers(v *Verdict, legacy bool, set func(key string, vals []string)) {
	if len(v.RemoteHeaders) > 0 {
		// The service computed the fields for every limit together.
		for _, kv := range v.RemoteHeaders {
			set(kv[0], []string{kv[1]})
		}
		return
	}
	if v.Soft {
		set(HeaderWarning, warningValue)
	}
	o := v.Deciding
	if o == nil || o.l == nil {
		return
	}
	// RateLimit-Policy
	if len(v.Outcomes) == 1 && o.policy == o.l.Policy && o.l.policyItem != nil && !o.Banned {
		set(HeaderPolicy, o.l.policyItem)
	} else {
		var items []string
		for i := range v.Outcomes {
			x := &v.Outcomes[i]
			if x.op < 0 && x.ruleLm == nil && !x.Banned {
				continue
			}
			items = append(items, x.policyItems()...)
		}
		if len(items) > 0 {
			set(HeaderPolicy, []string{strings.Join(items, ", ")})
		}
	}
	// RateLimit
	d := &o.Decision
	reset := d.ResetAfter
	if o.Over || !d.Allowed {
		reset = d.RetryAfter
	}
	name := o.name
	if name == "" {
		name = o.l.ruleNames[d.Rule]
		if name == "" {
			name = o.l.sfName
		}
	}
	var buf [96]byte
	set(HeaderRateLimit, []string{string(ratehdr.AppendLimit(buf[:0], name, d.Remaining, reset))})
	secs := ratehdr.CeilSeconds(reset)
	if !v.Allowed {
		set(HeaderRetryAfter, []string{strconv.FormatInt(max(secs, 1), 10)})
	}
	if legacy {
		set(HeaderLimit, []string{strconv.FormatInt(max(d.Limit, 0), 10)})
		set(HeaderRemaining, []string{strconv.FormatInt(max(d.Remaining, 0), 10)})
		set(HeaderReset, []string{strconv.FormatInt(secs, 10)})
	}
}

// policyItems renders an outcome's RateLimit-Policy items.
func (o *Outcome) policyItems() []string {
	if o.Banned && o.l.banThresh != nil {
		b := o.l.Ban
		return []string{ratehdr.PolicyItem(sfName(o.l.Name+"/ban"), b.Threshold, b.Interval)}
	}
	if o.policy == nil {
		if o.ruleLm != nil {
			return []string{ratehdr.PolicyItem(sfName(o.ruleLm.Name), 0, time.Second)}
		}
		return nil
	}
	if o.policy == o.l.Policy && o.l.policyItem != nil {
		return o.l.policyItem
	}
	rs := o.policy.Rules()
	out := make([]string, len(rs))
	base := o.l.Name
	if o.ruleLm != nil {
		base = o.ruleLm.Name
	}
	for i, r := range rs {
		name := base
		if len(rs) > 1 {
			name += "/" + r.Name
		}
		out[i] = policyItem(sfName(name), r)
	}
	return out
}

package gate

import (
	"slices"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/ratehdr"
)

// The response fields, in canonical form.
const (
	HeaderPolicy     = "Ratelimit-Policy"      // each applied limit's quota and window
	HeaderRateLimit  = "Ratelimit"             // the deciding limit's remaining requests and reset
	HeaderRetryAfter = "Retry-After"           // seconds until a refused request may succeed
	HeaderLimit      = "X-Ratelimit-Limit"     // legacy (httplimit's Options.Legacy): the deciding limit's quota
	HeaderRemaining  = "X-Ratelimit-Remaining" // legacy: its remaining requests
	HeaderReset      = "X-Ratelimit-Reset"     // legacy: seconds until it resets
	// HeaderWarning marks a request let past a soft limit.
	HeaderWarning = "Floodgate-Warning"
)

func sfName(s string) string { return ratehdr.SFString(s) }

func policyItem(sf string, r floodgate.Rule) string {
	q, w := ratehdr.Quota(r)
	return ratehdr.PolicyItem(sf, q, w)
}

var warningValue = []string{`soft limit exceeded`}

// Headers calls set with each response field of v, per
// draft-ietf-httpapi-ratelimit-headers-11: RateLimit-Policy (every limit
// that applied), RateLimit (the deciding one: remaining and seconds until
// reset, or until a retry may succeed), Retry-After when refused, and the
// legacy X-RateLimit-Limit/Remaining/Reset when legacy is set. The slices
// passed to set are the caller's to keep but not to modify.
//
// The fields say only what the store counted. A request refused because
// the store could not be asked (v.StoreUnavailable) gets Retry-After
// alone: no quota was exhausted, and none is described. A request a
// failure mode decided without the store (the gate failing open on a
// store error, a rule's OnStoreFailure: open or local) gets
// RateLimit-Policy, which states the policy, but neither RateLimit nor the
// legacy fields, whose remaining quota nobody counted; refused (a local
// share used up), it gets Retry-After too. With a remote service, its
// fields pass as they are, and a call that failed gives none but
// Retry-After when refused (the policy is the service's).
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
	if v.StoreUnavailable() {
		set(HeaderRetryAfter, intValue(max(ratehdr.CeilSeconds(o.Decision.RetryAfter), 1)))
		return
	}
	if o == nil || o.l == nil {
		if v.Allowed && v.Err != nil {
			// The gate's failure policy let it pass: the policies stand.
			policyFields(v, nil, set)
		}
		return
	}
	policyFields(v, o, set)
	// RateLimit
	d := &o.Decision
	reset := d.ResetAfter
	if o.Over || !d.Allowed {
		reset = d.RetryAfter
	}
	secs := ratehdr.CeilSeconds(reset)
	if d.Degraded {
		// A failure mode decided, not the store: nothing was counted.
		if !v.Allowed {
			set(HeaderRetryAfter, intValue(max(secs, 1)))
		}
		return
	}
	name, remaining, limit := o.limitName(), d.Remaining, d.Limit
	set(HeaderRateLimit, limitValue(name, remaining, reset))
	if !v.Allowed {
		set(HeaderRetryAfter, intValue(max(secs, 1)))
	}
	if legacy {
		set(HeaderLimit, intValue(max(limit, 0)))
		set(HeaderRemaining, intValue(max(remaining, 0)))
		set(HeaderReset, intValue(secs))
	}
}

// limitName is the name the RateLimit field gives o's deciding rule.
func (o *Outcome) limitName() string {
	d := &o.Decision
	switch {
	case o.Banned && o.l.banThresh != nil:
		// The ban refused: its quota is spent, whatever the limit's
		// (Decision has the ban's numbers: applyBan).
		return sfName(o.l.Name + "/ban")
	case o.ruleLm != nil && o.policy != nil && len(o.policy.Rules()) > 1:
		return sfName(d.Rule) // each rule is named in RateLimit-Policy, as the service names it
	case o.name != "":
		return o.name
	case o.l.ruleNames[d.Rule] != "":
		return o.l.ruleNames[d.Rule]
	}
	return o.l.sfName
}

// maxPolicyItems bounds RateLimit-Policy's items: a request matching
// hundreds of limits gets the first few, not a header of kilobytes.
const maxPolicyItems = 8

// policyFields sets RateLimit-Policy: every limit of v that applied, each
// rule of each, at most maxPolicyItems items; o, when not nil, is the
// deciding outcome.
func policyFields(v *Verdict, o *Outcome, set func(key string, vals []string)) {
	if o != nil && len(v.Outcomes) == 1 && o.policy == o.l.Policy && o.l.policyItem != nil && !o.Banned {
		set(HeaderPolicy, o.l.policyItem)
		return
	}
	var items []string
	for i := range v.Outcomes {
		x := &v.Outcomes[i]
		if !x.Decided() || x.quota() {
			continue
		}
		for _, it := range x.policyItems() {
			if len(items) == maxPolicyItems {
				break
			}
			if !slices.Contains(items, it) {
				items = append(items, it)
			}
		}
	}
	if len(items) > 0 {
		set(HeaderPolicy, []string{strings.Join(items, ", ")})
	}
}

// smallInts are header values for 0..len-1, shared: a slice of one
// string, its capacity its length, so that an append copies it.
var smallInts = func() [][]string {
	out := make([][]string, 1024)
	for i := range out {
		out[i] = []string{strconv.Itoa(i)}
	}
	return out
}()

func intValue(n int64) []string {
	if n >= 0 && n < int64(len(smallInts)) {
		return smallInts[n]
	}
	h := new(limitHolder)
	b := strconv.AppendInt(h.buf[:0], n, 10)
	h.vals[0] = unsafe.String(&h.buf[0], len(b))
	return h.vals[:]
}

// limitHolder is a RateLimit value and its bytes in one allocation.
type limitHolder struct {
	vals [1]string
	buf  [80]byte
}

// limitValue renders a RateLimit field value in one allocation.
func limitValue(name string, remaining int64, reset time.Duration) []string {
	h := new(limitHolder)
	b := ratehdr.AppendLimit(h.buf[:0], name, remaining, reset)
	if len(b) > len(h.buf) || len(b) == 0 {
		// a long name: the buffer was outgrown
		return []string{string(b)}
	}
	// The string shares the holder's bytes, written once and never again.
	h.vals[0] = unsafe.String(&h.buf[0], len(b))
	return h.vals[:]
}

// policyItems renders an outcome's RateLimit-Policy items: a ban's
// first when it refused, then each rule of its policy.
func (o *Outcome) policyItems() []string {
	var ban []string
	if o.Banned && o.l.banThresh != nil {
		b := o.l.Ban
		ban = []string{ratehdr.PolicyItem(sfName(o.l.Name+"/ban"), b.Threshold, b.Interval)}
	}
	if o.policy == nil {
		if lm := o.ruleLm; lm != nil {
			w := time.Second // a Limit made Blocked in Go states no window
			if lm.Policy != nil {
				w = ratehdr.Window(lm.Policy.Rules()[0])
			}
			return append(ban, ratehdr.PolicyItem(sfName(lm.Name), 0, w))
		}
		return ban
	}
	if o.policy == o.l.Policy && o.l.policyItems != nil {
		return append(ban, o.l.policyItems...)
	}
	rs := o.policy.Rules()
	out := ban
	for _, r := range rs {
		name := o.l.Name + "/" + r.Name
		switch {
		case o.ruleLm != nil && len(rs) == 1 && o.ruleLm.Name != "":
			// A rules file's limit is named as the service names it: a
			// single rule by the limit's name, several each by its own.
			name = o.ruleLm.Name
		case o.ruleLm != nil:
			name = r.Name
		case len(rs) == 1:
			name = o.l.Name
		}
		out = append(out, policyItem(sfName(name), r))
	}
	return out
}

// Package ratehdr renders the rate-limit response fields of
// draft-ietf-httpapi-ratelimit-headers-11, shared by the service and the
// middleware so both speak them alike:
//
//	RateLimit-Policy: "per-ip";q=100;w=60
//	RateLimit: "per-ip";r=42;t=17
//
// Both are structured-field lists (RFC 8941) of items whose value is the
// policy's name as a string: q is the quota, w the window in seconds, r the
// remaining quota and t the seconds until it resets (or, when over the
// limit, until a request may succeed).
package ratehdr

import (
	"strconv"
	"strings"
	"time"

	"github.com/floodgate/floodgate"
)

// MaxName bounds a policy name as rendered, in bytes.
const MaxName = 256

// SFString renders s as a structured-field string (RFC 8941 §3.3.3):
// quotes and backslashes escaped, bytes outside printable ASCII replaced by
// '_', at most MaxName bytes of s.
func SFString(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('"')
	for i := 0; i < len(s) && i < MaxName; i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20 || c > 0x7e:
			b.WriteByte('_')
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// CeilSeconds is d in whole seconds, rounded up: a client told t=0 while a
// few milliseconds remain would retry too early.
func CeilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// PolicyItem renders one RateLimit-Policy item; name must come from
// SFString. The window is in whole seconds, rounded up (a window of 1.5 s
// said as 1 would have clients send half as much again), and at least one.
func PolicyItem(name string, quota int64, window time.Duration) string {
	return name + ";q=" + strconv.FormatInt(max(quota, 0), 10) + ";w=" + strconv.FormatInt(max(1, CeilSeconds(window)), 10)
}

// Quota is a rule as a RateLimit-Policy item says it: its limit over its
// window (Window); but a bucket whose burst is above its limit holds burst
// requests and refills them in period × burst / limit, which it says, so
// that the remaining count (r) never exceeds the quota (q).
func Quota(r floodgate.Rule) (quota int64, window time.Duration) {
	switch r.Algorithm {
	case floodgate.TokenBucket, floodgate.LeakyBucket, floodgate.LeakyBucketShaper, floodgate.GCRA:
		if r.Burst > r.Limit && r.Limit > 0 {
			return r.Burst, time.Duration(float64(r.Period) * float64(r.Burst) / float64(r.Limit))
		}
	}
	return r.Limit, Window(r)
}

// AppendLimit appends one RateLimit item to dst; name must come from
// SFString.
func AppendLimit(dst []byte, name string, remaining int64, reset time.Duration) []byte {
	dst = append(dst, name...)
	dst = append(dst, ";r="...)
	dst = strconv.AppendInt(dst, max(remaining, 0), 10)
	dst = append(dst, ";t="...)
	return strconv.AppendInt(dst, CeilSeconds(reset), 10)
}

// Window is a rule's window as the w parameter reports it: its period, or
// its calendar unit's usual length (a month as 30 days).
func Window(r floodgate.Rule) time.Duration {
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

package server

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// BucketResource returns the resource id an RLQS bucket is leased as: the
// stream's domain, a '/', then the bucket's key=value pairs sorted by key
// and joined by ','. In the domain, the keys and the values, the bytes
// '%', '/', ',', '=', the control bytes (below 0x20) and 0x7f are written
// %XX (upper-case hex), so the id's structure is unambiguous and a glob's
// '*' never crosses from the domain into the pairs.
//
// Domain "envoy" and the bucket {name: checkout, env: prod} give
// "envoy/env=prod,name=checkout": the resources file can name it exactly,
// or match it with "envoy/*" (every bucket of the domain) or
// "envoy/env=prod,*" (a glob on the sorted pairs); the mandatory "*"
// default matches every bucket, each bucket being a resource of its own
// with the default's capacity.
func BucketResource(domain string, bucket map[string]string) string {
	keys := make([]string, 0, len(bucket))
	n := len(domain) + 1
	for k, v := range bucket {
		keys = append(keys, k)
		n += len(k) + len(v) + 2
	}
	sort.Strings(keys)
	var b strings.Builder
	b.Grow(n)
	escapeTo(&b, domain)
	b.WriteByte('/')
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		escapeTo(&b, k)
		b.WriteByte('=')
		escapeTo(&b, bucket[k])
	}
	return b.String()
}

// escapeTo writes s to b with BucketResource's escapes.
func escapeTo(b *strings.Builder, s string) {
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '%' || c == '/' || c == ',' || c == '=' || c < 0x20 || c == 0x7f:
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
		default:
			b.WriteByte(c)
		}
	}
}

// maxFillSeconds is the longest fill interval TokenBucket writes: a share
// below one token per maxFillSeconds is sent as an empty bucket.
const maxFillSeconds = 3600

// TokenBucket returns the token bucket Envoy is to enforce for a share of
// rate requests per second, never more than rate. fill is the fill
// interval in whole seconds (Envoy reads only the seconds of
// fill_interval; below 1, 1 is used): tokens_per_fill is
// floor(rate × fill) and max_tokens the same (one fill interval's burst; a
// bucket starts full). A rate too small for one token per fill interval
// gets one token every ceil(1/rate) seconds (up to an hour); 0 (or less,
// or NaN) gets max_tokens 0, which refuses every request.
func TokenBucket(rate float64, fill int64) *typev3.TokenBucket {
	if fill < 1 {
		fill = 1
	}
	empty := &typev3.TokenBucket{
		MaxTokens:     0,
		TokensPerFill: wrapperspb.UInt32(1),
		FillInterval:  durationpb.New(time.Second),
	}
	if !(rate > 0) {
		return empty
	}
	per := math.Floor(rate * float64(fill))
	if per >= 1 {
		if per > math.MaxUint32 {
			per = math.MaxUint32
		}
		return &typev3.TokenBucket{
			MaxTokens:     uint32(per),
			TokensPerFill: wrapperspb.UInt32(uint32(per)),
			FillInterval:  durationpb.New(time.Duration(fill) * time.Second),
		}
	}
	secs := math.Ceil(1 / rate)
	if secs > maxFillSeconds {
		return empty
	}
	return &typev3.TokenBucket{
		MaxTokens:     1,
		TokensPerFill: wrapperspb.UInt32(1),
		FillInterval:  durationpb.New(time.Duration(secs) * time.Second),
	}
}

// TokenRate returns the rate in tokens per second that Envoy derives from
// tb (tokens_per_fill over fill_interval's whole seconds), 0 for a bucket
// of max_tokens 0: the inverse of TokenBucket, for checks and tests.
func TokenRate(tb *typev3.TokenBucket) float64 {
	if tb.GetMaxTokens() == 0 {
		return 0
	}
	per := uint32(1)
	if w := tb.GetTokensPerFill(); w != nil {
		per = w.GetValue()
	}
	secs := tb.GetFillInterval().GetSeconds()
	if secs <= 0 {
		return math.Inf(1)
	}
	return float64(per) / float64(secs)
}

// bucketError is an InvalidArgument message naming the usage at index i.
func bucketError(i int, format string, args ...any) string {
	return fmt.Sprintf("bucket_quota_usages[%d]: ", i) + fmt.Sprintf(format, args...)
}

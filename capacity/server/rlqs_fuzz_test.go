package server

import (
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// FuzzRLQSReport: any bytes that decode as a usage report are either
// refused with a message or give usages whose resource ids are within the
// bound and whose demand is a finite number in range; never a panic.
func FuzzRLQSReport(f *testing.F) {
	seed := &rlqspb.RateLimitQuotaUsageReports{Domain: "envoy", BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{{
		BucketId: &rlqspb.BucketId{Bucket: map[string]string{"name": "api", "path": "/a,b=c%"}}, TimeElapsed: durationpb.New(time.Second),
		NumRequestsAllowed: 10, NumRequestsDenied: 3,
	}}}
	b, _ := proto.Marshal(seed)
	f.Add(b)
	f.Add([]byte{})
	st := &rlqsStream{r: &RLQS{opts: RLQSOptions{}.withDefaults()}}
	f.Fuzz(func(t *testing.T, data []byte) {
		m := &rlqspb.RateLimitQuotaUsageReports{}
		if proto.Unmarshal(data, m) != nil {
			return
		}
		us, err := parseUsages(m.GetDomain(), m.GetBucketQuotaUsages())
		if err != nil {
			return
		}
		for _, u := range us {
			if len(u.resource) > MaxBucketIDBytes {
				t.Fatalf("resource id of %d bytes passed", len(u.resource))
			}
			d := st.demand(u, nil, time.Unix(0, 0))
			if !(d >= 0 && d <= maxDemand) {
				t.Fatalf("demand %v out of range for %v", d, u)
			}
		}
	})
}

package server_test

import (
	"strings"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/floodgate/floodgate/capacity/server"
	"github.com/floodgate/floodgate/internal/lease"
)

type usageMsg = rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage

// usages returns a usage per bucket name: one request allowed over a
// second.
func usages(names ...string) []*usageMsg {
	out := make([]*usageMsg, len(names))
	for i, n := range names {
		out[i] = &usageMsg{BucketId: bid(n), TimeElapsed: durationpb.New(time.Second), NumRequestsAllowed: 1}
	}
	return out
}

// Each malformed report ends its stream with InvalidArgument naming the
// field (and the usage's index), never a panic, and leaves nothing leased:
// a report is checked whole before any of it is granted.
func TestRLQSHostileInput(t *testing.T) {
	h := startRLQS(t, config(resource(apiResource, 100, lease.FairShare)), server.RLQSOptions{})
	with := func(mod func(u *usageMsg)) []*usageMsg {
		us := usages("api", "second")
		mod(us[1])
		return us
	}
	huge := strings.Repeat("x", server.MaxBucketIDBytes)
	for _, tc := range []struct {
		name string
		msg  *rlqspb.RateLimitQuotaUsageReports
		want string
	}{
		{"no domain", &rlqspb.RateLimitQuotaUsageReports{BucketQuotaUsages: usages("api")}, "domain: missing"},
		{"no bucket id", &rlqspb.RateLimitQuotaUsageReports{Domain: "envoy",
			BucketQuotaUsages: with(func(u *usageMsg) { u.BucketId = nil })}, "bucket_quota_usages[1]: bucket_id: missing"},
		{"empty bucket id", &rlqspb.RateLimitQuotaUsageReports{Domain: "envoy",
			BucketQuotaUsages: with(func(u *usageMsg) { u.BucketId = &rlqspb.BucketId{} })}, "bucket_id: missing"},
		{"empty key", &rlqspb.RateLimitQuotaUsageReports{Domain: "envoy",
			BucketQuotaUsages: with(func(u *usageMsg) { u.BucketId.Bucket[""] = "v" })}, "an empty key"},
		{"empty value", &rlqspb.RateLimitQuotaUsageReports{Domain: "envoy",
			BucketQuotaUsages: with(func(u *usageMsg) { u.BucketId.Bucket["env"] = "" })}, `bucket_id["env"]: an empty value`},
		{"huge bucket id", &rlqspb.RateLimitQuotaUsageReports{Domain: "envoy",
			BucketQuotaUsages: with(func(u *usageMsg) { u.BucketId.Bucket["k"] = huge })}, "bytes with the domain, over 256"},
		{"huge domain", &rlqspb.RateLimitQuotaUsageReports{Domain: huge, BucketQuotaUsages: usages("api")}, "over 256"},
		{"escapes over the bound", &rlqspb.RateLimitQuotaUsageReports{Domain: "envoy",
			BucketQuotaUsages: with(func(u *usageMsg) { u.BucketId.Bucket["k"] = strings.Repeat("/", 100) })}, "with the domain and escapes"},
		{"no time_elapsed", &rlqspb.RateLimitQuotaUsageReports{Domain: "envoy",
			BucketQuotaUsages: with(func(u *usageMsg) { u.TimeElapsed = nil })}, "time_elapsed: missing"},
		{"negative time_elapsed", &rlqspb.RateLimitQuotaUsageReports{Domain: "envoy",
			BucketQuotaUsages: with(func(u *usageMsg) { u.TimeElapsed = durationpb.New(-time.Second) })}, "time_elapsed: -1s is negative"},
		{"invalid time_elapsed", &rlqspb.RateLimitQuotaUsageReports{Domain: "envoy",
			BucketQuotaUsages: with(func(u *usageMsg) { u.TimeElapsed = &durationpb.Duration{Seconds: 1, Nanos: -5} })}, "time_elapsed:"},
		{"huge time_elapsed", &rlqspb.RateLimitQuotaUsageReports{Domain: "envoy",
			BucketQuotaUsages: with(func(u *usageMsg) { u.TimeElapsed = &durationpb.Duration{Seconds: 315576000000} })}, "is over 24h0m0s"},
		{"huge allowed", &rlqspb.RateLimitQuotaUsageReports{Domain: "envoy",
			BucketQuotaUsages: with(func(u *usageMsg) { u.NumRequestsAllowed = 1<<64 - 1 })}, "over 2^53"},
		{"huge denied", &rlqspb.RateLimitQuotaUsageReports{Domain: "envoy",
			BucketQuotaUsages: with(func(u *usageMsg) { u.NumRequestsDenied = 1<<53 + 1 })}, "over 2^53"},
		{"repeated bucket", &rlqspb.RateLimitQuotaUsageReports{Domain: "envoy",
			BucketQuotaUsages: usages("api", "second", "api")}, "bucket_quota_usages[2]: bucket_id: the bucket of bucket_quota_usages[0] again"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := h.newEnvoy("envoy")
			e.send(tc.msg)
			err := e.streamErr()
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("%v, want InvalidArgument with %q", err, tc.want)
			}
			waitFor(t, "the stream's end", func() bool { return h.rlqs.Streams() == 0 })
			if out := h.table.Outstanding(apiResource); out != 0 {
				t.Fatalf("a refused report leased %v of the first bucket", out)
			}
		})
	}
}

// A later report may repeat the domain or leave it empty (Envoy sends it
// every time; the API asks it only first), but not change it. The
// stream's lease, which the Envoy may still enforce after the error,
// stays counted until it expires.
func TestRLQSDomainChange(t *testing.T) {
	h := startRLQS(t, config(resource(apiResource, 100, lease.FairShare)), server.RLQSOptions{})
	e := h.newEnvoy("envoy")
	e.subscribe("api", 10)
	e.send(&rlqspb.RateLimitQuotaUsageReports{BucketQuotaUsages: usages("api")})
	e.apply(e.recv())
	e.send(&rlqspb.RateLimitQuotaUsageReports{Domain: "other", BucketQuotaUsages: usages("api")})
	err := e.streamErr()
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), `domain: "other", but the stream's domain is "envoy"`) {
		t.Fatalf("%v, want InvalidArgument naming both domains", err)
	}
	waitFor(t, "the stream's end", func() bool { return h.rlqs.Streams() == 0 })
	if out := h.table.Outstanding(apiResource); out == 0 {
		t.Fatal("the failed stream's lease was released while its Envoy may still enforce it")
	}
	h.clock.Advance(60 * time.Second)
	if out := h.table.Outstanding(apiResource); out != 0 {
		t.Fatalf("the failed stream's lease (%v) outlived its expiry", out)
	}
}

// An empty report (Envoy's after all its buckets were abandoned) is no
// error and gets no answer.
func TestRLQSEmptyReport(t *testing.T) {
	h := startRLQS(t, config(resource(apiResource, 100, lease.FairShare)), server.RLQSOptions{})
	e := h.newEnvoy("envoy")
	e.send(&rlqspb.RateLimitQuotaUsageReports{Domain: "envoy"})
	r := e.subscribe("api", 10)
	if len(r.GetBucketAction()) != 1 || r.GetBucketAction()[0].GetBucketId().GetBucket()["name"] != "api" {
		t.Fatalf("after an empty report: %v, want the api assignment only", r)
	}
}

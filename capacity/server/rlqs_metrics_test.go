package server_test

import (
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/floodgate/floodgate/capacity/server"
	"github.com/floodgate/floodgate/internal/lease"
)

// metricValue returns the value of metric name (with the label value, if
// any) gathered from reg, failing if it is missing.
func metricValue(t *testing.T, reg *prometheus.Registry, name, label string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if label != "" && (len(m.GetLabel()) != 1 || m.GetLabel()[0].GetValue() != label) {
				continue
			}
			if g := m.GetGauge(); g != nil {
				return g.GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s{%s}", name, label)
	return 0
}

// Each metric counts what it says: streams and buckets now, reports,
// abandons by reason, stream errors by code.
func TestRLQSMetrics(t *testing.T) {
	h := startRLQS(t, config(resource(apiResource, 100, lease.FairShare)), server.RLQSOptions{MaxStreams: 2, MaxBuckets: 1, IdleAfter: 5 * time.Second})
	reg := prometheus.NewRegistry()
	reg.MustRegister(h.rlqs.Collector())
	a := h.newEnvoy("envoy")
	a.subscribe("api", 0)
	a.subscribe("over", 1) // beyond MaxBuckets
	bad := h.newEnvoy("envoy")
	bad.send(&rlqspb.RateLimitQuotaUsageReports{Domain: "envoy", BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{{
		BucketId: bid("x"), TimeElapsed: durationpb.New(-time.Second)}}})
	bad.streamErr()
	waitFor(t, "the bad stream's end", func() bool { return h.rlqs.Streams() == 1 })
	if got := metricValue(t, reg, "floodgate_rlqs_streams", ""); got != 1 {
		t.Fatalf("streams %v, want 1", got)
	}
	if got := metricValue(t, reg, "floodgate_rlqs_buckets", ""); got != 1 {
		t.Fatalf("buckets %v, want 1", got)
	}
	h.clock.Advance(5 * time.Second)
	a.sendReport(time.Second) // no requests: idle since the subscription
	a.recv()
	h.rlqs.Sweep()
	a.recv()
	for _, c := range []struct {
		name, label string
		want        float64
	}{
		{"floodgate_rlqs_reports_total", "", 4},
		{"floodgate_rlqs_abandons_total", "over_bound", 1},
		{"floodgate_rlqs_abandons_total", "idle", 1},
		{"floodgate_rlqs_abandons_total", "removed", 0},
		{"floodgate_rlqs_stream_errors_total", "invalid_argument", 1},
		{"floodgate_rlqs_stream_errors_total", "unavailable", 0},
		{"floodgate_rlqs_buckets", "", 0},
	} {
		if got := metricValue(t, reg, c.name, c.label); got != c.want {
			t.Errorf("%s{%s} = %v, want %v", c.name, c.label, got, c.want)
		}
	}
}

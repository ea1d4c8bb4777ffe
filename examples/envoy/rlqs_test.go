package envoy_test

// rlqs.yaml is checked as envoy.yaml is (Envoy's config types and
// validation rules), its buckets are looked up in rlqs-resources.yaml the
// way Floodgate's RLQS looks them up, and two Envoys reporting on those
// buckets over a real gRPC stream get shares that add up to the quotas.

import (
	"context"
	"net"
	"testing"
	"time"

	rlqfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"

	"github.com/floodgate/floodgate/capacity/server"
	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/internal/lease"
)

const (
	rlqsFile       = "rlqs.yaml"
	rlqsResources  = "rlqs-resources.yaml"
	rlqsFilterName = "envoy.filters.http.rate_limit_quota"
)

// The typed_config types rlqs.yaml adds to envoy.yaml's.
var _ = []proto.Message{&rlqfilter.RateLimitQuotaFilterConfig{}, &matcherv3.HttpRequestHeaderMatchInput{}}

// loadRLQS parses and validates rlqs.yaml and returns its RLQS filter.
func loadRLQS(t *testing.T) (*bootstrapv3.Bootstrap, *rlqfilter.RateLimitQuotaFilterConfig) {
	t.Helper()
	b := &bootstrapv3.Bootstrap{}
	if err := protojson.Unmarshal(yamlToJSON(t, rlqsFile), b); err != nil {
		t.Fatalf("%s: not an Envoy v3 bootstrap: %v", rlqsFile, err)
	}
	if errs := validateTree(b, "bootstrap"); len(errs) > 0 {
		for _, err := range errs {
			t.Error(err)
		}
		t.FailNow()
	}
	hcm := &hcmv3.HttpConnectionManager{}
	unpack(t, b.GetStaticResources().GetListeners()[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig(), hcm, hcmName)
	for _, f := range hcm.GetHttpFilters() {
		if f.GetName() == rlqsFilterName {
			fc := &rlqfilter.RateLimitQuotaFilterConfig{}
			unpack(t, f.GetTypedConfig(), fc, f.GetName())
			return b, fc
		}
	}
	t.Fatalf("%s: no %s filter", rlqsFile, rlqsFilterName)
	return nil, nil
}

// bucketsOf returns the static bucket ids of the filter's matchers, each
// with its reporting interval.
func bucketsOf(t *testing.T, fc *rlqfilter.RateLimitQuotaFilterConfig) map[string]map[string]string {
	t.Helper()
	out := map[string]map[string]string{}
	add := func(name string, action *anypb.Any) {
		s := &rlqfilter.RateLimitQuotaBucketSettings{}
		unpack(t, action, s, name)
		id := map[string]string{}
		for k, v := range s.GetBucketIdBuilder().GetBucketIdBuilder() {
			if v.GetStringValue() == "" {
				t.Fatalf("bucket %s: key %s: not a static string", name, k)
			}
			id[k] = v.GetStringValue()
		}
		if ri := s.GetReportingInterval().AsDuration(); ri < time.Second {
			t.Fatalf("bucket %s: reporting_interval %v: Envoy sends time_elapsed in whole seconds, so under 1s it sends 0", name, ri)
		}
		if s.GetExpiredAssignmentBehavior().GetReuseLastAssignment() != nil {
			t.Fatalf("bucket %s: reuse_last_assignment keeps a share Floodgate may have given to another Envoy; use a safe fallback_rate_limit", name)
		}
		out[name] = id
	}
	for _, m := range fc.GetBucketMatchers().GetMatcherList().GetMatchers() {
		add(m.GetOnMatch().GetAction().GetName(), m.GetOnMatch().GetAction().GetTypedConfig())
	}
	nm := fc.GetBucketMatchers().GetOnNoMatch().GetAction()
	add(nm.GetName(), nm.GetTypedConfig())
	return out
}

// The filter calls the floodgate cluster over HTTP/2 on serve's gRPC
// port, and each bucket is served by the resources-file entry meant for
// it.
func TestRLQSExampleConfig(t *testing.T) {
	b, fc := loadRLQS(t)
	if got := fc.GetRlqsServer().GetEnvoyGrpc().GetClusterName(); got != floodgate {
		t.Fatalf("rlqs_server calls cluster %q, want %q", got, floodgate)
	}
	var found bool
	for _, c := range b.GetStaticResources().GetClusters() {
		if c.GetName() != floodgate {
			continue
		}
		found = true
		port := c.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress().GetPortValue()
		if port != grpcPort {
			t.Fatalf("cluster %s: port %d, want serve's gRPC port %d", floodgate, port, grpcPort)
		}
		if _, ok := c.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]; !ok {
			t.Fatalf("cluster %s: no HTTP/2 protocol options (gRPC needs HTTP/2)", floodgate)
		}
	}
	if !found {
		t.Fatalf("no cluster %s", floodgate)
	}
	cfg, err := lease.LoadConfig(rlqsResources)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"search": "edge/name=search", "app": "edge/*"}
	for name, id := range bucketsOf(t, fc) {
		res := server.BucketResource(fc.GetDomain(), id)
		if got := cfg.Find(res).ID; got != want[name] {
			t.Errorf("bucket %s (%s) is served by entry %q, want %q", name, res, got, want[name])
		}
	}
}

// Two Envoys with rlqs.yaml's buckets, one searching hard: Floodgate,
// serving rlqs-resources.yaml, splits each quota between them.
func TestRLQSExampleServes(t *testing.T) {
	_, fc := loadRLQS(t)
	cfg, err := lease.LoadConfig(rlqsResources)
	if err != nil {
		t.Fatal(err)
	}
	m := clock.NewManual(time.Date(2026, 11, 27, 0, 0, 0, 0, time.UTC))
	gs := grpc.NewServer()
	r := server.RegisterRLQS(gs, server.New(cfg, server.Options{Clock: m}), server.RLQSOptions{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(lis)
	defer r.Close()
	defer gs.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	buckets := bucketsOf(t, fc)
	demand := []map[string]uint64{{"search": 1000, "app": 100}, {"search": 50, "app": 2000}}
	got := make([]map[string]float64, len(demand))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	streams := make([]grpc.BidiStreamingClient[rlqspb.RateLimitQuotaUsageReports, rlqspb.RateLimitQuotaResponse], len(demand))
	for i := range streams {
		if streams[i], err = rlqspb.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx); err != nil {
			t.Fatal(err)
		}
		got[i] = map[string]float64{}
	}
	for round := 0; round < 4; round++ {
		m.Advance(time.Second)
		for i, s := range streams {
			rep := &rlqspb.RateLimitQuotaUsageReports{Domain: fc.GetDomain()}
			for name, id := range buckets {
				rep.BucketQuotaUsages = append(rep.BucketQuotaUsages, &rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
					BucketId: &rlqspb.BucketId{Bucket: id}, TimeElapsed: durationpb.New(time.Second), NumRequestsAllowed: demand[i][name],
				})
			}
			if err := s.Send(rep); err != nil {
				t.Fatal(err)
			}
			resp, err := s.Recv()
			if err != nil {
				t.Fatal(err)
			}
			for _, a := range resp.GetBucketAction() {
				got[i][a.GetBucketId().GetBucket()["name"]] = server.TokenRate(a.GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket())
			}
		}
	}
	// search: fair share of 200 between wants 1000 and 50 gives 150 and
	// 50; app: proportional share of 1000 between 100 and 2000 gives 100
	// and 900 (the first is under the equal share).
	for name, want := range map[string][2]float64{"search": {150, 50}, "app": {100, 900}} {
		if got[0][name] != want[0] || got[1][name] != want[1] {
			t.Errorf("bucket %s: shares %v and %v, want %v", name, got[0][name], got[1][name], want)
		}
	}
}

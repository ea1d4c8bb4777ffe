package grpclimit_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/gate"
)

// TestDeferIsUnavailable: a call over a defer limit is not queued (gRPC
// has no 202): it fails with UNAVAILABLE saying so, with the limit's
// retry-after trailer (a deny limit's call is RESOURCE_EXHAUSTED), and
// the call within the limit passes.
func TestDeferIsUnavailable(t *testing.T) {
	p := floodgate.MustPolicy("d", floodgate.Rule{Algorithm: floodgate.TokenBucket, Limit: 1, Period: time.Minute})
	client := start(t, gate.Limit{Name: "later", Policy: p, Action: gate.Defer})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := client.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("within the limit: %v", err)
	}
	var trailer metadata.MD
	_, err := client.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer))
	st, _ := status.FromError(err)
	if st.Code() != codes.Unavailable || !strings.HasPrefix(st.Message(), "deferred: over the rate limit, not queued (later); retry in ") {
		t.Errorf("over a defer limit: %v, want UNAVAILABLE, deferred, not queued", err)
	}
	if ra := trailer.Get("retry-after"); len(ra) != 1 || ra[0] == "0" {
		t.Errorf("retry-after trailer %v", ra)
	}
}

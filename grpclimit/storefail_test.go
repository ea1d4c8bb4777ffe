package grpclimit_test

import (
	"context"
	"log/slog"
	"reflect"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/gate"
	"github.com/floodgate/floodgate/grpclimit"
	"github.com/floodgate/floodgate/internal/downstore"
	"github.com/floodgate/floodgate/internal/redistest"
)

// startWith is start with a whole configuration (and legacy fields).
func startWith(t *testing.T, cfg gate.Config) healthpb.HealthClient {
	t.Helper()
	cfg.Clock = clock.NewManual(time.Unix(1_800_000_000, 0))
	cfg.Logger = slog.New(slog.DiscardHandler)
	return serveOpts(t, grpclimit.Options{Config: cfg, Legacy: true})
}

// rateTrailers are the trailers of gate.Headers.
var rateTrailers = []string{"ratelimit", "ratelimit-policy", "retry-after", "x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset"}

func call(t *testing.T, c healthpb.HealthClient, method string) (metadata.MD, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var trailer metadata.MD
	var err error
	switch method {
	case "check":
		_, err = c.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer))
	case "watch":
		var s healthpb.Health_WatchClient
		if s, err = c.Watch(ctx, &healthpb.HealthCheckRequest{}); err == nil {
			_, err = s.Recv()
			trailer = s.Trailer()
		}
	}
	got := metadata.MD{}
	for _, k := range rateTrailers {
		if vs := trailer.Get(k); vs != nil {
			got[k] = vs
		}
	}
	return got, err
}

// wantUnavailable checks a call refused because the store could not be
// asked: UNAVAILABLE saying so (not "rate limit exceeded"), and a
// retry-after trailer alone: no ratelimit field claiming r=0.
func wantUnavailable(t *testing.T, err error, trailer metadata.MD, limit string) {
	t.Helper()
	if st := status.Convert(err); st.Code() != codes.Unavailable || st.Message() != "rate limiter unavailable ("+limit+"); retry in 1 s" {
		t.Errorf("%s: %v, want UNAVAILABLE, rate limiter unavailable", limit, err)
	}
	if want := (metadata.MD{"retry-after": {"1"}}); !reflect.DeepEqual(trailer, want) {
		t.Errorf("%s: trailers %v, want %v", limit, trailer, want)
	}
}

// A gate failing closed on a store error refuses unary calls and streams
// with UNAVAILABLE, and no quota trailers.
func TestStoreErrorFailClosedUnavailable(t *testing.T) {
	p, _ := floodgate.NewPolicy("h", floodgate.Rule{Algorithm: floodgate.TokenBucket, Limit: 3, Period: time.Minute})
	c := startWith(t, gate.Config{Store: downstore.Store{}, FailClosed: true, Limits: []gate.Limit{{Name: "h", Policy: p, Key: []gate.Part{gate.Method()}}}})
	for _, m := range []string{"check", "watch"} {
		trailer, err := call(t, c, m)
		wantUnavailable(t, err, trailer, "h")
	}
}

// A gate failing open on a store error passes the call with its policy
// stated and no ratelimit claim.
func TestStoreErrorFailOpenPolicyOnly(t *testing.T) {
	p, _ := floodgate.NewPolicy("h", floodgate.Rule{Algorithm: floodgate.TokenBucket, Limit: 3, Period: time.Minute})
	c := startWith(t, gate.Config{Store: downstore.Store{}, Limits: []gate.Limit{{Name: "h", Policy: p, Key: []gate.Part{gate.Method()}}}})
	for range 5 {
		trailer, err := call(t, c, "check")
		if want := (metadata.MD{"ratelimit-policy": {`"h";q=3;w=60`}}); err != nil || !reflect.DeepEqual(trailer, want) {
			t.Fatalf("%v, trailers %v, want %v", err, trailer, want)
		}
	}
}

// With Redis paused, a rule failing closed refuses with UNAVAILABLE and
// no quota trailers, and one failing open passes without a ratelimit
// trailer claiming the full quota.
func TestRedisPausedFailureModes(t *testing.T) {
	srv, st := redistest.StoreOn(t)
	rule := func(mode floodgate.FailureMode) floodgate.Rule {
		return floodgate.Rule{Algorithm: floodgate.TokenBucket, Limit: 4, Period: time.Hour, OnStoreFailure: mode}
	}
	closed, _ := floodgate.NewPolicy("closed", rule(floodgate.FailClosed))
	open, _ := floodgate.NewPolicy("open", rule(floodgate.FailOpen))
	cc := startWith(t, gate.Config{Store: st, Limits: []gate.Limit{{Name: "closed", Policy: closed, Key: []gate.Part{gate.Method()}}}})
	co := startWith(t, gate.Config{Store: st, Limits: []gate.Limit{{Name: "open", Policy: open, Key: []gate.Part{gate.Method()}}}})
	for _, c := range []healthpb.HealthClient{cc, co} {
		if trailer, err := call(t, c, "check"); err != nil || len(trailer.Get("ratelimit")) != 1 {
			t.Fatalf("Redis up: %v, trailers %v", err, trailer)
		}
	}
	srv.Pause()
	t.Cleanup(srv.Resume)
	for _, m := range []string{"check", "watch"} {
		trailer, err := call(t, cc, m)
		wantUnavailable(t, err, trailer, "closed")
	}
	for range 5 {
		trailer, err := call(t, co, "check")
		if want := (metadata.MD{"ratelimit-policy": {`"open";q=4;w=3600`}}); err != nil || !reflect.DeepEqual(trailer, want) {
			t.Fatalf("open: %v, trailers %v, want %v", err, trailer, want)
		}
	}
}

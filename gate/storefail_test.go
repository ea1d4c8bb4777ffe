package gate

import (
	"log/slog"
	"net/http"
	"reflect"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/internal/redistest"
	"github.com/floodgate/floodgate/memstore"
)

// fields returns the response fields Headers gives v.
func fields(v *Verdict, legacy bool) http.Header {
	h := http.Header{}
	Headers(v, legacy, func(k string, vals []string) { h[k] = vals })
	return h
}

// boomGate is a gate whose store fails every call on the limits of the
// "boom" policy (failingStore): the error path of a store that cannot be
// reached.
func boomGate(t *testing.T, failClosed bool, limits ...Limit) *Gate {
	t.Helper()
	clk := clock.NewManual(t0)
	ms, err := memstore.New(memstore.Options{Clock: clk, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ms.Close() })
	g, err := New(Config{Limits: limits, Store: failingStore{ms}, Clock: clk, FailClosed: failClosed, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	return g
}

// A gate failing closed on a store error refuses for the store, not for a
// quota: Retry-After alone, no RateLimit field claiming r=0 and no
// RateLimit-Policy, no legacy fields; every limit it could not ask says
// so in its decision.
func TestStoreErrorFailClosedClaimsNoQuota(t *testing.T) {
	boom := policy(t, "boom", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 3, Period: time.Minute})
	other := policy(t, "other", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 3, Period: time.Minute})
	g := boomGate(t, true,
		Limit{Name: "h", Policy: boom, Key: []Part{IP()}, Status: 420},
		Limit{Name: "o", Policy: other, Key: []Part{IP()}})
	v := check(g, httpReq("192.0.2.1:1", "/"))
	if v.Allowed || v.Err == nil || v.Deciding == nil || !v.StoreUnavailable() || !v.Degraded() {
		t.Fatalf("allowed %v, err %v, deciding %+v, unavailable %v, degraded %v", v.Allowed, v.Err, v.Deciding, v.StoreUnavailable(), v.Degraded())
	}
	if d := v.Deciding.Decision; d.Reason != floodgate.ReasonStoreUnavailable || d.RetryAfter != time.Second || !d.Degraded {
		t.Fatalf("deciding decision %+v", d)
	}
	for _, o := range v.Outcomes {
		if d := o.Decision; d.Allowed || !d.Degraded || d.Reason != floodgate.ReasonStoreUnavailable || !o.Over {
			t.Errorf("%s: over %v, decision %+v", o.Limit.Name, o.Over, d)
		}
	}
	for _, legacy := range []bool{false, true} {
		if h, want := fields(v, legacy), (http.Header{"Retry-After": {"1"}}); !reflect.DeepEqual(h, want) {
			t.Errorf("legacy %v: fields %v, want %v", legacy, h, want)
		}
	}
}

// A gate failing open on a store error states the policies that applied
// (RateLimit-Policy) but claims no remaining quota it never checked: no
// RateLimit and no legacy fields. Its outcomes say they were admitted by
// the failure mode, not left as refusals that did not happen.
func TestStoreErrorFailOpenStatesPolicyOnly(t *testing.T) {
	boom := policy(t, "boom", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 3, Period: time.Minute})
	other := policy(t, "other", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 5, Period: time.Hour})
	t.Run("one limit", func(t *testing.T) {
		g := boomGate(t, false, Limit{Name: "h", Policy: boom, Key: []Part{IP()}})
		v := check(g, httpReq("192.0.2.1:1", "/"))
		if !v.Allowed || v.Err == nil || v.Deciding != nil || v.StoreUnavailable() || !v.Degraded() {
			t.Fatalf("allowed %v, err %v, deciding %+v, unavailable %v, degraded %v", v.Allowed, v.Err, v.Deciding, v.StoreUnavailable(), v.Degraded())
		}
		for _, legacy := range []bool{false, true} {
			if h, want := fields(v, legacy), (http.Header{"Ratelimit-Policy": {`"h";q=3;w=60`}}); !reflect.DeepEqual(h, want) {
				t.Errorf("legacy %v: fields %v, want %v", legacy, h, want)
			}
		}
		if d := v.Outcomes[0].Decision; !d.Allowed || !d.Degraded || d.Reason != floodgate.ReasonNone || v.Outcomes[0].Over {
			t.Fatalf("outcome %+v", v.Outcomes[0])
		}
	})
	t.Run("two limits", func(t *testing.T) {
		g := boomGate(t, false, Limit{Name: "h", Policy: boom, Key: []Part{IP()}}, Limit{Name: "o", Policy: other, Key: []Part{IP()}})
		v := check(g, httpReq("192.0.2.1:1", "/"))
		if !v.Allowed || v.Err == nil || !v.Degraded() {
			t.Fatalf("allowed %v, err %v", v.Allowed, v.Err)
		}
		if h, want := fields(v, true), (http.Header{"Ratelimit-Policy": {`"h";q=3;w=60, "o";q=5;w=3600`}}); !reflect.DeepEqual(h, want) {
			t.Errorf("fields %v, want %v", h, want)
		}
		for _, o := range v.Outcomes {
			if d := o.Decision; !d.Allowed || !d.Degraded || o.Over {
				t.Errorf("%s: %+v", o.Limit.Name, o)
			}
		}
	})
}

// Rules on a paused Redis decide by their failure modes, and the fields
// say only what is known: a rule failing closed refuses for the store
// (Retry-After: 1, nothing about a quota); one failing open admits with
// its policy stated and no RateLimit claiming a full quota (r=4) never
// checked; one failing local admits and refuses on the process's share,
// without a RateLimit for the fleet's count either.
func TestRedisPausedFieldsClaimNothingUnchecked(t *testing.T) {
	srv, st := redistest.StoreOn(t)
	rule := func(mode floodgate.FailureMode, pct int64) floodgate.Rule {
		return floodgate.Rule{Algorithm: floodgate.TokenBucket, Limit: 4, Period: time.Hour, OnStoreFailure: mode, LocalPercent: pct}
	}
	clk := clock.NewManual(t0)
	g, err := New(Config{Store: st, Clock: clk, Logger: slog.New(slog.DiscardHandler), Limits: []Limit{
		{Name: "closed", Policy: policy(t, "closed", rule(floodgate.FailClosed, 0)), Match: Match{PathPrefix: "/closed"}, Key: []Part{IP()}},
		{Name: "open", Policy: policy(t, "open", rule(floodgate.FailOpen, 0)), Match: Match{PathPrefix: "/open"}, Key: []Part{IP()}},
		{Name: "local", Policy: policy(t, "local", rule(floodgate.FailLocal, 50)), Match: Match{PathPrefix: "/local"}, Key: []Part{IP()}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	// Redis up: the store's count, in full.
	for _, p := range []string{"/closed", "/open", "/local"} {
		v := check(g, httpReq("192.0.2.1:1", p))
		h := fields(v, true)
		if !v.Allowed || v.Degraded() || h.Get("RateLimit") != `"`+p[1:]+`";r=3;t=900` || h.Get("X-RateLimit-Remaining") != "3" {
			t.Fatalf("%s, Redis up: allowed %v, fields %v", p, v.Allowed, h)
		}
	}
	srv.Pause()
	t.Cleanup(srv.Resume)

	v := check(g, httpReq("192.0.2.1:1", "/closed"))
	if v.Allowed || v.Err != nil || !v.StoreUnavailable() || !v.Degraded() {
		t.Fatalf("closed: allowed %v, err %v, unavailable %v, decision %+v", v.Allowed, v.Err, v.StoreUnavailable(), v.Deciding.Decision)
	}
	if h, want := fields(v, true), (http.Header{"Retry-After": {"1"}}); !reflect.DeepEqual(h, want) {
		t.Errorf("closed: fields %v, want %v", h, want)
	}

	v = check(g, httpReq("192.0.2.1:1", "/open"))
	if !v.Allowed || v.StoreUnavailable() || !v.Degraded() {
		t.Fatalf("open: allowed %v, decision %+v", v.Allowed, v.Deciding.Decision)
	}
	if h, want := fields(v, true), (http.Header{"Ratelimit-Policy": {`"open";q=4;w=3600`}}); !reflect.DeepEqual(h, want) {
		t.Errorf("open: fields %v, want %v", h, want)
	}

	// local at 50%, starting from what Redis counted (the one request
	// above takes its share, ceil(1 × 2/4) = 1): one admitted in process,
	// the next refused by that share: a refusal by a limit (429 in
	// httplimit), with its wait.
	for i := range 2 {
		v = check(g, httpReq("192.0.2.1:1", "/local"))
		if v.Allowed != (i < 1) || v.StoreUnavailable() || !v.Degraded() {
			t.Fatalf("local %d: allowed %v, decision %+v", i, v.Allowed, v.Deciding.Decision)
		}
		want := http.Header{"Ratelimit-Policy": {`"local";q=4;w=3600`}}
		if i == 1 {
			want["Retry-After"] = []string{"1800"}
		}
		if h := fields(v, true); !reflect.DeepEqual(h, want) {
			t.Errorf("local %d: fields %v, want %v", i, h, want)
		}
	}
}

// A blocked limit asks no store: while the store fails and the gate fails
// open, it still refuses, as a limit (429), not as the store's failure.
func TestBlockedLimitRefusesWhileTheStoreFails(t *testing.T) {
	boom := policy(t, "boom", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 3, Period: time.Minute})
	g := boomGate(t, false,
		Limit{Name: "h", Policy: boom, Key: []Part{IP()}},
		Limit{Name: "blocked", Blocked: true, Key: []Part{IP()}})
	v := check(g, httpReq("192.0.2.1:1", "/"))
	if v.Allowed || v.Err == nil || v.Deciding == nil || v.Deciding.Limit.Name != "blocked" || v.StoreUnavailable() {
		t.Fatalf("allowed %v, err %v, deciding %+v, unavailable %v", v.Allowed, v.Err, v.Deciding, v.StoreUnavailable())
	}
}

package httplimit_test

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/gate"
	"github.com/floodgate/floodgate/httplimit"
	"github.com/floodgate/floodgate/internal/downstore"
	"github.com/floodgate/floodgate/internal/redistest"
)

// rateFields are the response fields that describe a quota.
var rateFields = []string{"Ratelimit", "Ratelimit-Policy", "X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset"}

// response is one answer, read whole.
type response struct {
	code int
	h    http.Header
	body string
}

// noRedirect is a client that shows a redirect rather than follow it.
var noRedirect = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// fetch makes a GET request with the header fields hdr (name, value, ...).
func fetch(t *testing.T, url string, hdr ...string) response {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := noRedirect.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	return response{resp.StatusCode, resp.Header, string(b)}
}

// checkUnavailable checks the refusal of a request the store could not
// decide: 503, a body saying the rate limiter is unavailable (text, and
// JSON when asked for), Retry-After: 1, no-store, and no field claiming
// anything of a quota.
func checkUnavailable(t *testing.T, url, limit string) {
	t.Helper()
	r := fetch(t, url)
	if r.code != 503 || r.body != "rate limiter unavailable ("+limit+"); retry in 1 s\n" ||
		r.h.Get("Content-Type") != "text/plain; charset=utf-8" || r.h.Get("Retry-After") != "1" || r.h.Get("Cache-Control") != "no-store" {
		t.Errorf("%s: %d %q %v", url, r.code, r.body, r.h)
	}
	for _, k := range rateFields {
		if vs := r.h[k]; vs != nil {
			t.Errorf("%s: %s: %q on a refusal for the store", url, k, vs)
		}
	}
	r = fetch(t, url, "Accept", "application/json")
	if r.code != 503 || r.body != `{"error":"rate_limiter_unavailable","limit":"`+limit+`","retry_after":1}`+"\n" ||
		r.h.Get("Content-Type") != "application/json" || r.h.Get("Retry-After") != "1" {
		t.Errorf("%s (JSON): %d %q %v", url, r.code, r.body, r.h)
	}
}

// checkPolicyOnly checks an admission a failure mode made: served, the
// policy stated, and no RateLimit (or legacy) field claiming a remaining
// quota nobody counted.
func checkPolicyOnly(t *testing.T, r response, what, policy string) {
	t.Helper()
	if r.code != 200 || r.body != "ok" {
		t.Errorf("%s: %d %q", what, r.code, r.body)
	}
	got := http.Header{}
	for _, k := range append(rateFields, "Retry-After") {
		if vs := r.h[k]; vs != nil {
			got[k] = vs
		}
	}
	if want := (http.Header{"Ratelimit-Policy": {policy}}); !reflect.DeepEqual(got, want) {
		t.Errorf("%s: fields %v, want %v", what, got, want)
	}
}

// A gate failing closed on a store error answers 503 "rate limiter
// unavailable", whatever the limit's status or action (a redirect to a
// "slow down" page would claim the limit reached), and Observe can tell.
func TestStoreErrorFailClosedIs503(t *testing.T) {
	p := mustPolicy(t, "h", floodgate.Rule{Algorithm: floodgate.TokenBucket, Limit: 3, Period: time.Minute})
	var unavailable, observed atomic.Int64
	srv, served := serve(t, httplimit.Options{Legacy: true,
		Config: gate.Config{Store: downstore.Store{}, FailClosed: true, Clock: clock.NewManual(time.Unix(1_800_000_000, 0)), Logger: slog.New(slog.DiscardHandler),
			Limits: []gate.Limit{
				{Name: "status", Policy: p, Match: gate.Match{PathPrefix: "/status"}, Status: 420},
				{Name: "redirect", Policy: p, Match: gate.Match{PathPrefix: "/redirect"}, Action: gate.Redirect, Redirect: "https://example.com/busy"},
				{Name: "h", Policy: p, Match: gate.Match{PathPrefix: "/h"}, Key: []gate.Part{gate.IP()}},
			}},
		Observe: func(r *http.Request, v *gate.Verdict) {
			observed.Add(1)
			if v.StoreUnavailable() && v.Degraded() {
				unavailable.Add(1)
			}
		},
	})
	for _, l := range []string{"h", "status", "redirect"} {
		checkUnavailable(t, srv.URL+"/"+l, l)
	}
	if served.Load() != 0 || observed.Load() != 6 || unavailable.Load() != 6 {
		t.Fatalf("served %d; observed %d, %d of them unavailable", served.Load(), observed.Load(), unavailable.Load())
	}
}

// A gate failing open on a store error lets the request through with its
// policy stated and no RateLimit claiming a quota it never checked
// (before: no field at all, though every response was said to carry
// them).
func TestStoreErrorFailOpenStatesPolicy(t *testing.T) {
	p := mustPolicy(t, "h", floodgate.Rule{Algorithm: floodgate.TokenBucket, Limit: 3, Period: time.Minute})
	srv, served := serve(t, httplimit.Options{Legacy: true,
		Config: gate.Config{Store: downstore.Store{}, Clock: clock.NewManual(time.Unix(1_800_000_000, 0)), Logger: slog.New(slog.DiscardHandler),
			Limits: []gate.Limit{{Name: "h", Policy: p, Key: []gate.Part{gate.IP()}}}},
	})
	for i := range 5 {
		checkPolicyOnly(t, fetch(t, srv.URL), fmt.Sprint("request ", i), `"h";q=3;w=60`)
	}
	if served.Load() != 5 {
		t.Fatalf("served %d, want 5", served.Load())
	}
}

// With Redis paused, each rule's failure mode decides and the response
// says what is known: a rule failing closed answers 503 (not 429 "rate
// limit exceeded"), one failing open admits without claiming r=4 of a
// quota of 4 it never counted, one failing local limits at its share
// with 429 and Retry-After, without a RateLimit for the fleet's count.
func TestRedisPausedFailureModeResponses(t *testing.T) {
	srv, st := redistest.StoreOn(t)
	rule := func(mode floodgate.FailureMode, pct int64) floodgate.Rule {
		return floodgate.Rule{Algorithm: floodgate.TokenBucket, Limit: 4, Period: time.Hour, OnStoreFailure: mode, LocalPercent: pct}
	}
	hs, served := serve(t, httplimit.Options{Legacy: true,
		Config: gate.Config{Store: st, Clock: clock.NewManual(time.Unix(1_800_000_000, 0)), Logger: slog.New(slog.DiscardHandler),
			Limits: []gate.Limit{
				{Name: "closed", Policy: mustPolicy(t, "closed", rule(floodgate.FailClosed, 0)), Match: gate.Match{PathPrefix: "/closed"}, Key: []gate.Part{gate.IP()}},
				{Name: "open", Policy: mustPolicy(t, "open", rule(floodgate.FailOpen, 0)), Match: gate.Match{PathPrefix: "/open"}, Key: []gate.Part{gate.IP()}},
				{Name: "local", Policy: mustPolicy(t, "local", rule(floodgate.FailLocal, 50)), Match: gate.Match{PathPrefix: "/local"}, Key: []gate.Part{gate.IP()}},
			}},
	})
	// Redis up: the store's counts, as ever.
	for _, l := range []string{"closed", "open", "local"} {
		r := fetch(t, hs.URL+"/"+l)
		if r.code != 200 || r.h.Get("RateLimit") != `"`+l+`";r=3;t=900` || r.h.Get("RateLimit-Policy") != `"`+l+`";q=4;w=3600` || r.h.Get("X-RateLimit-Remaining") != "3" {
			t.Fatalf("%s, Redis up: %d %v", l, r.code, r.h)
		}
	}
	srv.Pause()
	t.Cleanup(srv.Resume)

	checkUnavailable(t, hs.URL+"/closed", "closed")
	for i := range 5 {
		checkPolicyOnly(t, fetch(t, hs.URL+"/open"), fmt.Sprint("open ", i), `"open";q=4;w=3600`)
	}
	// local at 50% of 4 an hour, starting from what Redis counted (the
	// request above takes its share, ceil(1 × 2/4) = 1): one in process,
	// then refused by that share: a limit reached, 429, with its wait.
	for i := range 1 {
		checkPolicyOnly(t, fetch(t, hs.URL+"/local"), fmt.Sprint("local ", i), `"local";q=4;w=3600`)
	}
	r := fetch(t, hs.URL+"/local")
	if r.code != 429 || r.body != "rate limit exceeded (local); retry in 1800 s\n" || r.h.Get("Retry-After") != "1800" ||
		r.h.Get("RateLimit-Policy") != `"local";q=4;w=3600` || r.h["Ratelimit"] != nil || r.h["X-Ratelimit-Remaining"] != nil {
		t.Fatalf("local, over its share: %d %q %v", r.code, r.body, r.h)
	}
	if served.Load() != 3+5+1 {
		t.Fatalf("served %d, want 9", served.Load())
	}
}

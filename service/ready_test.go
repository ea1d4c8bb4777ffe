package service_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/service"
)

// A flapping check (a breaker open for its 500ms cooldown, closed for
// 300ms by a probe, again and again) does not flap readiness: with 3s
// before unready and 5s before ready, /readyz stays ready through a minute
// of it. Without hysteresis it changed on every flap (twice a cycle: 150
// times in the minute).
func TestReadyzDoesNotFlapWithTheBreaker(t *testing.T) {
	clk := clock.NewManual(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	var healthy atomic.Bool
	healthy.Store(true)
	raw := func() (bool, string) {
		if healthy.Load() {
			return true, "ready: Redis store"
		}
		return false, "degraded: the Redis store is not answering"
	}
	h := service.NewHysteresis(raw, clk, 3*time.Second, 5*time.Second)
	srv := httptest.NewServer((&service.Service{}).HTTPHandler(nil, h.Readiness()))
	defer srv.Close()
	readyz := func() int {
		t.Helper()
		resp, err := http.Get(srv.URL + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := readyz(); code != 200 {
		t.Fatalf("healthy at start: %d", code)
	}
	// a minute of flapping, polled every 100ms
	changes, last := 0, 200
	for ms := 0; ms < 60_000; ms += 100 {
		healthy.Store(ms%800 >= 500) // open 500ms, closed 300ms
		if code := readyz(); code != last {
			changes++
			last = code
		}
		clk.Advance(100 * time.Millisecond)
	}
	if changes != 0 || h.Changes() != 0 {
		t.Fatalf("readiness changed %d times (%d by its count) under a flapping breaker, want 0", changes, h.Changes())
	}
}

// Hysteresis both ways, sample by sample: unready only after 3s of
// failed samples (a passing one starts the count again), ready only after
// 5s of passing ones (a failing one starts it again); /readyz says, while
// the check and the answer disagree, for how long they have.
func TestHysteresisSustained(t *testing.T) {
	clk := clock.NewManual(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	var ok atomic.Bool
	ok.Store(true)
	h := service.NewHysteresis(func() (bool, string) {
		if ok.Load() {
			return true, "up"
		}
		return false, "down"
	}, clk, 3*time.Second, 5*time.Second)
	step := func(check bool, d time.Duration, want bool) {
		t.Helper()
		ok.Store(check)
		got, why := h.Check()
		if got != want {
			t.Fatalf("at %v, check %v: ready %v (%s), want %v", clk.Now().Format("05.000"), check, got, why, want)
		}
		clk.Advance(d)
	}
	step(true, time.Second, true)
	step(false, 2900*time.Millisecond, true) // failing from 1s
	step(true, time.Second, true)            // a pass: the count starts again
	step(false, 2*time.Second, true)
	step(false, 999*time.Millisecond, true)
	if _, why := h.Check(); !strings.Contains(why, "unready if it goes on for 3s") || !strings.Contains(why, "down") {
		t.Fatalf("why while failing but ready: %q", why)
	}
	clk.Advance(time.Millisecond)
	step(false, time.Second, false) // 3s of failures
	step(true, 4*time.Second, false)
	step(false, time.Second, false) // a failure: the count starts again
	step(true, 4999*time.Millisecond, false)
	if ready, why := h.Check(); ready || !strings.Contains(why, "ready when it has for 5s") {
		t.Fatalf("passing for 4.999s: %v %q", ready, why)
	}
	clk.Advance(time.Millisecond)
	step(true, time.Second, true)
	if h.Changes() != 2 {
		t.Fatalf("%d changes, want 2", h.Changes())
	}

	// the first sample is taken as it is: down at start is unready at once
	ok.Store(false)
	h2 := service.NewHysteresis(h.Readiness(), clk, time.Hour, time.Hour)
	if ready, _ := h2.Check(); !ready {
		t.Fatal("h is ready, so h2's first sample is")
	}
	h3 := service.NewHysteresis(func() (bool, string) { return false, "down" }, clk, time.Hour, time.Hour)
	if ready, _ := h3.Check(); ready {
		t.Fatal("a store down at start: ready")
	}
}

// Run samples in the background, on the clock, so that failures between
// sparse probes count: a probe 3.25s after the store went down (3s after
// the first background sample that saw it) finds the instance unready,
// though it is the probe's first failing sample.
func TestHysteresisRunSamples(t *testing.T) {
	clk := clock.NewManual(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	var ok atomic.Bool
	ok.Store(true)
	var samples atomic.Int64
	h := service.NewHysteresis(func() (bool, string) {
		samples.Add(1)
		return ok.Load(), "x"
	}, clk, 3*time.Second, 5*time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); h.Run(ctx, 250*time.Millisecond) }()
	defer func() { cancel(); <-done }()
	wait := func() {
		if err := clk.WaitForSleepers(context.Background(), 1); err != nil {
			t.Fatal(err)
		}
	}
	wait()
	ok.Store(false)
	for range 13 { // 3.25s of samples
		clk.Advance(250 * time.Millisecond)
		wait()
	}
	if ready, why := h.Check(); ready {
		t.Fatalf("3s of failing background samples, then a probe: ready (%s); %d samples", why, samples.Load())
	}
	if h.Changes() != 1 {
		t.Fatalf("%d changes, want 1", h.Changes())
	}
}

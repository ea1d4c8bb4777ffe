package server_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate/capacity/server"
	"github.com/floodgate/floodgate/internal/lease"
)

// TestRLQSRestartLearnsFromWatermark: a single server restarted (its
// table lost) while Envoys enforce its assignments reads its lease
// watermark and learns until it: each Envoy reconnecting gets back what
// it allowed, so the assignments never add up to more than the quota.
// Without the watermark the first Envoy back would get the whole quota
// while the other still enforces its old share (120 of 100).
func TestRLQSRestartLearnsFromWatermark(t *testing.T) {
	state := filepath.Join(t.TempDir(), "capacity.state")
	cfg := config(resource(apiResource, 100, lease.FairShare))
	h1 := startRLQS(t, cfg, server.RLQSOptions{})
	if err := h1.srv.PersistLeases(state); err != nil {
		t.Fatal(err)
	}
	a, b := h1.newEnvoy("envoy"), h1.newEnvoy("envoy")
	a.subscribe("api", 200)
	b.subscribe("api", 20)
	envoys := []*envoy{a, b}
	if r := runRounds(t, h1, envoys, 100, 20, []float64{80, 20}); r < 0 {
		t.Fatalf("first start: rates %v, want [80 20]", rates(envoys, "api"))
	}
	// The restart: a new server on the same state file; the Envoys
	// reconnect, enforcing their old assignments until answered.
	h2 := startRLQS(t, cfg, server.RLQSOptions{})
	h2.clock.Set(h1.clock.Now().Add(time.Second))
	if err := h2.srv.PersistLeases(state); err != nil {
		t.Fatal(err)
	}
	a2, b2 := h2.newEnvoy("envoy"), h2.newEnvoy("envoy")
	for _, p := range [][2]*envoy{{a, a2}, {b, b2}} {
		old := *p[0].buckets["api"]
		p[1].buckets["api"] = &old
	}
	envoys = []*envoy{a2, b2}
	for round := 1; round <= 5; round++ {
		h2.clock.Advance(time.Second)
		for _, e := range envoys {
			e.report(time.Second)
			checkSplit(t, h2, envoys, "api", apiResource, 100, "after the restart")
		}
	}
	if got := rates(envoys, "api"); !equal(got, []float64{80, 20}) {
		t.Fatalf("after the restart: rates %v, want the old [80 20]", got)
	}
}

// TestWatermarkFile: the watermark survives a write and a read; a missing
// file is no watermark (a first start grants at once: no learning); a
// corrupt one is an error naming the file; a watermark already passed
// starts no learning.
func TestWatermarkFile(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "capacity.state")
	if w, err := server.ReadWatermark(f); err != nil || !w.IsZero() {
		t.Fatalf("missing file: %v, %v", w, err)
	}
	at := epoch.Add(90 * time.Second)
	if err := server.WriteWatermark(f, at); err != nil {
		t.Fatal(err)
	}
	if w, err := server.ReadWatermark(f); err != nil || !w.Equal(at) {
		t.Fatalf("read back %v, %v; want %v", w, err, at)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("temporary files left: %v", ents)
	}
	for _, bad := range []string{"", "junk\n", "floodgate-capacity-watermark v1 x\n", "floodgate-capacity-watermark v1 -5\n"} {
		os.WriteFile(f, []byte(bad), 0o600)
		if _, err := server.ReadWatermark(f); err == nil || !strings.Contains(err.Error(), f+":1") {
			t.Errorf("%q: %v", bad, err)
		}
	}
	if err := server.New(config(), server.Options{}).PersistLeases(filepath.Join(dir, "no", "such.state")); err == nil {
		t.Error("a state file in a missing directory: no error")
	}
	// Passed: a start after it grants at once.
	server.WriteWatermark(f, epoch.Add(-time.Second))
	h := startRLQS(t, config(resource(apiResource, 100, lease.FairShare)), server.RLQSOptions{})
	if err := h.srv.PersistLeases(f); err != nil {
		t.Fatal(err)
	}
	a := h.newEnvoy("envoy")
	a.subscribe("api", 50)
	h.clock.Advance(time.Second)
	a.report(time.Second)
	if got := a.rate("api"); got != 50 {
		t.Fatalf("after a passed watermark: rate %v, want 50 (no learning)", got)
	}
}

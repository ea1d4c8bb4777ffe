package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/floodgate/floodgate/internal/dashboard"
	"github.com/floodgate/floodgate/internal/recorder"
	"github.com/floodgate/floodgate/internal/redistest"
)

// trackOf returns snap's track named name, and whether it has one.
func trackOf(snap dashboard.Snapshot, name string) (recorder.TrackSeries, bool) {
	for _, ts := range snap.Tracks {
		if ts.Name == name {
			return ts, true
		}
	}
	return recorder.TrackSeries{}, false
}

// trackSums are what a track's seconds add up to, by label.
func trackSums(ts recorder.TrackSeries) map[string]uint64 {
	m := map[string]uint64{}
	for _, row := range ts.Counts {
		for i, v := range row {
			m[ts.Labels[i]] += uint64(v)
		}
	}
	return m
}

// TestDashboardTiersNearCache: serve on a real Redis, a key refused by
// Redis and then 20 times by the near cache: the snapshot's tiers track
// counts the 20 decisions made without Redis, per second and in total,
// and its Redis calls did not grow for them (the store's calls, as
// /metrics counts them, unchanged). A memory store has no tiers track.
func TestDashboardTiersNearCache(t *testing.T) {
	srv := redistest.Standalone(t)
	dir := t.TempDir()
	writeRules(t, dir, "api.yaml", apiRules)
	// a patient timeout: with the 50 ms default a starved host's slow call
	// is decided by the failure mode (open), not by Redis (load 25 did that)
	s := startServer(t, "--rules", dir, "--data", t.TempDir(), "--store", "redis://"+srv.Addr, "--store-timeout", "10s")
	for i := range 51 { // 50 an hour: the 51st refused by Redis
		r := s.ask(t, "api", desc("user", "a"))
		if over := r.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT; over != (i == 50) {
			t.Fatalf("ask %d: %v", i, r.OverallCode)
		}
	}
	calls := metricValue(t, s.http, "floodgate_store_calls_total")
	near := metricValue(t, s.http, "floodgate_store_near_cache_hits_total")
	for range 20 {
		if r := s.ask(t, "api", desc("user", "a")); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("after the refusal: %v", r.OverallCode)
		}
	}
	if c := metricValue(t, s.http, "floodgate_store_calls_total"); c != calls {
		t.Fatalf("Redis calls %v → %v for 20 asks of a refused key: want the near cache to answer them", calls, c)
	}
	if n := metricValue(t, s.http, "floodgate_store_near_cache_hits_total"); n != near+20 {
		t.Fatalf("near cache hits %v → %v, want 20 more", near, n)
	}
	var ts recorder.TrackSeries
	redistest.WaitFor(t, time.Minute, "a snapshot with the 20 near cache refusals", func() bool {
		var ok bool
		ts, ok = trackOf(snapshotOf(t, s.admin), tiersTrack)
		return ok && ts.Total[1] == uint64(near)+20
	})
	if fmt.Sprint(ts.Labels) != fmt.Sprint(tiersLabels) {
		t.Fatalf("labels %v", ts.Labels)
	}
	sums := trackSums(ts)
	if ts.Total[0] != uint64(calls) || sums["redis_calls"] != uint64(calls) || sums["near_cache"] != uint64(near)+20 {
		t.Errorf("tiers: total %v, per second adding to %v; want %v Redis calls and %v near cache refusals", ts.Total, sums, calls, near+20)
	}
	if sums["write_back"] != 0 || sums["local_share"] != 0 {
		t.Errorf("tiers without write-back or local share rules: %v", sums)
	}

	m := startServerNoClient(t, "--rules", dir, "--data", t.TempDir())
	if snap := snapshotOf(t, m.admin); len(snap.Tracks) != 0 {
		t.Errorf("a memory store's tracks: %+v, want none", snap.Tracks)
	}
}

// TestProxyDashboardShed: a proxy with one throttler slot and no queue,
// the slot held by the upstream: 3 SHEDDABLE and 2 CRITICAL requests (one
// by its header, one by default) shed with 503 show in the proxy's shed
// track, by criticality; on a
// memory store it has no tiers track, and without a throttler no shed
// track.
func TestProxyDashboardShed(t *testing.T) {
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
		io.WriteString(w, "ok") //nolint:errcheck
	}))
	defer up.Close()
	var once sync.Once
	unhold := func() { once.Do(func() { close(release) }) }
	defer unhold()
	p := startProxy(t, up.URL, t.TempDir(), "--throttle-max-inflight", "1", "--throttle-queue-cost", "0")
	r := &throttleRig{t: t, p: p, base: "http://" + p.addrs["proxy"], admin: "http://" + p.addrs["admin"] + "/metrics",
		client: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}, results: make(chan throttleResult, 8)}
	go r.send("A", "/held", "")
	r.waitGauge("floodgate_throttle_in_flight", 1)
	for i, crit := range []string{"SHEDDABLE", "SHEDDABLE", "SHEDDABLE", "CRITICAL", ""} {
		go r.send(fmt.Sprint(crit, i), "/x", crit)
		if res := r.next(); res.status != 503 {
			t.Fatalf("%s with the slot held and no queue: %+v, want 503", crit, res)
		}
	}
	unhold()
	if res := r.next(); res.status != 200 {
		t.Fatalf("the held request: %+v", res)
	}
	var snap dashboard.Snapshot
	var ts recorder.TrackSeries
	redistest.WaitFor(t, time.Minute, "a snapshot with the 5 shed", func() bool {
		var ok bool
		snap = snapshotOf(t, p.addrs["admin"])
		ts, ok = trackOf(snap, shedTrack)
		return ok && ts.Total[0]+ts.Total[1]+ts.Total[2]+ts.Total[3] == 5
	})
	want := map[string]uint64{"CRITICAL_PLUS": 0, "CRITICAL": 2, "SHEDDABLE_PLUS": 0, "SHEDDABLE": 3}
	if got := trackSums(ts); fmt.Sprint(got) != fmt.Sprint(want) || fmt.Sprint(ts.Labels) != "[CRITICAL_PLUS CRITICAL SHEDDABLE_PLUS SHEDDABLE]" {
		t.Errorf("shed per second adds to %v (labels %v), want %v", got, ts.Labels, want)
	}
	if _, ok := trackOf(snap, tiersTrack); ok {
		t.Errorf("a proxy on a memory store has a tiers track: %+v", snap.Tracks)
	}

	q := startProxy(t, up.URL, t.TempDir())
	if snap := snapshotOf(t, q.addrs["admin"]); len(snap.Tracks) != 0 {
		t.Errorf("a proxy without a throttler: tracks %+v, want none", snap.Tracks)
	}
}

package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// The rules of the cardinality test: D = 1 domain, R = 5 limits, one of
// them (user) with detailed_metric, one (soft) in mode: soft.
const cardinalityRules = `domain: card
descriptors:
  - key: user
    detailed_metric: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: ip
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: soft
    rate_limit: {unit: hour, requests_per_unit: 1, mode: soft, soft_percent: 100}
  - key: path
    descriptors:
      - key: ip
        rate_limit: {unit: hour, requests_per_unit: 1}
`

// The bounds of docs/SERVICE.md "Metrics and their cardinality", for D
// domains, R limits and T detailed_metric/value_to_metric limits in the
// rules. Every domain no rules name is counted as "_unknown" (so D+1), an
// invalid request under domain "".
func cardinalityBounds(d, r, t int) map[string]int {
	return map[string]int{
		"floodgate_requests_total":             3*(d+1) + 1,
		"floodgate_request_duration_seconds":   15 * (d + 1), // 12 buckets, +Inf, _sum, _count
		"floodgate_decisions_total":            8 * (r + d),
		"floodgate_soft_limit_crossings_total": r,
		"floodgate_top_value_decisions":        2 * 101 * t,
		"floodgate_rule_reloads_total":         2,
		"floodgate_rule_domains":               1,
		"floodgate_admin_auth_failures_total":  2,
	}
}

// cardinalityFloodSize is how many distinct values (and keys, and domains)
// the flood sends.
const cardinalityFloodSize = 10_000

// A flood of distinct descriptor values, unknown descriptor keys and
// unknown domains adds no series beyond the documented bounds, which
// depend on the rules only: /metrics of a serve that saw 10,000 of each
// holds at most cardinalityBounds series per family and none naming a
// flooded domain or key.
func TestServeMetricsCardinalityBounded(t *testing.T) {
	dir := t.TempDir()
	writeRules(t, dir, "card.yaml", cardinalityRules)
	s := startServer(t, "--rules", dir, "--data", t.TempDir())

	// distinct values of each limit (the detailed one included), and
	// unknown keys, MaxDescriptors to a request
	var ds []*rlcommon.RateLimitDescriptor
	for i := range cardinalityFloodSize {
		v := fmt.Sprintf("v%05d", i)
		ds = append(ds, desc("user", v), desc("ip", v), desc("shadow", v), desc("soft", v), desc("soft", v), desc("path", v, "ip", v),
			desc(fmt.Sprintf("unknownkey%05d", i), v))
	}
	for len(ds) > 0 {
		n := min(len(ds), 64)
		s.ask(t, "card", ds[:n]...)
		ds = ds[n:]
	}
	// unknown domains, one to a request, from a few clients at once
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < cardinalityFloodSize; i += 8 {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				_, err := s.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
					Domain: fmt.Sprintf("flooddomain%05d", i), Descriptors: []*rlcommon.RateLimitDescriptor{desc("user", "x")}})
				cancel()
				if err != nil && !strings.Contains(err.Error(), "domain") {
					t.Errorf("unknown domain: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()

	text := scrapeText(t, "http://"+s.http+"/metrics")
	series := map[string]int{}
	total := 0
	for _, line := range strings.Split(text, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if strings.Contains(line, "flooddomain") || strings.Contains(line, "unknownkey") {
			t.Fatalf("a flooded name reached /metrics: %s", line)
		}
		name, _, _ := strings.Cut(line, " ")
		name, _, _ = strings.Cut(name, "{")
		for _, suf := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(name, suf); ok && strings.HasPrefix(base, "floodgate_request_duration") {
				name = base
			}
		}
		series[name]++
		total++
	}
	bounds := cardinalityBounds(1, 5, 1)
	sum := 0
	for name, b := range bounds {
		sum += b
		if series[name] > b {
			t.Errorf("%s: %d series, bound %d", name, series[name], b)
		}
	}
	if series["floodgate_soft_limit_crossings_total"] != 1 {
		t.Errorf("floodgate_soft_limit_crossings_total: %d series, want 1: the flood crossed the soft rule's soft line", series["floodgate_soft_limit_crossings_total"])
	}
	if series["floodgate_top_value_decisions"] < 100 {
		t.Errorf("floodgate_top_value_decisions: %d series: the flood did not reach the summary", series["floodgate_top_value_decisions"])
	}
	t.Logf("after %d distinct values, keys and domains: %d series in all; %v", cardinalityFloodSize, total, series)
	// the documented whole: the families above, the memory store's 12
	// and the Go and process collectors' (fewer than 100)
	if limit := sum + 12 + 100; total > limit {
		t.Errorf("%d series on /metrics, documented bound %d", total, limit)
	}
}

// The proxy's series depend on its routes only: 10,000 distinct API keys
// (a per-key route) and paths add none, and no key reaches /metrics.
func TestProxyMetricsCardinalityBounded(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer up.Close()
	dir := t.TempDir()
	writeRules(t, dir, "edge.yaml", proxyRules) // 3 routes
	p := startProxy(t, up.URL, dir)
	client := &http.Client{Timeout: 10 * time.Second}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < cardinalityFloodSize; i += 8 {
				req, _ := http.NewRequest("GET", fmt.Sprintf("http://%s/keyed/p%05d", p.addrs["proxy"], i), nil)
				req.Header.Set("X-API-Key", fmt.Sprintf("floodkey%05d", i))
				resp, err := client.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	wg.Wait()
	series := map[string]int{}
	for _, line := range strings.Split(scrapeText(t, "http://"+p.addrs["admin"]+"/metrics"), "\n") {
		if strings.Contains(line, "floodkey") || strings.Contains(line, "/keyed/p") {
			t.Fatalf("a flooded key or path reached /metrics: %s", line)
		}
		if strings.HasPrefix(line, "floodgate_proxy_") {
			name, _, _ := strings.Cut(line, "{")
			name, _, _ = strings.Cut(name, " ")
			series[name]++
		}
	}
	// docs/SERVICE.md: 7 outcomes per route, 4 request outcomes, 4 client
	// error reasons
	for name, b := range map[string]int{"floodgate_proxy_limit_decisions_total": 7 * 3,
		"floodgate_proxy_requests_total": 4, "floodgate_proxy_client_errors_total": 4} {
		if series[name] > b {
			t.Errorf("%s: %d series, bound %d", name, series[name], b)
		}
	}
	if series["floodgate_proxy_limit_decisions_total"] < 1 { // per-key, ok
		t.Errorf("the flood did not reach the proxy's decisions: %v", series)
	}
	t.Logf("after %d distinct keys and paths: %v", cardinalityFloodSize, series)
}

package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.yaml.in/yaml/v3"

	"github.com/floodgate/floodgate/internal/redistest"
	"github.com/floodgate/floodgate/throttle"
	"github.com/floodgate/floodgate/throttle/throttlemetrics"
)

// The files shipped in examples/observability.
var (
	alertsFile    = filepath.Join("..", "..", "examples", "observability", "floodgate-alerts.yaml")
	dashboardFile = filepath.Join("..", "..", "examples", "observability", "floodgate-dashboard.json")
)

// The tokenizer names the metrics of an expression and nothing else: not
// label names or values (even when they look like metric names), functions,
// aggregations, keywords, durations, numbers or dashboard variables.
func TestPromQLNames(t *testing.T) {
	for _, c := range []struct {
		expr string
		want []string
	}{
		{`up`, []string{"up"}},
		{`max by (instance) (floodgate_store_breaker_open) == 1`, []string{"floodgate_store_breaker_open"}},
		{`sum by (domain) (rate(a_total{code="over_limit"}[5m])) / sum by (domain) (rate(a_total[5m] offset 1h))`,
			[]string{"a_total", "a_total"}},
		{`rate(x{l=~"b{c}|d(e)\"f_total"}[$__rate_interval])`, []string{"x"}},
		{`histogram_quantile(0.99, sum by (le) (rate(h_bucket[1m])))`, []string{"h_bucket"}},
		{`a > bool 3 * b unless on(x, y) group_left(z) c and ignoring (w) d or without_x`,
			[]string{"a", "b", "c", "d", "without_x"}},
		{`topk(5, m) + count_values("label_name", n) + 1e3 + 0x1f + .5 + Inf + NaN`, []string{"m", "n"}},
		{"sum without (job) (x:recorded:rate5m) # a comment naming not_a_metric", []string{"x:recorded:rate5m"}},
		{`{__name__="hidden"}`, nil},
		{"max\n  by\n  (instance)\n  (y)", []string{"y"}},
	} {
		got, err := promqlNames(c.expr)
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("promqlNames(%q) = %q, %v; want %q", c.expr, got, err, c.want)
		}
	}
	for _, bad := range []string{`rate(x[5m]`, `x{a="b}`, `x)`, `x{a="b"`, `x[5m`, `sum(x]`, `x{a=(b)}`} {
		if got, err := promqlNames(bad); err == nil {
			t.Errorf("promqlNames(%q) = %q, no error", bad, got)
		}
	}
}

// alertRules is the part of a Prometheus rules file the check reads.
type alertRules struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// alertExprs parses the alert rules, strictly, and returns each rule's
// expression by alert name.
func alertExprs(t *testing.T) map[string]string {
	t.Helper()
	f, err := os.Open(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := yaml.NewDecoder(f)
	dec.KnownFields(true)
	var ar alertRules
	if err := dec.Decode(&ar); err != nil {
		t.Fatalf("%s: %v", alertsFile, err)
	}
	out := map[string]string{}
	for _, g := range ar.Groups {
		for _, r := range g.Rules {
			where := fmt.Sprintf("%s: group %q, alert %q", alertsFile, g.Name, r.Alert)
			switch {
			case r.Alert == "" || strings.TrimSpace(r.Expr) == "":
				t.Errorf("%s: no alert name or no expr", where)
			case r.Labels["severity"] == "" || r.Annotations["summary"] == "":
				t.Errorf("%s: no severity label or no summary", where)
			case out[r.Alert] != "":
				t.Errorf("%s: twice", where)
			}
			if r.For != "" {
				if _, err := time.ParseDuration(r.For); err != nil {
					t.Errorf("%s: for: %v", where, err)
				}
			}
			out[r.Alert] = r.Expr
		}
	}
	return out
}

// dashboardExprs parses the Grafana dashboard and returns each query by
// panel title and refId.
func dashboardExprs(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Title         string `json:"title"`
		UID           string `json:"uid"`
		SchemaVersion int    `json:"schemaVersion"`
		Panels        []struct {
			ID      int    `json:"id"`
			Type    string `json:"type"`
			Title   string `json:"title"`
			Targets []struct {
				RefID string `json:"refId"`
				Expr  string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	if d.Title == "" || d.UID == "" || d.SchemaVersion == 0 || len(d.Panels) == 0 {
		t.Fatalf("%s: not a Grafana dashboard (title, uid, schemaVersion, panels)", dashboardFile)
	}
	out := map[string]string{}
	ids := map[int]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] || p.Title == "" || p.Type == "" || len(p.Targets) == 0 {
			t.Errorf("%s: panel %d %q: a duplicate id, or no title, type or targets", dashboardFile, p.ID, p.Title)
		}
		ids[p.ID] = true
		for _, q := range p.Targets {
			k := p.Title + " " + q.RefID
			if strings.TrimSpace(q.Expr) == "" || out[k] != "" {
				t.Errorf("%s: panel %q query %q: empty, or its refId twice", dashboardFile, p.Title, q.RefID)
			}
			out[k] = q.Expr
		}
	}
	return out
}

// exposed adds the metric names a /metrics text declares (HELP and TYPE
// lines: a family declared but with no series yet counts) or has samples
// of; a histogram's family adds its _bucket, _sum and _count.
func exposed(names map[string]bool, text string) {
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) >= 4 && f[0] == "#" && f[1] == "TYPE":
			names[f[2]] = true
			if f[3] == "histogram" || f[3] == "summary" {
				names[f[2]+"_sum"], names[f[2]+"_count"] = true, true
			}
			if f[3] == "histogram" {
				names[f[2]+"_bucket"] = true
			}
		case len(f) >= 3 && f[0] == "#" && f[1] == "HELP":
			names[f[2]] = true
		case len(f) >= 2 && f[0] != "#":
			name, _, _ := strings.Cut(f[0], "{")
			names[name] = true
		}
	}
}

// missingMetrics returns, sorted, "where: name" for each metric the
// expressions name that names lacks.
func missingMetrics(t *testing.T, exprs map[string]string, names map[string]bool) []string {
	t.Helper()
	var out []string
	for where, e := range exprs {
		got, err := promqlNames(e)
		if err != nil {
			t.Errorf("%s: %v", where, err)
		}
		for _, n := range got {
			if !names[n] {
				out = append(out, where+": "+n)
			}
		}
	}
	sort.Strings(out)
	return slices.Compact(out)
}

func scrapeText(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d %v", url, resp.StatusCode, err)
	}
	return string(b)
}

// throttlerMetrics is what an application embedding the throttler
// (httplimit, grpclimit) exports with package throttlemetrics: neither
// serve nor proxy runs a throttler.
func throttlerMetrics(t *testing.T) string {
	t.Helper()
	r := prometheus.NewRegistry()
	r.MustRegister(throttlemetrics.New(throttle.New(throttle.Config{Limit: 4}), nil))
	srv := httptest.NewServer(promhttp.HandlerFor(r, promhttp.HandlerOpts{}))
	defer srv.Close()
	return scrapeText(t, srv.URL)
}

const obsRules = `domain: obs
descriptors:
  - key: user
    detailed_metric: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: wb
    rate_limit: {unit: second, requests_per_unit: 100, tier: write_back, budget: 5%}
`

// Every metric the shipped dashboard and alert rules name exists: in the
// /metrics of a real floodgate serve (Redis store, capacity leases, a
// write-back rule) or floodgate proxy, or in the throttler's collector.
// The families that appear only after an event are made to appear first.
func TestObservabilityFilesNameRealMetrics(t *testing.T) {
	exprs := alertExprs(t)
	for k, v := range dashboardExprs(t) {
		exprs[k] = v
	}
	for _, want := range []string{"FloodgateStoreBreakerOpen", "FloodgateRefusalRatioJump", "FloodgateDegradedDecisions",
		"FloodgateReloadFailures", "FloodgateLeaseOverGrant", "FloodgateShedCritical"} {
		if exprs[want] == "" {
			t.Errorf("%s: no alert %s", alertsFile, want)
		}
	}

	rdb := redistest.Standalone(t)
	dir := t.TempDir()
	writeRules(t, dir, "obs.yaml", obsRules)
	res := filepath.Join(t.TempDir(), "resources.yaml")
	writeFile(t, res, resourcesFile(10, "2s", "1s"))
	s := startServer(t, "--rules", dir, "--data", t.TempDir(), "--resources", res,
		"--store", "redis://"+rdb.Addr+"?dial_timeout=5s")
	for range 2 { // ok, then over_limit and shadow_over_limit
		s.ask(t, "obs", desc("user", "u1"))
		s.ask(t, "obs", desc("shadow", "s1"))
		s.ask(t, "obs", desc("wb", "w1"))
	}
	writeRules(t, dir, "bad.yaml", "domain: [") // a refused reload
	c := newLeaseClient(t, "c1", "db", 4, s.grpc)
	c.refresh()
	metricsURL := "http://" + s.http + "/metrics"
	waitFor(t, "write-back, reload and lease metrics", func() bool {
		m := scrapeText(t, metricsURL)
		return strings.Contains(m, "floodgate_tier_overshoot_total{") &&
			strings.Contains(m, `floodgate_rule_reloads_total{result="refused"}`) &&
			strings.Contains(m, `floodgate_capacity_granted{resource="db"}`)
	})

	proxyDir := t.TempDir()
	writeRules(t, proxyDir, "edge.yaml", proxyRules)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer up.Close()
	p := startProxy(t, up.URL, proxyDir)
	proxyGet(t, "http://"+p.addrs["proxy"]+"/limited/x")

	names := map[string]bool{}
	exposed(names, scrapeText(t, metricsURL))
	exposed(names, scrapeText(t, "http://"+p.addrs["admin"]+"/metrics"))
	exposed(names, throttlerMetrics(t))
	if missing := missingMetrics(t, exprs, names); len(missing) > 0 {
		t.Errorf("metrics named in examples/observability that neither serve, proxy nor the throttler exposes:\n%s",
			strings.Join(missing, "\n"))
	}
	// and the check catches a name that does not exist
	if m := missingMetrics(t, map[string]string{"probe": `rate(floodgate_decision_total[5m])`}, names); len(m) != 1 {
		t.Errorf("a misspelt metric was not reported: %q", m)
	}
}

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// chromiumPath finds headless Chromium (findChromium): without one the
// test skips, or fails when FLOODGATE_REQUIRE_CHROMIUM=1 (CI).
func chromiumPath(t *testing.T) string {
	t.Helper()
	p, err := findChromium(os.Getenv, exec.LookPath)
	switch {
	case err == nil:
		return p
	case os.Getenv("FLOODGATE_REQUIRE_CHROMIUM") == "1":
		t.Fatalf("FLOODGATE_REQUIRE_CHROMIUM=1: %v", err)
	default:
		t.Skipf("the dashboard's browser tests: %v", err)
	}
	return ""
}

// findChromium is $FLOODGATE_CHROMIUM, or the first of chromium (Debian's
// package), chromium-browser, google-chrome found by look.
func findChromium(getenv func(string) string, look func(string) (string, error)) (string, error) {
	if p := getenv("FLOODGATE_CHROMIUM"); p != "" {
		if _, err := look(p); err != nil {
			return "", fmt.Errorf("FLOODGATE_CHROMIUM=%s: %w", p, err)
		}
		return p, nil
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := look(name); err == nil {
			return p, nil
		}
	}
	return "", errors.New("no chromium on the PATH (apt-get install chromium, or set FLOODGATE_CHROMIUM)")
}

// TestFindChromium: a missing browser is an error (which fails the test
// under FLOODGATE_REQUIRE_CHROMIUM=1), never a silent pass.
func TestFindChromium(t *testing.T) {
	none := func(string) (string, error) { return "", exec.ErrNotFound }
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	if _, err := findChromium(env(nil), none); err == nil {
		t.Error("no browser: no error")
	}
	if _, err := findChromium(env(map[string]string{"FLOODGATE_CHROMIUM": "/nonexistent/chromium"}), exec.LookPath); err == nil || !strings.Contains(err.Error(), "FLOODGATE_CHROMIUM") {
		t.Errorf("a FLOODGATE_CHROMIUM that is not there: %v", err)
	}
	only := func(name string) (string, error) {
		if name == "chromium-browser" {
			return "/usr/bin/chromium-browser", nil
		}
		return "", exec.ErrNotFound
	}
	if p, err := findChromium(env(nil), only); err != nil || p != "/usr/bin/chromium-browser" {
		t.Errorf("chromium-browser on the PATH: %q %v", p, err)
	}
}

// artifacts is where screenshots go: $FLOODGATE_ARTIFACTS, else a
// temporary directory of the test.
func artifacts(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("FLOODGATE_ARTIFACTS")
	if dir == "" {
		return t.TempDir()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// browser starts a headless Chromium for the test, closed at its end.
func browser(t *testing.T) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromiumPath(t)),
		chromedp.NoSandbox, // root in CI containers
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1400, 1300),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(actx)
	t.Cleanup(func() { cancelCtx(); cancelAlloc() })
	if err := chromedp.Do(ctx); err != nil { // starts it (no timeout on this first call: it would stop the browser)
		t.Fatalf("starting chromium: %v", err)
	}
	return ctx
}

// shoot saves a full-page screenshot as name.png in the artifacts.
func shoot(t *testing.T, ctx context.Context, dir, name string) {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Errorf("screenshot %s: %v", name, err)
		return
	}
	p := filepath.Join(dir, name+".png")
	if err := os.WriteFile(p, png, 0o644); err != nil {
		t.Error(err)
	}
	t.Logf("screenshot: %s", p)
}

// poll waits until the page's JavaScript expression is true.
func poll(t *testing.T, ctx context.Context, what, expr string) {
	t.Helper()
	var err error
	for try := 0; try < 5; try++ {
		// a poll that began as the page navigated (a form posted) fails at
		// once: begin again on the new page
		if _, err = chromedp.Run(ctx, chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingTimeout(60*time.Second))); err == nil || !strings.Contains(err.Error(), "(-32000)") { // navigated, or its context gone with the old page
			break
		}
	}
	if err != nil {
		page, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body ? document.body.innerText.slice(0, 2000) : ""`))
		t.Fatalf("%s: %v\npage:\n%s", what, err, page)
	}
}

// logIn submits the admin token on the login form shown at base, waits
// for the dashboard's first snapshot, then opens base again with the
// session cookie. The login form's post navigates the page behind
// chromedp's back, and the node ids chromedp holds can still be the old
// document's for a while ("No node with given id found"); a navigation of
// its own makes the DOM it queries the dashboard's.
func logIn(t *testing.T, ctx context.Context, base string) {
	t.Helper()
	if err := steps(ctx, chromedp.SendKeys(chromedp.CSS("#token"), strongToken), chromedp.Click(chromedp.CSS("#login"))); err != nil {
		t.Fatalf("logging in: %v", err)
	}
	poll(t, ctx, "the first snapshot", `document.body.dataset.ready === "1"`)
	if err := steps(ctx, chromedp.Navigate(base)); err != nil {
		t.Fatalf("opening the dashboard with the session: %v", err)
	}
	poll(t, ctx, "the first snapshot with the session", `document.body.dataset.ready === "1" && !document.getElementById("token")`)
}

// steps runs actions, each in at most a minute.
func steps(ctx context.Context, actions ...chromedp.Action[chromedp.Void]) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return chromedp.Do(ctx, actions...)
}

func eval[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

const dashRules = `domain: web
descriptors:
  - key: user
    rate_limit:
      unit: minute
      requests_per_unit: 5
  - key: ip
    rate_limit:
      name: per_ip
      unit: hour
      requests_per_unit: 1000
`

// load sends decisions to s over gRPC until stop is closed: the flooding
// key user=flooder over its limit, and light users under theirs.
func load(t *testing.T, s *server, stop <-chan struct{}) *sync.WaitGroup {
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			s.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "web", Descriptors: []*rlcommon.RateLimitDescriptor{desc("user", "flooder")}})
			s.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "web", Descriptors: []*rlcommon.RateLimitDescriptor{desc("ip", fmt.Sprint("10.0.0.", i%50))}})
			cancel()
		}
	})
	return &wg
}

// TestDashboardInBrowser loads the dashboard of a running `floodgate
// serve` under load in headless Chromium, logs in with the admin token,
// and checks each panel against the server: the charts hold non-zero
// series, the top keys show the flooding key, inspect and reset change
// the key's state (and the next real decision), an override set in the
// editor changes the next decision over gRPC, a bad override shows the
// server's error naming the field, and the rules show their file:line.
func TestDashboardInBrowser(t *testing.T) {
	ctx := browser(t)
	shots := artifacts(t)
	dir := t.TempDir()
	writeRules(t, dir, "web.yaml", dashRules)
	s := startServer(t, "--rules", dir, "--data", t.TempDir(), "--admin-token", strongToken)
	for range 30 { // over the limit: 25 refusals before the page opens
		s.ask(t, "web", desc("user", "flooder"))
	}
	stop := make(chan struct{})
	wg := load(t, s, stop)
	defer func() { close(stop); wg.Wait() }()

	base := "http://" + s.admin + "/dashboard/"
	// without a session: the login form
	if err := steps(ctx, chromedp.Navigate(base), chromedp.WaitVisible(chromedp.CSS("#token"))); err != nil {
		t.Fatalf("login form: %v", err)
	}
	// a wrong token is refused, and says so
	if err := steps(ctx, chromedp.SendKeys(chromedp.CSS("#token"), "wrong"), chromedp.Click(chromedp.CSS("#login")),
		chromedp.WaitVisible(chromedp.CSS("#login-error"))); err != nil {
		page, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`location.href + "\n" + document.documentElement.outerHTML.slice(0, 3000)`))
		t.Fatalf("wrong token: %v\n%s", err, page)
	}
	logIn(t, ctx, base)

	// charts: a uPlot per rule with non-zero series, drawn
	poll(t, ctx, "the chart of web.user with refusals and admissions",
		`window.floodgate.plotted().some(r => r.rule === "web.user" && r.sums.refused > 0 && r.sums.allowed > 0)`)
	poll(t, ctx, "per_ip's chart", `window.floodgate.plotted().some(r => r.rule === "per_ip" && r.sums.allowed > 0)`)
	drawn := eval[int](t, ctx, `(() => { const c = document.querySelector('#charts .chart[data-rule="web.user"] canvas');
		const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data; let n = 0;
		for (let i = 3; i < d.length; i += 4) if (d[i] !== 0) n++; return n; })()`)
	if drawn < 500 {
		t.Errorf("the web.user chart's canvas has %d drawn pixels: blank", drawn)
	}

	// top keys: the flooding key first under its rule
	poll(t, ctx, "user=flooder in the top keys",
		`[...document.querySelectorAll('#top-keys .rule-top[data-rule="web.user"] .top-key td.key')].map(e => e.textContent)[0] === "user=flooder"`)
	// rules: file:line, and the last load
	poll(t, ctx, "the rules panel", `document.querySelector("#rules-table").innerText.includes("web.yaml:4") && document.querySelector("#reload-result").innerText.includes("ok")`)
	poll(t, ctx, "the store's health", `document.querySelector("#health-list").innerText.includes("memory")`)
	shoot(t, ctx, shots, "dashboard")
	if path := os.Getenv("FLOODGATE_DOCS_SCREENSHOT"); path != "" {
		// docs/dashboard.png: 45 seconds of history on the chart
		if _, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](`window.floodgate.plotted().some(r => r.rule === "web.user" && r.points >= 45)`,
			chromedp.WithPollingTimeout(2*time.Minute))); err != nil {
			t.Fatal(err)
		}
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100)) // 100: PNG
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// inspect: the flooding key is out of requests; reset gives them back
	close(stop)
	wg.Wait()
	stop = make(chan struct{})
	wg = &sync.WaitGroup{}
	if err := steps(ctx, chromedp.SendKeys(chromedp.CSS("#inspect-domain"), "web"), chromedp.SendKeys(chromedp.CSS("#inspect-entries"), "user=flooder"),
		chromedp.Click(chromedp.CSS("#inspect-button"))); err != nil {
		t.Fatal(err)
	}
	poll(t, ctx, "inspect's state", `!!document.querySelector('#inspect-state td[data-field="remaining"]')`)
	if rem := eval[string](t, ctx, `document.querySelector('#inspect-state td[data-field="remaining"]').textContent`); rem != "0" {
		t.Errorf("inspected user=flooder: remaining %s, want 0", rem)
	}
	if resp := s.ask(t, "web", desc("user", "flooder")); resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("before the reset: %v", resp.OverallCode)
	}
	shoot(t, ctx, shots, "inspect")
	if err := steps(ctx, chromedp.Click(chromedp.CSS("#reset-button"))); err != nil {
		t.Fatal(err)
	}
	poll(t, ctx, "the state after reset", `document.querySelector("#inspect-result").innerText.includes("Reset") && document.querySelector('#inspect-state td[data-field="remaining"]').textContent === "5"`)
	if resp := s.ask(t, "web", desc("user", "flooder")); resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Errorf("after the reset in the page, the next decision: %v, want OK", resp.OverallCode)
	}
	shoot(t, ctx, shots, "reset")

	// overrides: a bad one shows the server's error naming the field
	set := func(key, limit, period string) {
		t.Helper()
		js := fmt.Sprintf(`(() => { for (const [id, v] of [["ovr-domain", "web"], ["ovr-key", %q], ["ovr-limit", %q], ["ovr-period", %q]]) document.getElementById(id).value = v;
			document.getElementById("ovr-message").textContent = ""; document.getElementById("ovr-set").click(); return true; })()`, key, limit, period)
		eval[bool](t, ctx, js)
	}
	set("user=vip", "1", "banana")
	poll(t, ctx, "the override's error", `document.querySelector("#ovr-message").className.includes("error") && document.querySelector("#ovr-message").textContent.includes("period")`)
	t.Logf("the editor's error: %s", eval[string](t, ctx, `document.querySelector("#ovr-message").textContent`))
	// user=vip: 5 a minute by the rule, 1 an hour by the override
	set("user=vip", "1", "1h")
	poll(t, ctx, "the override set", `document.querySelector("#ovr-message").textContent.startsWith("Set user=vip")`)
	poll(t, ctx, "the override listed", `!!document.querySelector('#ovr-table tr[data-key="user=vip"]')`)
	shoot(t, ctx, shots, "overrides")
	if resp := s.ask(t, "web", desc("user", "vip")); resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("vip's first request: %v", resp.OverallCode)
	}
	if resp := s.ask(t, "web", desc("user", "vip")); resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("vip's second request under the editor's override (1 an hour): %v, want OVER_LIMIT (the rule alone admits 5)", resp.OverallCode)
	}
	// delete it from the table
	eval[bool](t, ctx, `(() => { document.querySelector('#ovr-table tr[data-key="user=vip"] button.danger').click(); return true; })()`)
	poll(t, ctx, "the override deleted", `document.querySelector("#ovr-message").textContent.startsWith("Deleted") && !document.querySelector('#ovr-table tr[data-key="user=vip"]')`)
}

// pageLoad is what the browser's performance timing says of one load.
type pageLoad struct {
	DOMContentLoaded float64 `json:"dcl"`   // ms from the navigation's start
	Load             float64 `json:"load"`  // ms: the load event's end
	Ready            float64 `json:"ready"` // ms: the first snapshot drawn
	Bytes            int     `json:"bytes"` // bytes transferred: the page and its assets
	Requests         int     `json:"requests"`
}

// TestDashboardPageLoad measures the page from a cold binary: a fresh
// `floodgate serve`, a fresh browser profile (no cache), three times; it
// logs the times and checks the payload stays under 150 KB (what the page
// downloads does not depend on the host's load; its times do, so they are
// reported, not asserted). docs/BENCHMARKS.md quotes it, run with the
// binary built without -race:
//
//	FLOODGATE_TEST_NORACE=1 go test -count=1 -run TestDashboardPageLoad -v ./cmd/floodgate/
func TestDashboardPageLoad(t *testing.T) {
	chromiumPath(t)
	for round := range 3 {
		dir := t.TempDir()
		writeRules(t, dir, "web.yaml", dashRules)
		s := startServer(t, "--rules", dir, "--data", t.TempDir())
		ctx := browser(t)
		start := time.Now()
		if err := steps(ctx, chromedp.Navigate("http://"+s.admin+"/dashboard/")); err != nil {
			t.Fatal(err)
		}
		poll(t, ctx, "the first snapshot", `document.body.dataset.ready === "1"`)
		wall := time.Since(start)
		pl := eval[pageLoad](t, ctx, `(() => { const n = performance.getEntriesByType("navigation")[0];
			const rs = performance.getEntriesByType("resource").filter(r => !r.name.endsWith("/events"));
			return { dcl: n.domContentLoadedEventEnd, load: n.loadEventEnd, ready: window.floodgate.readyAt,
				bytes: n.transferSize + rs.reduce((a, r) => a + r.transferSize, 0), requests: 1 + rs.length }; })()`)
		t.Logf("round %d: DOMContentLoaded %.0f ms, load %.0f ms, first snapshot drawn %.0f ms (navigate to drawn, from Go: %v); %d requests, %d bytes",
			round, pl.DOMContentLoaded, pl.Load, pl.Ready, wall.Round(time.Millisecond), pl.Requests, pl.Bytes)
		if pl.Bytes > 150<<10 || pl.Bytes == 0 {
			t.Errorf("the page and its assets: %d bytes, want at most 150 KB", pl.Bytes)
		}
		s.stop(t)
	}
}

// TestProxyDashboardInBrowser: floodgate proxy's dashboard in Chromium,
// under load through the proxy: the route's chart and its flooding key
// show, and the throttler's shed chart (by criticality, nothing shed);
// the panels the proxy has no data for (key inspector, overrides, rules,
// and the store tiers of a memory store) are hidden.
func TestProxyDashboardInBrowser(t *testing.T) {
	ctx := browser(t)
	shots := artifacts(t)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer up.Close()
	dir := t.TempDir()
	writeRules(t, dir, "edge.yaml", proxyRules)
	p := startProxy(t, up.URL, dir, "--admin-token", strongToken, "--throttle-max-inflight", "1000")
	base := "http://" + p.addrs["proxy"]
	for range 10 {
		proxyGet(t, base+"/keyed/x", "X-API-Key", "flooder")
	}
	if err := steps(ctx, chromedp.Navigate("http://"+p.addrs["admin"]+"/dashboard/"), chromedp.WaitVisible(chromedp.CSS("#token"))); err != nil {
		t.Fatal(err)
	}
	logIn(t, ctx, "http://"+p.addrs["admin"]+"/dashboard/")
	poll(t, ctx, "per-key's chart with refusals", `window.floodgate.plotted().some(r => r.rule === "edge/per-key" && r.sums.refused === 7 && r.sums.allowed === 3)`)
	poll(t, ctx, "flooder in the top keys", `[...document.querySelectorAll('#top-keys .top-key td.key')].some(e => e.textContent === "flooder")`)
	poll(t, ctx, "the shed chart", `document.getElementById("tracks").offsetParent !== null && document.querySelector('#tracks [data-track="shed"] .uplot') !== null`)
	if got := eval[string](t, ctx, `JSON.stringify(window.floodgate.plottedTracks().map(t => [t.name, Object.keys(t.sums).join(" "), Object.values(t.sums).reduce((a, b) => a + b, 0)]))`); got != `[["shed","CRITICAL_PLUS CRITICAL SHEDDABLE_PLUS SHEDDABLE",0]]` {
		t.Errorf("the proxy's track charts: %s; want the shed chart alone, nothing shed", got)
	}
	for _, id := range []string{"inspector", "overrides", "rules", "latency-chart"} {
		if shown := eval[bool](t, ctx, `document.getElementById("`+id+`").offsetParent !== null`); shown {
			t.Errorf("panel %s shown on proxy, which has no data for it", id)
		}
	}
	if s := eval[string](t, ctx, `document.getElementById("server").textContent`); !strings.Contains(s, "proxy") {
		t.Errorf("server %q", s)
	}
	shoot(t, ctx, shots, "proxy")
}

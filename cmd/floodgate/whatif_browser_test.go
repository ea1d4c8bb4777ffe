package main

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// chromiumPath is Debian's headless-capable Chromium (.ci/run installs it).
const chromiumPath = "/usr/bin/chromium"

// newBrowser starts a headless Chromium for the test (closed when it
// ends) and returns a tab's context. Without Chromium the test is skipped,
// unless FLOODGATE_REQUIRE_CHROMIUM=1 (CI) makes that a failure.
func newBrowser(t *testing.T) context.Context {
	t.Helper()
	if _, err := os.Stat(chromiumPath); err != nil {
		if os.Getenv("FLOODGATE_REQUIRE_CHROMIUM") == "1" {
			t.Fatalf("no Chromium at %s", chromiumPath)
		}
		t.Skipf("no Chromium at %s", chromiumPath)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromiumPath),
		chromedp.NoSandbox, // root in a container has no user namespace for the sandbox
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 1600),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	if err := chromedp.Do(ctx); err != nil { // the browser started
		t.Fatalf("starting Chromium: %v", err)
	}
	return ctx
}

// browse runs actions in the tab, bounded so that a page that never shows
// what is awaited fails the test instead of hanging it (not a budget: a
// healthy run takes a few seconds).
func browse(t *testing.T, ctx context.Context, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// read runs one action that returns a value, bounded as browse's.
func read[T any](t *testing.T, ctx context.Context, what string, action chromedp.Action[T]) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	v, err := chromedp.Run(ctx, action)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return v
}

// The dashboard's what-if panel, in a real browser against a running
// serve driven through gRPC: the counts it shows are those of a replay
// computed here by hand, for the rules pasted and the live ones; a file
// with an error shows whatif.yaml:LINE.
func TestDashboardWhatIfPanel(t *testing.T) {
	const token = "whatif-dash-token-0123456789abcdef"
	ctx := newBrowser(t)
	dir := t.TempDir()
	writeRules(t, dir, "wi.yaml", whatIfLiveRules)
	s := startServer(t, "--rules", dir, "--admin-token", token)
	clearOfWindowEnd(t, 24*time.Hour, time.Minute) // every request in one day's window
	day := time.Now().Truncate(24 * time.Hour)
	traffic := genWhatIfTraffic(2, 90)
	sendWhatIfTraffic(t, s, traffic)
	if !time.Now().Truncate(24 * time.Hour).Equal(day) {
		t.Fatal("the traffic crossed a day's end") // clearOfWindowEnd left a minute
	}
	cand, candRefused := replayFixed(traffic, candidateRule)
	cur, curRefused := replayFixed(traffic, liveRule)

	base := "http://" + s.admin + "/dashboard/"
	browse(t, ctx, "logging in",
		chromedp.Navigate(base),
		chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), token),
		chromedp.Click(chromedp.ID("login")),
		chromedp.WaitVisible(chromedp.ID("whatif-run")),
	)
	run := func(n int, yaml string) {
		t.Helper()
		browse(t, ctx, "running a what-if",
			chromedp.SetValue(chromedp.ID("whatif-rules"), yaml),
			chromedp.Click(chromedp.ID("whatif-run")),
			chromedp.WaitReady(chromedp.CSS(`#whatif[data-runs="`+strconv.Itoa(n)+`"]`)),
		)
	}
	run(1, whatIfCandidateRules)
	// the panel's numbers, read from the page
	counts := func(table string, want map[string]ruleCounts, wantRefused int) {
		t.Helper()
		refused := read(t, ctx, "reading "+table, chromedp.Text(chromedp.CSS("#"+table+" .requests-refused")))
		if refused != strconv.Itoa(wantRefused) {
			t.Errorf("%s: %s requests refused, want %d", table, refused, wantRefused)
		}
		for name, w := range want {
			for k, wantN := range map[string]int64{"matched": w.Matched, "allowed": w.Allowed, "refused": w.Refused, "shadow_refused": w.ShadowRefused} {
				got := read(t, ctx, "reading "+name, chromedp.Text(chromedp.CSS(`#`+table+` tr[data-rule="`+name+`"] td[data-count="`+k+`"]`)))
				if got != strconv.FormatInt(wantN, 10) {
					t.Errorf("%s: %s %s = %s, want %d", table, name, k, got, wantN)
				}
			}
		}
	}
	counts("whatif-candidate", cand, candRefused)
	counts("whatif-current", cur, curRefused)
	browse(t, ctx, "scrolling", chromedp.ScrollIntoView(chromedp.ID("whatif")))
	shot := read(t, ctx, "a screenshot", chromedp.Screenshot(chromedp.ID("whatif")))
	if err := os.WriteFile(filepath.Join(t.ArtifactDir(), "whatif-panel.png"), shot, 0o644); err != nil {
		t.Error(err)
	}

	bad := strings.Replace(whatIfCandidateRules, "requests_per_unit: 2}", "requests_per_unit: two}", 1)
	run(2, bad)
	errText := read(t, ctx, "reading the errors", chromedp.Text(chromedp.CSS("#whatif-errors li")))
	if !strings.HasPrefix(errText, "whatif.yaml:8: ") {
		t.Errorf("the error shown: %q, want whatif.yaml:8: …", errText)
	}
	left := read(t, ctx, "the result cleared", chromedp.Evaluate[int](`document.querySelectorAll("#whatif-result table").length`))
	if left != 0 {
		t.Errorf("a failed run left %d result tables shown", left)
	}
}

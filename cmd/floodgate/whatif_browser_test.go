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

// readPage runs one action of the page that returns a value, in at most
// a minute (steps' bound: a page that never shows it fails, not hangs).
func readPage[T any](t *testing.T, ctx context.Context, what string, action chromedp.Action[T]) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
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
	ctx := browser(t)
	shots := artifacts(t)
	dir := t.TempDir()
	writeRules(t, dir, "wi.yaml", whatIfLiveRules)
	s := startServer(t, "--rules", dir, "--data", t.TempDir(), "--admin-token", strongToken)
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
	if err := steps(ctx, chromedp.Navigate(base), chromedp.WaitVisible(chromedp.CSS("#token"))); err != nil {
		t.Fatalf("the login form: %v", err)
	}
	logIn(t, ctx, base)
	poll(t, ctx, "the what-if panel", `!!document.getElementById("whatif-run") && document.getElementById("whatif").offsetParent !== null`)
	run := func(n int, yaml string) {
		t.Helper()
		var err error
		for try := 0; try < 5; try++ { // a stale node id fails before the click: setting and clicking again is safe (runs counts the answers)
			if err = steps(ctx, chromedp.SetValue(chromedp.ID("whatif-rules"), yaml), chromedp.Click(chromedp.ID("whatif-run"))); err == nil || !strings.Contains(err.Error(), "(-32000)") {
				break
			}
		}
		if err != nil {
			t.Fatalf("running a what-if: %v", err)
		}
		poll(t, ctx, "the what-if's answer", `document.getElementById("whatif").dataset.runs === "`+strconv.Itoa(n)+`"`)
	}
	run(1, whatIfCandidateRules)
	// the panel's numbers, read from the page
	counts := func(table string, want map[string]ruleCounts, wantRefused int) {
		t.Helper()
		refused := readPage(t, ctx, "reading "+table, chromedp.Text(chromedp.CSS("#"+table+" .requests-refused")))
		if refused != strconv.Itoa(wantRefused) {
			t.Errorf("%s: %s requests refused, want %d", table, refused, wantRefused)
		}
		for name, w := range want {
			for k, wantN := range map[string]int64{"matched": w.Matched, "allowed": w.Allowed, "refused": w.Refused, "shadow_refused": w.ShadowRefused} {
				got := readPage(t, ctx, "reading "+name, chromedp.Text(chromedp.CSS(`#`+table+` tr[data-rule="`+name+`"] td[data-count="`+k+`"]`)))
				if got != strconv.FormatInt(wantN, 10) {
					t.Errorf("%s: %s %s = %s, want %d", table, name, k, got, wantN)
				}
			}
		}
	}
	counts("whatif-candidate", cand, candRefused)
	counts("whatif-current", cur, curRefused)
	if err := steps(ctx, chromedp.ScrollIntoView(chromedp.ID("whatif"))); err != nil {
		t.Fatal(err)
	}
	shot := readPage(t, ctx, "a screenshot", chromedp.Screenshot(chromedp.ID("whatif")))
	if err := os.WriteFile(filepath.Join(shots, "whatif.png"), shot, 0o644); err != nil {
		t.Error(err)
	}

	bad := strings.Replace(whatIfCandidateRules, "requests_per_unit: 2}", "requests_per_unit: two}", 1)
	run(2, bad)
	errText := readPage(t, ctx, "reading the errors", chromedp.Text(chromedp.CSS("#whatif-errors li")))
	if !strings.HasPrefix(errText, "whatif.yaml:8: ") {
		t.Errorf("the error shown: %q, want whatif.yaml:8: …", errText)
	}
	left := readPage(t, ctx, "the result cleared", chromedp.Evaluate[int](`document.querySelectorAll("#whatif-result table").length`))
	if left != 0 {
		t.Errorf("a failed run left %d result tables shown", left)
	}
}

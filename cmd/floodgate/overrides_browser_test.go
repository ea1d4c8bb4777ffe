package main

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
)

// The dashboard's overrides search is the server's: over 250 overrides of
// a domain, the page lists the first 100 (no needle among them), and a
// search, in any case, finds the one whose note holds the needle, beyond
// the pages loaded, and only it; a search of ten keys shows those ten; one
// that matches nothing says so.
func TestDashboardOverridesSearchInBrowser(t *testing.T) {
	ctx := browser(t)
	dir := t.TempDir()
	writeRules(t, dir, "web.yaml", dashRules)
	s := startServer(t, "--rules", dir, "--data", t.TempDir(), "--admin-token", strongToken)
	var b strings.Builder
	b.WriteString(`{"overrides":[`)
	for i := range 250 {
		fmt.Fprintf(&b, `{"domain":"web","key":"user=u%03d","limit":5,"period":"1m"},`, i)
	}
	b.WriteString(`{"domain":"web","key":"user=zz","limit":500,"period":"1m","note":"the Needle account"}]}`)
	req, _ := http.NewRequest("PUT", "http://"+s.admin+"/v1/overrides", strings.NewReader(b.String()))
	req.Header.Set("Authorization", "Bearer "+strongToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("bulk put: %d %s", resp.StatusCode, body)
	}

	base := "http://" + s.admin + "/dashboard/"
	if err := steps(ctx, chromedp.Navigate(base), chromedp.WaitVisible(chromedp.CSS("#token"))); err != nil {
		t.Fatalf("the login form: %v", err)
	}
	logIn(t, ctx, base)
	listed := 0
	list := func(filter string) {
		t.Helper()
		listed++
		eval[bool](t, ctx, fmt.Sprintf(`(() => { document.getElementById("ovr-domain").value = "web"; document.getElementById("ovr-filter").value = %q;
			document.getElementById("ovr-list").click(); return true; })()`, filter))
		poll(t, ctx, "the listing", fmt.Sprintf(`document.getElementById("overrides").dataset.listed === "%d"`, listed))
	}
	rows := func() string {
		return eval[string](t, ctx, `[...document.querySelectorAll("#ovr-table tbody tr")].map((r) => r.dataset.key).join(" ")`)
	}
	list("")
	if got := strings.Fields(rows()); len(got) != 100 || got[0] != "user=u000" || strings.Contains(rows(), "user=zz") {
		t.Fatalf("the first page: %d rows %.80v", len(got), got)
	}
	list("NEEDLE")
	if got := rows(); got != "user=zz" {
		t.Errorf("search NEEDLE: rows %q, want user=zz alone (the server searched past the loaded page)", got)
	}
	list("u24")
	want := []string{}
	for i := 240; i < 250; i++ {
		want = append(want, fmt.Sprintf("user=u%d", i))
	}
	if got := rows(); got != strings.Join(want, " ") {
		t.Errorf("search u24: rows %q, want %q", got, strings.Join(want, " "))
	}
	if more := eval[bool](t, ctx, `document.getElementById("ovr-more").hidden`); !more {
		t.Error("a search that reached the end still offers More")
	}
	list("nothing-like-this")
	if got, msg := rows(), eval[string](t, ctx, `document.getElementById("ovr-message").textContent`); got != "" || !strings.Contains(msg, "No overrides matching nothing-like-this") {
		t.Errorf("a search of nothing: rows %q, message %q", got, msg)
	}
}

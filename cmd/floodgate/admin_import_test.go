package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// importFileOf writes body to name in a fresh directory and returns its path.
func importFileOf(t *testing.T, name, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// listKeys is the keys of domain api's overrides, in order.
func (s *server) listKeys(t *testing.T) []string {
	t.Helper()
	var list []struct{ Key string }
	out := s.mustCLI(t, "overrides", "list", "--domain", "api", "--json")
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("list --json: %v\n%s", err, out)
	}
	keys := []string{}
	for _, o := range list {
		keys = append(keys, o.Key)
	}
	return keys
}

// An import file with a bad line anywhere writes nothing: every bad line
// is named FILE:LINE and its field, checked locally (exit 2) or by the
// server against the live rules (exit 6).
func TestAdminCLIImportBadFileAppliesNothing(t *testing.T) {
	s := startAdminServer(t)
	good := `{"domain":"api","key":"user=a","limit":5,"period":"24h"}
{"domain":"api","key":"user=b","limit":6,"period":"24h"}
`
	local := importFileOf(t, "bad.jsonl", "# overrides\n"+good+
		`{"domain":"api","key":"user=c","limit":5,"period":"1x"}`+"\n\n"+
		`{"domain":"api","key":"user=a","limit":9,"period":"24h"}`+"\n"+
		`{"domain":"api","key":"user=d","limit":5,"period":"24h","brust":2}`+"\n")
	code, out, errs := s.adminCLI(t, "overrides", "import", local)
	for _, want := range []string{"nothing written", "bad.jsonl:4: period: ", `bad.jsonl:6: key: "user=a" of domain "api" is on line 2 too`, `bad.jsonl:7: not an override object: json: unknown field "brust"`} {
		if !strings.Contains(errs, want) {
			t.Errorf("stderr does not say %q:\n%s", want, errs)
		}
	}
	if code != exitUsage || out != "" {
		t.Errorf("a locally bad file: exit %d, stdout %q", code, out)
	}
	// every line good alone, but a burst cannot apply to ip's fixed window
	remote := importFileOf(t, "remote.jsonl", good+`{"domain":"api","key":"ip=10.0.0.1","limit":5,"period":"24h","burst":9}`+"\n")
	code, _, errs = s.adminCLI(t, "overrides", "import", remote)
	if code != exitRejected || !strings.Contains(errs, "remote.jsonl:3: burst: the server refused it") || !strings.Contains(errs, "nothing was written") {
		t.Errorf("a file the server refuses: exit %d\n%s", code, errs)
	}
	otherDomain := importFileOf(t, "dom.jsonl", good)
	if code, _, errs := s.adminCLI(t, "overrides", "import", otherDomain, "--domain", "web"); code != exitUsage || !strings.Contains(errs, `dom.jsonl:1: domain: "api", but --domain is "web"`) {
		t.Errorf("--domain against the lines': exit %d\n%s", code, errs)
	}
	if code, _, errs := s.adminCLI(t, "overrides", "import", importFileOf(t, "empty.jsonl", "# nothing\n\n")); code != exitUsage || !strings.Contains(errs, "no overrides") {
		t.Errorf("an empty file: exit %d\n%s", code, errs)
	}
	if keys := s.listKeys(t); len(keys) != 0 {
		t.Fatalf("refused imports wrote %v", keys)
	}
	// --dry-run checks the good file and writes nothing
	if out := s.mustCLI(t, "overrides", "import", otherDomain, "--dry-run"); !strings.Contains(out, "2 overrides checked, none written") {
		t.Fatalf("--dry-run: %s", out)
	}
	if keys := s.listKeys(t); len(keys) != 0 {
		t.Fatalf("a dry run wrote %v", keys)
	}
}

// export writes what import reads: a file exported from one server and
// imported into another gives the same overrides, times included; a line
// without a domain takes --domain's.
func TestAdminCLIExportImportRoundTrip(t *testing.T) {
	a := startAdminServer(t)
	var lines []string
	for i := range 1200 { // more than one page of the list (1,000)
		lines = append(lines, fmt.Sprintf(`{"key":"user=u%04d","limit":%d,"period":"1h","note":"n%d"}`, i, i+1, i))
	}
	lines = append(lines, `{"key":"user=tb","limit":5,"period":"1s","burst":20,"algorithm":"gcra","updated":"2021-05-06T07:08:09Z"}`)
	in := importFileOf(t, "in.jsonl", strings.Join(lines, "\n")+"\n")
	if out := a.mustCLI(t, "overrides", "import", in, "--domain", "api"); !strings.Contains(out, "1201 overrides written in 1 call") {
		t.Fatalf("import: %s", out)
	}
	exported := filepath.Join(t.TempDir(), "out.jsonl")
	a.mustCLI(t, "overrides", "export", "-o", exported)
	first, err := os.ReadFile(exported)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(first), "\n"); n != 1201 {
		t.Fatalf("export wrote %d lines, want 1201", n)
	}
	if !strings.Contains(string(first), `"updated":"2021-05-06T07:08:09Z"`) || !strings.Contains(string(first), `"algorithm":"gcra"`) {
		t.Fatalf("export lost a field:\n%.600s", first)
	}
	b := startAdminServer(t)
	b.mustCLI(t, "overrides", "import", exported)
	second := b.mustCLI(t, "overrides", "export")
	if second != string(first) {
		t.Fatalf("export | import | export changed the overrides:\n%.400s\nvs\n%.400s", first, second)
	}
}

// Over TLS: https with --ca (and a client certificate when the server
// requires one) works; plain http to the TLS listener, or https without
// the CA, fails with exit 5 and says what to do.
func TestAdminCLITLS(t *testing.T) {
	for _, k := range []string{"FLOODGATE_ADMIN_TOKEN", "FLOODGATE_ADMIN_URL", "FLOODGATE_ADMIN_TOKEN_FILE"} {
		t.Setenv(k, "")
		os.Unsetenv(k)
	}
	p, s, ccert, ckey := startMutualTLS(t)
	args := []string{"inspect", "--domain", "api", "user=alice"}
	if code, out, errs := cli(t, append(args, "--admin", "https://"+s.admin, "--ca", p.caPath, "--cert", ccert, "--key", ckey)...); code != 0 || !strings.Contains(out, "user=alice") {
		t.Fatalf("https with --ca and a client certificate: %d %s %s", code, out, errs)
	}
	// HOST:PORT with --ca means https
	if code, _, errs := cli(t, append(args, "--admin", s.admin, "--ca", p.caPath, "--cert", ccert, "--key", ckey)...); code != 0 {
		t.Fatalf("HOST:PORT with --ca: %d %s", code, errs)
	}
	if code, _, errs := cli(t, append(args, "--admin", "http://"+s.admin)...); code != exitUnreachable || !strings.Contains(errs, "https") {
		t.Errorf("http to the TLS listener: exit %d\n%s", code, errs)
	}
	if code, _, errs := cli(t, append(args, "--admin", "https://"+s.admin, "--cert", ccert, "--key", ckey)...); code != exitUnreachable || !strings.Contains(errs, "--ca") {
		t.Errorf("https without the CA: exit %d\n%s", code, errs)
	}
	if code, _, errs := cli(t, append(args, "--admin", "https://"+s.admin, "--ca", p.caPath)...); code != exitUnreachable || !strings.Contains(errs, "--cert FILE --key FILE") { // the error itself varies: the alert comes after the handshake
		t.Errorf("without the client certificate the server requires: exit %d\n%q", code, errs)
	}
	if code, _, errs := cli(t, append(args, "--admin", "http://"+s.admin, "--ca", p.caPath)...); code != exitUsage || !strings.Contains(errs, "use https://") {
		t.Errorf("http:// with --ca: exit %d\n%s", code, errs)
	}
}

// A file of more than one call (10,000 overrides a call) is checked whole
// on the server before any call writes: a line the server refuses in the
// second call leaves the first call's 10,000 unwritten too.
func TestAdminCLIImportManyCallsCheckedFirst(t *testing.T) {
	s := startAdminServer(t)
	var b strings.Builder
	for i := range 10_000 {
		fmt.Fprintf(&b, `{"domain":"api","key":"user=u%05d","limit":5,"period":"24h"}`+"\n", i)
	}
	b.WriteString(`{"domain":"api","key":"ip=10.0.0.1","limit":5,"period":"24h","burst":9}` + "\n")
	file := importFileOf(t, "big.jsonl", b.String())
	code, out, errs := s.adminCLI(t, "overrides", "import", file)
	if code != exitRejected || out != "" || !strings.Contains(errs, "big.jsonl:10001: burst: the server refused it") {
		t.Fatalf("exit %d\nstdout %q\nstderr %s", code, out, errs)
	}
	if keys := s.listKeys(t); len(keys) != 0 {
		t.Fatalf("a refused import wrote %d overrides", len(keys))
	}
}

// What import says when a call fails after others were written: the lines
// written, the failing call's, and the rest not written.
func TestImportPartialNote(t *testing.T) {
	lines := make([]importLine, 25_000)
	for i := range lines {
		lines[i].line = i + 3 // two comment lines first
	}
	got := partialNote("f.jsonl", lines, 10_000, 1, 3)
	for _, want := range []string{"written: f.jsonl lines 3 to 10002 (10000 overrides, calls 1 to 1)", "call 2 of 3 failed", "lines 10003 to 20002 may be part written", "after: not written", "run it again"} {
		if !strings.Contains(got, want) {
			t.Errorf("partialNote does not say %q:\n%s", want, got)
		}
	}
	if got := partialNote("f.jsonl", lines, 0, 0, 3); !strings.Contains(got, "call 1 of 3 failed") || !strings.Contains(got, "nothing else was written") {
		t.Errorf("a first call failing: %s", got)
	}
}

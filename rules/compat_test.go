package rules

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A file ending in "---" followed by nothing, or by comments and blank
// lines only (as Helm and concatenated files end), loads as
// envoyproxy/ratelimit loads it.
func TestTrailingEmptyDocument(t *testing.T) {
	const body = "domain: x\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 3}\n"
	for _, tail := range []string{
		"---\n",
		"---",
		"---\n\n\n",
		"---\n# Source: chart/templates/ratelimit.yaml\n\n",
		"--- # end\n",
		"---\n...\n",
		"---\n---\n",
	} {
		d, err := Parse("t.yaml", []byte(body+tail))
		if err != nil {
			t.Errorf("tail %q: %v", tail, err)
			continue
		}
		if d.Name != "x" || len(d.Limits()) != 1 || d.Limits()[0].RequestsPerUnit != 3 {
			t.Errorf("tail %q: domain %q, limits %v", tail, d.Name, d.Limits())
		}
	}
	// A second document with content is still refused (see
	// parseErrorTests), even after an empty one.
	if _, err := Parse("t.yaml", []byte(body+"---\n---\ndomain: y\n")); err == nil || !strings.Contains(err.Error(), "a second YAML document") {
		t.Errorf("a second document after an empty one: %v", err)
	}
}

// unit: "" with unlimited: true is no unit, as envoyproxy/ratelimit takes
// it; an unknown unit with unlimited stays an error (parseErrorTests).
func TestUnlimitedEmptyUnit(t *testing.T) {
	c := mustConfig(t, `domain: x
descriptors:
  - key: a
    rate_limit: {unlimited: true, unit: ""}
  - key: b
    rate_limit:
      unlimited: true
      unit: ""
      requests_per_unit: 7
`)
	for _, k := range []string{"a", "b"} {
		m := c.Match("x", es(k, "v"))
		if m == nil || !m.Limit.Unlimited {
			t.Errorf("%s: %+v, want an unlimited limit", k, m)
		}
	}
}

// List names the entries it skips that look meant to be read, and not the
// hidden ones nor editors' files.
func TestListSkipped(t *testing.T) {
	dir := t.TempDir()
	write := func(name string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte("domain: "+strings.ReplaceAll(name, "/", "-")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	mkdir := func(name string) {
		t.Helper()
		if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write("a.yaml")
	write("b.yml")
	write("rules.conf")
	write("noext")
	write(".hidden.yaml")
	write(".hidden")
	write("a.yaml~")
	write("a.yaml.swp")
	mkdir("team")
	write("team/sub.yaml")
	mkdir("dir.yaml")
	mkdir("..2026_01_02_03_04_05.123")
	mkdir(".git")
	if err := os.Symlink("..2026_01_02_03_04_05.123", filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("team", filepath.Join(dir, "teamlink")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("rules.conf", filepath.Join(dir, "conflink")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("nowhere", filepath.Join(dir, "dangling")); err != nil {
		t.Fatal(err)
	}
	files, skipped, err := List(dir)
	if err != nil {
		t.Fatal(err)
	}
	rel := func(ps []string) string {
		var out []string
		for _, p := range ps {
			out = append(out, strings.TrimPrefix(p, dir+string(filepath.Separator)))
		}
		return strings.Join(out, " ")
	}
	sep := string(filepath.Separator)
	if got, want := rel(files), "a.yaml b.yml"; got != want {
		t.Errorf("files %q, want %q", got, want)
	}
	if got, want := rel(skipped), "conflink dir.yaml"+sep+" noext rules.conf team"+sep+" teamlink"+sep; got != want {
		t.Errorf("skipped %q, want %q", got, want)
	}
	if f, err := Files(dir); err != nil || rel(f) != rel(files) {
		t.Errorf("Files: %v %v", f, err)
	}
	if _, _, err := List(filepath.Join(dir, "missing")); err == nil {
		t.Error("a missing directory listed")
	}
}

// Plain tags given explicitly (!!str, !!int, the non-specific !) read as
// their untagged values would.
func TestPlainTagsAreRead(t *testing.T) {
	d, err := Parse("tags.yaml", []byte("domain: !!str d\ndescriptors:\n  - key: ! k\n    rate_limit: {unit: !!str second, requests_per_unit: !!int 5}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if d.Name != "d" {
		t.Fatalf("domain %q", d.Name)
	}
}

// The bounds of http routes are refused where they are written, with
// their line: one route more than MaxRoutes in a file, a route key of 9
// parts (which a gate cannot take). (Before, validate said ok and the
// proxy refused the reload with no line.)
func TestRouteBoundsAreRulesErrors(t *testing.T) {
	var b strings.Builder
	b.WriteString("domain: edge\nhttp:\n")
	for i := range MaxRoutes + 1 {
		fmt.Fprintf(&b, "  - name: r%d\n    key: [remote_address]\n    rate_limit: {unit: minute, requests_per_unit: 5}\n", i)
	}
	_, err := Parse("edge.yaml", []byte(b.String()))
	if want := fmt.Sprintf("edge.yaml:%d: http[%d]: more than %d http routes", 3+3*MaxRoutes, MaxRoutes, MaxRoutes); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("%d routes: %v, want %q", MaxRoutes+1, err, want)
	}
	parts := make([]string, MaxRouteParts+1)
	for i := range parts {
		parts[i] = fmt.Sprintf("{header: X-H%d, entry: h%d}", i, i)
	}
	src := "domain: edge\nhttp:\n  - name: wide\n    key: [" + strings.Join(parts, ", ") + "]\n    rate_limit: {unit: minute, requests_per_unit: 5}\n"
	_, err = Parse("edge.yaml", []byte(src))
	if want := fmt.Sprintf("edge.yaml:4: http[0].key: %d entries; a route's key has at most %d", MaxRouteParts+1, MaxRouteParts); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("a key of %d parts: %v, want %q", MaxRouteParts+1, err, want)
	}
}

package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// skipWarnings counts the log lines warning that entry, a name in the
// directory (a subdirectory's ending in a separator), is not loaded.
func (tl *testLoader) skipWarnings(entry string) int {
	n := 0
	for _, line := range strings.Split(tl.logs.String(), "\n") {
		if strings.Contains(line, "level=WARN") && strings.Contains(line, "not loaded") &&
			strings.HasSuffix(line, " entry="+tl.dir+string(filepath.Separator)+entry) {
			n++
		}
	}
	return n
}

// Entries envoyproxy/ratelimit would read and the loader does not (a
// subdirectory, another extension, no extension) are warned of, each once
// when it appears, not at every poll; hidden entries (a ConfigMap's
// ..data) and editors' files are not.
func TestRuleLoaderWarnsOfSkippedEntries(t *testing.T) {
	tl := newTestLoader(t)
	tl.write("a.yaml", domainRules("d1", 5))
	tl.write("rules.conf", domainRules("d2", 5))
	tl.write("noext", domainRules("d3", 5))
	tl.write(".hidden.conf", domainRules("d4", 5))
	tl.write("a.yaml~", domainRules("d1", 1))
	tl.write("a.yaml.swp", "")
	for _, d := range []string{"team", "..2026_01_02_03_04_05.1", ".git"} {
		if err := os.Mkdir(filepath.Join(tl.dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	writeRules(t, filepath.Join(tl.dir, "team"), "sub.yaml", domainRules("d5", 5))
	if err := os.Symlink("..2026_01_02_03_04_05.1", filepath.Join(tl.dir, "..data")); err != nil {
		t.Fatal(err)
	}
	tl.load()
	tl.wantLimit("d1", 5, "a.yaml")
	want := func(entry string, n int) {
		t.Helper()
		if got := tl.skipWarnings(entry); got != n {
			t.Fatalf("%d warnings that %s is not loaded, want %d\n%s", got, entry, n, tl.logs.String())
		}
	}
	check := func(more int) {
		t.Helper()
		want("rules.conf", 1)
		want("noext", 1)
		want("team"+string(filepath.Separator), 1)
		want("more.conf", more)
		for _, quiet := range []string{".hidden.conf", "a.yaml~", "a.yaml.swp", "..data", "..2026_01_02_03_04_05.1", ".git", "team/sub.yaml"} {
			if strings.Contains(tl.logs.String(), quiet) {
				t.Fatalf("%s is named in the log:\n%s", quiet, tl.logs.String())
			}
		}
	}
	check(0)
	tl.poll(5)
	tl.reload(true)
	check(0)

	// A new skipped entry is warned of once; the others not again.
	tl.write("more.conf", domainRules("d6", 5))
	tl.poll(5)
	check(1)
	// Skipped entries are no part of the rules: editing one reloads nothing.
	tl.write("rules.conf", domainRules("d2", 6))
	tl.poll(3)
	check(1)
	if ok, refused := tl.reloads("ok"), tl.reloads("refused"); ok != 2 || refused != 0 {
		t.Fatalf("%v ok and %v refused reloads, want 2 (start and SIGHUP) and 0\n%s", ok, refused, tl.logs.String())
	}
}

// A rules directory deleted or renamed is refused once per change of
// state, as a refused file is, not at every poll; the previous rules stay
// live, and the loader recovers when the directory comes back.
func TestRuleLoaderMissingDirRefusedOnce(t *testing.T) {
	tl := newTestLoader(t)
	tl.write("a.yaml", domainRules("d1", 5))
	tl.load()
	missing := func() int { return strings.Count(tl.logs.String(), "no such file or directory") }
	wantState := func(refused float64, lines int) {
		t.Helper()
		if got, l := tl.reloads("refused"), missing(); got != refused || l != lines {
			t.Fatalf("%v refused reloads and %d log lines about the missing directory, want %v and %d\n%s", got, l, refused, lines, tl.logs.String())
		}
	}

	// Renamed away: refused once.
	moved := tl.dir + ".moved"
	if err := os.Rename(tl.dir, moved); err != nil {
		t.Fatal(err)
	}
	tl.poll(5)
	wantState(1, 1)
	tl.wantLimit("d1", 5, "a.yaml")
	tl.reload(true) // SIGHUP reads again, and refuses again
	wantState(2, 2)
	tl.poll(5)
	wantState(2, 2)

	// Back: loaded at the next poll, and edits apply again.
	if err := os.Rename(moved, tl.dir); err != nil {
		t.Fatal(err)
	}
	tl.poll(1)
	if ok := tl.reloads("ok"); ok != 2 {
		t.Fatalf("%v ok reloads once the directory is back, want 2\n%s", ok, tl.logs.String())
	}
	tl.write("a.yaml", domainRules("d1", 6))
	tl.poll(1)
	tl.wantLimit("d1", 6, "a.yaml")

	// Deleted: refused once more, then recovered when recreated.
	if err := os.RemoveAll(tl.dir); err != nil {
		t.Fatal(err)
	}
	tl.poll(5)
	wantState(3, 3)
	tl.wantLimit("d1", 6, "a.yaml")
	if err := os.Mkdir(tl.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	tl.write("a.yaml", domainRules("d1", 8))
	tl.poll(5)
	tl.wantLimit("d1", 8, "a.yaml")
	wantState(3, 3)
}

// floodgate validate DIR notes the entries serve skips, as serve warns of
// them, and not the hidden ones nor editors' files.
func TestValidateNotesSkippedEntries(t *testing.T) {
	dir := t.TempDir()
	writeRules(t, dir, "a.yaml", domainRules("d1", 5))
	writeRules(t, dir, "rules.conf", domainRules("d2", 5))
	writeRules(t, dir, ".hidden.conf", domainRules("d3", 5))
	writeRules(t, dir, "a.yaml~", domainRules("d1", 1))
	if err := os.Mkdir(filepath.Join(dir, "team"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeRules(t, filepath.Join(dir, "team"), "sub.yaml", domainRules("d4", 5))
	var out, errb bytes.Buffer
	if code := run([]string{"validate", dir}, &out, &errb); code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out.String(), errb.String())
	}
	for _, want := range []string{"skip  " + filepath.Join(dir, "rules.conf") + "\n", "skip  " + filepath.Join(dir, "team") + string(filepath.Separator) + "\n", "not loaded"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	for _, quiet := range []string{".hidden.conf", "a.yaml~", "sub.yaml"} {
		if strings.Contains(out.String()+errb.String(), quiet) {
			t.Errorf("output names %s:\n%s%s", quiet, out.String(), errb.String())
		}
	}
}

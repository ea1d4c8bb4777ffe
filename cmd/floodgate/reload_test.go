package main

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/floodgate/floodgate/rules"
	"github.com/floodgate/floodgate/service"
)

// domainRules is a rules file for domain with one limit of n an hour.
func domainRules(domain string, n int) string {
	return fmt.Sprintf("domain: %s\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: hour\n      requests_per_unit: %d\n", domain, n)
}

// testLoader is a ruleLoader over a temporary directory, as runServe
// builds it, with what it logs and the configuration it last put live.
type testLoader struct {
	*ruleLoader
	t     *testing.T
	logs  *syncBuffer
	live  *rules.Config
	mtime time.Time
}

// newTestLoader returns a loader over an empty temporary directory; call
// write to fill it, then load.
func newTestLoader(t *testing.T) *testLoader {
	tl := &testLoader{t: t, logs: &syncBuffer{}, mtime: time.Now().Add(-time.Hour)}
	tl.ruleLoader = &ruleLoader{dir: t.TempDir(), log: slog.New(slog.NewTextHandler(tl.logs, nil)),
		metrics: service.NewMetrics(), files: map[string]*rules.Domain{},
		onLoad: func(cfg *rules.Config) error { tl.live = cfg; return nil }}
	return tl
}

// write writes a rules file, giving it a modification time of its own so
// that an edit keeping the file's size shows in the loader's signature
// however coarse the file system's clock.
func (tl *testLoader) write(name, body string) {
	tl.t.Helper()
	writeRules(tl.t, tl.dir, name, body)
	tl.mtime = tl.mtime.Add(time.Second)
	if err := os.Chtimes(filepath.Join(tl.dir, name), tl.mtime, tl.mtime); err != nil {
		tl.t.Fatal(err)
	}
}

// load is the load at startup, which must succeed.
func (tl *testLoader) load() {
	tl.t.Helper()
	cfg, err := tl.ruleLoader.load()
	if err != nil {
		tl.t.Fatalf("load: %v\n%s", err, tl.logs.String())
	}
	tl.live = cfg
}

// poll runs the reload of the --reload-interval ticker n times.
func (tl *testLoader) poll(n int) {
	for range n {
		tl.reload(false)
	}
}

// limit returns the live limit of domain and the file it comes from.
func (tl *testLoader) limit(domain string) (int64, string) {
	tl.t.Helper()
	d := tl.live.Domain(domain)
	if d == nil {
		tl.t.Fatalf("domain %s is not live\n%s", domain, tl.logs.String())
	}
	return d.Limits()[0].Policy.Rules()[0].Limit, filepath.Base(d.File)
}

// wantLimit fails unless domain's live limit is n, from file.
func (tl *testLoader) wantLimit(domain string, n int64, file string) {
	tl.t.Helper()
	if got, from := tl.limit(domain); got != n || from != file {
		tl.t.Fatalf("domain %s: limit %d from %s, want %d from %s\n%s", domain, got, from, n, file, tl.logs.String())
	}
}

// reloads returns floodgate_rule_reloads_total{result=result}.
func (tl *testLoader) reloads(result string) float64 {
	tl.t.Helper()
	mfs, err := tl.metrics.Registry.Gather()
	if err != nil {
		tl.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "floodgate_rule_reloads_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "result" && lp.GetValue() == result {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// refusals counts the log lines refusing file.
func (tl *testLoader) refusals(file string) int {
	n := 0
	for _, line := range strings.Split(tl.logs.String(), "\n") {
		if strings.Contains(line, "refused") && strings.Contains(line, file) {
			n++
		}
	}
	return n
}

// wantRefused fails unless the refused reloads number n and the log
// refused file n times.
func (tl *testLoader) wantRefused(file string, n int) {
	tl.t.Helper()
	if got, lines := tl.reloads("refused"), tl.refusals(file); got != float64(n) || lines != n {
		tl.t.Fatalf("%v refused reloads and %d log lines refusing %s, want %d of each\n%s", got, lines, file, n, tl.logs.String())
	}
}

// A second file declaring a domain is refused alone, once per change: the
// other files' edits still apply, and polls without changes retry nothing.
func TestRuleLoaderDuplicateDomainRefusedAlone(t *testing.T) {
	tl := newTestLoader(t)
	tl.write("a.yaml", domainRules("d1", 5))
	tl.write("b.yaml", domainRules("d2", 7))
	tl.load()

	tl.write("c.yaml", domainRules("d1", 3))
	tl.poll(1)
	tl.wantLimit("d1", 5, "a.yaml")
	tl.wantLimit("d2", 7, "b.yaml")
	tl.wantRefused("c.yaml", 1)
	if logs := tl.logs.String(); !strings.Contains(logs, "a.yaml") || !strings.Contains(logs, "domain=d1") {
		t.Fatalf("the refusal does not name the earlier file and the domain:\n%s", logs)
	}
	tl.poll(5)
	tl.wantRefused("c.yaml", 1)

	// An edit to another file applies, c.yaml still being there; that
	// reload refuses c.yaml again (once) as any reload with a refused file.
	tl.write("b.yaml", domainRules("d2", 9))
	tl.poll(1)
	tl.wantLimit("d2", 9, "b.yaml")
	tl.wantLimit("d1", 5, "a.yaml")
	tl.wantRefused("c.yaml", 2)
	tl.poll(5)
	tl.wantRefused("c.yaml", 2)
	if ok := tl.reloads("ok"); ok != 1 {
		t.Fatalf("%v ok reloads, want the one at startup", ok)
	}

	// SIGHUP forces a reload: refused again, once.
	tl.reload(true)
	tl.wantRefused("c.yaml", 3)

	// Once c.yaml goes, everything loads.
	if err := os.Remove(filepath.Join(tl.dir, "c.yaml")); err != nil {
		t.Fatal(err)
	}
	tl.poll(1)
	if ok := tl.reloads("ok"); ok != 2 {
		t.Fatalf("%v ok reloads after removing the duplicate, want 2\n%s", ok, tl.logs.String())
	}
}

// A file that held a domain of its own and is edited to declare another
// file's domain is refused, and its previous rules stay live.
func TestRuleLoaderDuplicateDomainKeepsPreviousVersion(t *testing.T) {
	tl := newTestLoader(t)
	tl.write("a.yaml", domainRules("d1", 5))
	tl.write("c.yaml", domainRules("d3", 4))
	tl.load()
	tl.write("c.yaml", domainRules("d1", 3))
	tl.poll(3)
	tl.wantLimit("d1", 5, "a.yaml")
	tl.wantLimit("d3", 4, "c.yaml")
	tl.wantRefused("c.yaml", 1)
}

// At startup a duplicate domain is an error naming both files.
func TestRuleLoaderDuplicateDomainAtStartup(t *testing.T) {
	tl := newTestLoader(t)
	tl.write("a.yaml", domainRules("d1", 5))
	tl.write("c.yaml", domainRules("d1", 3))
	if _, err := tl.ruleLoader.load(); err == nil {
		t.Fatal("a duplicate domain at startup loaded")
	}
	if logs := tl.logs.String(); !strings.Contains(logs, "a.yaml") || !strings.Contains(logs, "c.yaml") || !strings.Contains(logs, "d1") {
		t.Fatalf("the error does not name both files and the domain:\n%s", logs)
	}
}

// A file change alone, without SIGHUP, reloads at the next poll, even an
// edit that keeps the file's size; no change, no reload.
func TestRuleLoaderReloadsOnFileChange(t *testing.T) {
	tl := newTestLoader(t)
	tl.write("a.yaml", domainRules("d1", 5))
	tl.load()
	tl.poll(3)
	if ok := tl.reloads("ok"); ok != 1 {
		t.Fatalf("%v ok reloads without a change, want the one at startup", ok)
	}
	tl.write("a.yaml", domainRules("d1", 6))
	tl.poll(1)
	tl.wantLimit("d1", 6, "a.yaml")
	if ok := tl.reloads("ok"); ok != 2 {
		t.Fatalf("%v ok reloads, want 2", ok)
	}
}

// `floodgate serve` with a duplicate domain in its directory: the
// duplicate is refused, and an edit to another file applies at the next
// poll, without SIGHUP.
func TestServeDuplicateDomainRefusedAlone(t *testing.T) {
	dir := t.TempDir()
	writeRules(t, dir, "a.yaml", domainRules("d1", 5))
	writeRules(t, dir, "b.yaml", domainRules("d2", 7))
	s := startServer(t, "--rules", dir, "--data", t.TempDir())
	limit := func(domain string) uint32 {
		r := s.ask(t, domain, desc("user", "x"))
		if r.OverallCode == rlsv3.RateLimitResponse_UNKNOWN || len(r.Statuses) == 0 {
			t.Fatalf("%s: %v", domain, r)
		}
		return r.Statuses[0].CurrentLimit.GetRequestsPerUnit()
	}
	writeRules(t, dir, "c.yaml", domainRules("d1", 3))
	waitFor(t, "c.yaml refused", func() bool {
		return strings.Contains(s.logs(), "is already defined in") && strings.Contains(s.logs(), "c.yaml")
	})
	writeRules(t, dir, "b.yaml", domainRules("d2", 19)) // seen by the poll: no SIGHUP
	waitFor(t, "the new limit", func() bool { return limit("d2") == 19 })
	if n := limit("d1"); n != 5 {
		t.Fatalf("d1: limit %d, want a.yaml's 5", n)
	}
	// One refused reload for adding c.yaml, one for editing b.yaml.
	if n := metricValue(t, s.http, `floodgate_rule_reloads_total{result="refused"}`); n != 2 {
		t.Fatalf("refused reloads %v, want 2\nlogs:\n%s", n, s.logs())
	}
}

// A configuration its consumer refuses (the proxy's gate, through onLoad)
// counts as a refused reload, and the loader keeps the files that are
// live: the same files read again are refused again, not taken as loaded.
func TestRuleLoaderConsumerRefusal(t *testing.T) {
	tl := newTestLoader(t)
	tl.write("a.yaml", domainRules("d1", 7))
	tl.load()
	accept := tl.onLoad
	tl.onLoad = func(cfg *rules.Config) error {
		if d := cfg.Domain("d1"); d != nil && d.Limits()[0].RequestsPerUnit == 9 {
			return fmt.Errorf("the gate cannot take 9")
		}
		return accept(cfg)
	}
	tl.write("a.yaml", domainRules("d1", 9))
	tl.poll(3)
	tl.wantLimit("d1", 7, "a.yaml")
	if got := tl.reloads("refused"); got != 1 {
		t.Fatalf("refused reloads %v, want 1", got)
	}
	if got := tl.reloads("ok"); got != 1 {
		t.Fatalf("ok reloads %v, want 1 (the load at start)", got)
	}
	tl.reload(true) // SIGHUP: the same files, refused again
	tl.wantLimit("d1", 7, "a.yaml")
	if got := tl.reloads("refused"); got != 2 {
		t.Fatalf("refused reloads after SIGHUP %v, want 2", got)
	}
}

// An edit that keeps the file's size and its modification time (two
// writes within one tick of the file system's clock) is still seen.
func TestRuleLoaderSeesSameSizeEdit(t *testing.T) {
	tl := newTestLoader(t)
	tl.write("a.yaml", domainRules("d1", 7))
	tl.load()
	p := filepath.Join(tl.dir, "a.yaml")
	st, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	writeRules(t, tl.dir, "a.yaml", domainRules("d1", 9))
	if err := os.Chtimes(p, st.ModTime(), st.ModTime()); err != nil {
		t.Fatal(err)
	}
	if st2, _ := os.Stat(p); st2.Size() != st.Size() || !st2.ModTime().Equal(st.ModTime()) {
		t.Fatalf("the edit changed size or time: %v %v", st, st2)
	}
	tl.poll(1)
	tl.wantLimit("d1", 9, "a.yaml")
}

// A Kubernetes ConfigMap volume: each file is a symbolic link through
// ..data, and an update swaps ..data to a new directory, leaving the links
// as they were. The loader follows the links and sees the new rules.
func TestRuleLoaderFollowsConfigMapSwap(t *testing.T) {
	tl := newTestLoader(t)
	version := func(name string, n int) {
		if err := os.Mkdir(filepath.Join(tl.dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		writeRules(t, filepath.Join(tl.dir, name), "a.yaml", domainRules("d1", n))
	}
	swap := func(to string) { // as the kubelet does: a new link renamed over ..data
		tmp := filepath.Join(tl.dir, "..data_tmp")
		if err := os.Symlink(to, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(tl.dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	version("..v1", 7)
	swap("..v1")
	if err := os.Symlink(filepath.Join("..data", "a.yaml"), filepath.Join(tl.dir, "a.yaml")); err != nil {
		t.Fatal(err)
	}
	tl.load()
	tl.wantLimit("d1", 7, "a.yaml")
	version("..v2", 9)
	swap("..v2")
	tl.poll(1)
	tl.wantLimit("d1", 9, "a.yaml")
}

// A new file declaring a live domain is refused even when it sorts before
// the file that holds the domain (an editor's copy, say): the live rules
// stay, and the log names the new file as the one refused.
func TestRuleLoaderNewFileNeverTakesLiveDomain(t *testing.T) {
	tl := newTestLoader(t)
	tl.write("m.yaml", domainRules("d1", 100))
	tl.load()
	tl.write("a.yaml", domainRules("d1", 1))
	tl.poll(1)
	tl.wantLimit("d1", 100, "m.yaml")
	tl.wantRefused("a.yaml", 1)
	if tl.refusals("m.yaml") != 1 { // the one line refusing a.yaml names m.yaml as the holder
		t.Fatalf("the refusal does not name the holder m.yaml:\n%s", tl.logs.String())
	}
	// The holder's edits still apply.
	tl.write("m.yaml", domainRules("d1", 50))
	tl.poll(1)
	tl.wantLimit("d1", 50, "m.yaml")
	// Once the holder gives the domain up, the other file gets it.
	tl.write("m.yaml", domainRules("d2", 50))
	tl.poll(1)
	tl.wantLimit("d1", 1, "a.yaml")
	tl.wantLimit("d2", 50, "m.yaml")
}

// Hidden files (an editor's backup) are not rules files: not loaded, and
// not a domain's rival.
func TestRuleLoaderSkipsHiddenFiles(t *testing.T) {
	tl := newTestLoader(t)
	tl.write("m.yaml", domainRules("d1", 100))
	tl.write(".m.yaml", domainRules("d1", 1))
	tl.write(".other.yaml", "not: [valid")
	tl.load()
	tl.wantLimit("d1", 100, "m.yaml")
	if n := tl.reloads("refused"); n != 0 {
		t.Fatalf("%v refused reloads, want 0\n%s", n, tl.logs.String())
	}
}

// Entries that are no regular file are refused unread: a FIFO would block
// the read (and with it every reload and signal), /dev/zero would fill the
// memory, a file over the size limit is not read either. The other files
// load and reload as usual.
func TestRuleLoaderRefusesIrregularFilesUnread(t *testing.T) {
	tl := newTestLoader(t)
	tl.write("a.yaml", domainRules("d1", 5))
	tl.load()
	if err := syscall.Mkfifo(filepath.Join(tl.dir, "fifo.yaml"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/dev/zero", filepath.Join(tl.dir, "zero.yaml")); err != nil {
		t.Fatal(err)
	}
	big, err := os.Create(filepath.Join(tl.dir, "big.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := big.Truncate(1 << 40); err != nil { // sparse: a terabyte that takes no disk
		t.Fatal(err)
	}
	big.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		tl.poll(1)
		tl.write("a.yaml", domainRules("d1", 6))
		tl.reload(true)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("a reload is blocked by the rules directory's FIFO")
	}
	tl.wantLimit("d1", 6, "a.yaml")
	for _, f := range []string{"fifo.yaml", "zero.yaml", "big.yaml"} {
		if tl.refusals(f) == 0 {
			t.Errorf("%s was not refused:\n%s", f, tl.logs.String())
		}
	}
}

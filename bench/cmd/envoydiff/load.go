package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

// loadCase is a set of envoyproxy/ratelimit's test configuration files
// loaded together.
type loadCase struct {
	files []string
	known string // why the verdicts differ by design, if they do
}

// loadCases are each YAML file of test/config alone, and the two files
// of one domain together (refused by both: MERGE_DOMAIN_CONFIG is off).
func (r *runner) loadCases() ([]loadCase, error) {
	names, err := filepath.Glob(filepath.Join(r.src, testConfig, "*.yaml"))
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	var cases []loadCase
	for _, n := range names {
		cases = append(cases, loadCase{files: []string{testConfig + filepath.Base(n)}, known: knownLoad[filepath.Base(n)]})
	}
	cases = append(cases, loadCase{files: []string{testConfig + "merge_domain_key1.yaml", testConfig + "merge_domain_key2.yaml"}})
	return cases, nil
}

// knownLoad: files whose verdicts differ by design.
var knownLoad = map[string]string{}

// compareLoads loads each case with envoyproxy/ratelimit's config_check_cmd
// and with `floodgate validate` and compares the verdicts.
func (r *runner) compareLoads(check, work string) error {
	cases, err := r.loadCases()
	if err != nil {
		return err
	}
	r.printf("## Loading test/config files (config_check_cmd vs floodgate validate)\n\n")
	for i, c := range cases {
		dir := filepath.Join(work, "load", strings.TrimSuffix(filepath.Base(c.files[0]), ".yaml")+"-"+string(rune('a'+i%26)))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		for _, f := range c.files {
			b, err := os.ReadFile(filepath.Join(r.src, f))
			if err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(dir, filepath.Base(f)), b, 0o644); err != nil {
				return err
			}
		}
		pok, pout := runQuiet(exec.Command(check, "-config_dir", dir))
		fok, fout := runQuiet(exec.Command(r.floodgate, "validate", dir))
		r.loads++
		verdict := func(ok bool) string {
			if ok {
				return "accepted"
			}
			return "refused"
		}
		line := strings.Join(c.files, " + ")
		switch {
		case pok == fok:
			r.loadMatches++
			r.printf("- match: %s: both %s\n", line, verdict(pok))
		case c.known != "":
			r.loadDocumented++
			r.printf("- DOCUMENTED: %s: peer %s, floodgate %s (%s)\n", line, verdict(pok), verdict(fok), c.known)
		default:
			r.loadMismatches++
			r.printf("- MISMATCH: %s: peer %s, floodgate %s\n", line, verdict(pok), verdict(fok))
		}
		if pok != fok || r.verbose {
			r.printf("    peer: %s\n    floodgate: %s\n", lastLine(pout), lastLine(fout))
		}
	}
	r.printf("\n")
	return nil
}

func runQuiet(c *exec.Cmd) (bool, string) {
	var out bytes.Buffer
	c.Stdout, c.Stderr = &out, &out
	err := c.Run()
	return err == nil, out.String()
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if l := strings.TrimSpace(lines[i]); l != "" && !strings.HasPrefix(l, "goroutine ") {
			if len(l) > 200 {
				l = l[:200] + "…"
			}
			return l
		}
	}
	return ""
}

package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// top against a running server under load: the flooding key leads its
// rule, with the count of its refusals; --json parses; --rule filters;
// --watch prints a block a refresh, with no terminal codes when stdout is
// not a terminal.
func TestAdminCLITop(t *testing.T) {
	s := startAdminServer(t)
	out := s.mustCLI(t, "top")
	if !strings.Contains(out, "no key has been over a limit") {
		t.Fatalf("top before any refusal:\n%s", out)
	}
	refuse := func(key, value string, n int) {
		t.Helper()
		for range 3 + n { // 3 a day pass, then n refused
			s.ask(t, "api", desc(key, value))
		}
		if r := s.ask(t, "api", desc(key, value)); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("%s=%s not refused", key, value)
		}
	}
	refuse("user", "flood", 40) // 41 refusals with the check
	refuse("user", "small", 4)  // 5
	refuse("ip", "10.0.0.1", 9) // 10
	for range 3 {               // allowed requests count for nothing
		s.ask(t, "api", desc("user", "fine"))
	}
	var ans topAnswer
	out = s.mustCLI(t, "top", "--json")
	if err := json.Unmarshal([]byte(out), &ans); err != nil {
		t.Fatalf("top --json: %v\n%s", err, out)
	}
	byRule := map[string]topRule{}
	for _, r := range ans.Rules {
		byRule[r.Rule] = r
	}
	u, ip := byRule["api.user"], byRule["api.ip"]
	if len(ans.Rules) != 2 || len(u.Keys) != 2 || u.Keys[0].Key != "user=flood" || u.Keys[0].Count != 41 || u.Keys[0].Error != 0 ||
		u.Keys[1].Key != "user=small" || u.Keys[1].Count != 5 || len(ip.Keys) != 1 || ip.Keys[0].Count != 10 {
		t.Fatalf("top --json: %+v", ans)
	}
	out = s.mustCLI(t, "top", "--rule", "api.user", "-n", "1")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.Contains(lines[2], "user=flood") || !strings.Contains(lines[2], "41") || strings.Contains(out, "api.ip") {
		t.Fatalf("top --rule api.user -n 1:\n%s", out)
	}
	out = s.mustCLI(t, "top", "--domain", "api", "--watch", "--interval", "10ms", "--count", "3")
	if n := strings.Count(out, "floodgate top  "); n != 3 || strings.Contains(out, "\x1b[") || !strings.Contains(out, "every 10ms") {
		t.Fatalf("--watch --count 3 (not a terminal): %d blocks\n%q", n, out)
	}
	out = s.mustCLI(t, "top", "--json", "--interval", "10ms", "--count", "2")
	docs := strings.Split(strings.TrimSpace(out), "\n")
	for _, d := range docs {
		var v struct {
			Time  string    `json:"time"`
			Rules []topRule `json:"rules"`
		}
		if err := json.Unmarshal([]byte(d), &v); err != nil || v.Time == "" || len(v.Rules) != 2 {
			t.Fatalf("--json --watch line %q: %v", d, err)
		}
	}
	if len(docs) != 2 {
		t.Fatalf("--json --count 2: %d lines", len(docs))
	}
	for _, bad := range [][]string{{"-n", "0"}, {"-n", "101"}, {"--interval", "0s"}, {"extra"}} {
		if code, _, errs := s.adminCLI(t, append([]string{"top"}, bad...)...); code != exitUsage {
			t.Errorf("top %v: exit %d %s", bad, code, errs)
		}
	}
}

// On a terminal each refresh clears the screen and redraws; a server
// that does not answer is reported at each refresh and asked again, and
// the command ends with the last refresh's failure.
func TestAdminCLITopTerminalAndRetry(t *testing.T) {
	s := startAdminServer(t)
	top := &topCmd{n: 5, watch: true, interval: 10 * time.Millisecond, count: 2}
	c, err := (&adminFlags{admin: s.admin, token: adminTestToken, timeout: 10 * time.Second}).client()
	if err != nil {
		t.Fatal(err)
	}
	var out, errs bytes.Buffer
	if err := top.loop(t.Context(), c, &out, &errs, true); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(out.String(), "\x1b[H\x1b[2J"); n != 2 || !strings.HasPrefix(out.String(), "\x1b[H\x1b[2J") {
		t.Fatalf("terminal: %d clears in %q", n, out.String())
	}
	closed := freeLoopbackAddr(t)
	code, stdout, stderr := cli(t, "top", "--watch", "--interval", "10ms", "--count", "3", "--admin", closed)
	if code != exitUnreachable || stdout != "" || strings.Count(stderr, "asking again every 10ms") != 2 || !strings.HasSuffix(stderr, "--admin-addr?)\n") {
		t.Fatalf("top --watch against nothing: exit %d\nstdout %q\nstderr %s", code, stdout, stderr)
	}
}

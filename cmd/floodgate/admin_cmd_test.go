package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// adminTestToken is the admin token of the servers these tests start.
const adminTestToken = "0123456789abcdef0123456789abcdef"

// cliRules: a token bucket of 3 a day per user (no window boundary to
// cross mid-test), and a fixed window (which takes no burst).
const cliRules = `domain: api
descriptors:
  - key: user
    rate_limit:
      unit: day
      requests_per_unit: 3
      algorithm: token_bucket
  - key: ip
    rate_limit:
      unit: day
      requests_per_unit: 3
`

// startAdminServer starts `floodgate serve` on cliRules with the admin
// token, and clears the environment the admin commands read.
func startAdminServer(t *testing.T) *server {
	t.Helper()
	for _, k := range []string{"FLOODGATE_ADMIN_TOKEN", "FLOODGATE_ADMIN_URL", "FLOODGATE_ADMIN_TOKEN_FILE"} {
		t.Setenv(k, "")
		os.Unsetenv(k)
	}
	dir := t.TempDir()
	writeRules(t, dir, "api.yaml", cliRules)
	return startServer(t, "--rules", dir, "--data", t.TempDir(), "--admin-token", adminTestToken)
}

// cli runs the floodgate command line in process and returns its exit
// code, stdout and stderr.
func cli(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(args, &out, &errb)
	return code, out.String(), errb.String()
}

// adminCLI runs an admin command against s with the right token.
func (s *server) adminCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	return cli(t, append(args, "--admin", s.admin, "--token", adminTestToken)...)
}

// mustCLI is adminCLI that must exit 0.
func (s *server) mustCLI(t *testing.T, args ...string) string {
	t.Helper()
	code, out, errs := s.adminCLI(t, args...)
	if code != 0 {
		t.Fatalf("floodgate %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, out, errs)
	}
	return out
}

// inspectJSON is `inspect --json`'s output.
type inspectJSON struct {
	Domain string     `json:"domain"`
	Limits []keyState `json:"limits"`
}

func (s *server) inspect(t *testing.T, kv ...string) keyState {
	t.Helper()
	var got inspectJSON
	out := s.mustCLI(t, append([]string{"inspect", "--domain", "api", "--json"}, kv...)...)
	if err := json.Unmarshal([]byte(out), &got); err != nil || len(got.Limits) != 1 || got.Domain != "api" {
		t.Fatalf("inspect --json: %v\n%s", err, out)
	}
	return got.Limits[0]
}

// inspect and reset against a running server: the table, --json, and
// that reset makes a spent key allowed again for the next real request.
func TestAdminCLIInspectAndReset(t *testing.T) {
	s := startAdminServer(t)
	out := s.mustCLI(t, "inspect", "--domain", "api", "user=alice")
	if !strings.Contains(out, "DECISION") || !strings.Contains(out, "user=alice") || !strings.Contains(out, "allow") {
		t.Fatalf("inspect of a fresh key:\n%s", out)
	}
	if st := s.inspect(t, "user=alice"); !st.Allowed || st.Remaining != 3 || st.Key != "user=alice" || st.Limit != "api.user" || st.Override {
		t.Fatalf("a fresh key: %+v", st)
	}
	for range 3 {
		if r := s.ask(t, "api", desc("user", "alice")); r.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("request within the limit: %v", r.OverallCode)
		}
	}
	if r := s.ask(t, "api", desc("user", "alice")); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("fourth request: %v", r.OverallCode)
	}
	st := s.inspect(t, "user=alice")
	if st.Allowed || st.Remaining != 0 || st.RetryAfter == "" || st.RetryAfter == "0s" {
		t.Fatalf("a spent key: %+v, want refused with a retry time", st)
	}
	if out := s.mustCLI(t, "inspect", "--domain", "api", "user=alice"); !strings.Contains(out, "refuse") {
		t.Fatalf("inspect of a spent key:\n%s", out)
	}
	// inspect consumed nothing: the spent key is still spent, a fresh one fresh
	if st := s.inspect(t, "user=bob"); st.Remaining != 3 {
		t.Fatalf("bob after being inspected: %+v", st)
	}
	out = s.mustCLI(t, "reset", "--domain", "api", "user=alice")
	if !strings.Contains(out, "reset user=alice") {
		t.Fatalf("reset: %s", out)
	}
	if r := s.ask(t, "api", desc("user", "alice")); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("after reset: %v", r.OverallCode)
	}
	// a reset of another key leaves this one as it is
	s.mustCLI(t, "reset", "--domain", "api", "user=carol")
	if st := s.inspect(t, "user=alice"); st.Remaining != 2 {
		t.Fatalf("alice after carol's reset: %+v, want 2 left", st)
	}
	var js map[string]any
	if out := s.mustCLI(t, "reset", "--domain", "api", "--json", "user=alice"); json.Unmarshal([]byte(out), &js) != nil {
		t.Fatalf("reset --json: %s", out)
	}
	// a request's several descriptors: a row each; one no limit matches is
	// named on stderr, the others still shown, and the exit code says so
	code, out, errs := s.adminCLI(t, "inspect", "--domain", "api", "--json", "user=alice", "--descriptor", "ip=10.1.1.1", "--descriptor", "path=/x,user=y")
	var many inspectJSON
	if code != exitNotFound || json.Unmarshal([]byte(out), &many) != nil || len(many.Limits) != 2 ||
		many.Limits[0].Descriptor != "user=alice" || many.Limits[1].Limit != "api.ip" || many.Limits[1].Descriptor != "ip=10.1.1.1" ||
		!strings.Contains(errs, "path=/x,user=y: POST /v1/keys/inspect: 404") {
		t.Fatalf("three descriptors, one matching no limit: exit %d\nstdout %s\nstderr %s", code, out, errs)
	}
}

// Each failure has its own exit code and a message on stderr, nothing on
// stdout; and a command refused locally sends nothing.
func TestAdminCLIErrorsAndExitCodes(t *testing.T) {
	s := startAdminServer(t)
	for _, c := range []struct {
		name string
		args []string
		code int
		says string
	}{
		{"unknown domain", []string{"inspect", "--domain", "nope", "user=a", "--token", adminTestToken}, exitNotFound, `no domain "nope" in the live rules`},
		{"no limit matches", []string{"inspect", "--domain", "api", "path=/x", "--token", adminTestToken}, exitNotFound, "no limit applies"},
		{"no such override", []string{"overrides", "get", "--domain", "api", "user=zed", "--token", adminTestToken}, exitNotFound, "no override"},
		{"bad key=value", []string{"inspect", "--domain", "api", "user", "--token", adminTestToken}, exitUsage, `"user": want key=value`},
		{"empty key", []string{"reset", "--domain", "api", "=v", "--token", adminTestToken}, exitUsage, "want key=value"},
		{"no descriptor", []string{"inspect", "--domain", "api", "--token", adminTestToken}, exitUsage, "no key=value"},
		{"no domain", []string{"inspect", "user=a", "--token", adminTestToken}, exitUsage, "--domain is required"},
		{"bad flag", []string{"inspect", "--domian", "api", "user=a"}, exitUsage, "flag provided but not defined"},
		{"no token", []string{"inspect", "--domain", "api", "user=a"}, exitAuth, "no admin token was given"},
		{"wrong token", []string{"inspect", "--domain", "api", "user=a", "--token", "wrong-token-1234"}, exitAuth, "not the server's --admin-token"},
		{"override the rule cannot take", []string{"overrides", "set", "--domain", "api", "ip=1.2.3.4", "--limit", "5", "--period", "24h", "--burst", "9", "--token", adminTestToken}, exitRejected, "burst"},
		{"bad override locally", []string{"overrides", "set", "--domain", "api", "user=a", "--limit", "-1", "--period", "1s", "--token", adminTestToken}, exitUsage, "--limit: must be positive"},
	} {
		code, out, errs := cli(t, append(c.args, "--admin", s.admin)...)
		if code != c.code || !strings.Contains(errs, c.says) || out != "" {
			t.Errorf("%s: exit %d (want %d)\nstdout: %q\nstderr: %s (want it to say %q)", c.name, code, c.code, out, errs, c.says)
		}
	}
	// a port nothing listens on
	closed := freeLoopbackAddr(t)
	if code, _, errs := cli(t, "inspect", "--domain", "api", "user=a", "--admin", closed); code != exitUnreachable || !strings.Contains(errs, "no answer from the admin API") {
		t.Errorf("unreachable: exit %d, %s", code, errs)
	}
	// the bad token and the bad override changed nothing
	if code, out, _ := s.adminCLI(t, "overrides", "list", "--domain", "api", "--json"); code != 0 || strings.TrimSpace(out) != "[]" {
		t.Errorf("overrides after refused calls: %d %s", code, out)
	}
	// help names every exit code
	code, out, _ := cli(t, "help", "inspect")
	if code != 0 || !strings.Contains(out, "exit codes:") || !strings.Contains(out, "6  the server refused") {
		t.Errorf("help inspect: %d\n%s", code, out)
	}
}

// freeLoopbackAddr is a loopback address nothing listens on (a port
// taken and let go).
func freeLoopbackAddr(t *testing.T) string {
	t.Helper()
	l, err := listenAddr("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// The token comes from --token, FLOODGATE_ADMIN_TOKEN or --token-file;
// the server enforces it on every command.
func TestAdminCLITokenSources(t *testing.T) {
	s := startAdminServer(t)
	file := filepath.Join(t.TempDir(), "token")
	os.WriteFile(file, []byte(adminTestToken+"\n"), 0o600)
	if code, out, errs := cli(t, "inspect", "--domain", "api", "user=a", "--admin", s.admin, "--token-file", file); code != 0 {
		t.Fatalf("--token-file: %d %s %s", code, out, errs)
	}
	t.Setenv("FLOODGATE_ADMIN_TOKEN", adminTestToken)
	if code, out, errs := cli(t, "overrides", "list", "--domain", "api", "--admin", s.admin); code != 0 {
		t.Fatalf("FLOODGATE_ADMIN_TOKEN: %d %s %s", code, out, errs)
	}
	// a flag wins over the environment: a wrong --token, or --token-file
	// holding a wrong one, is refused though the variable is right
	wrong := filepath.Join(t.TempDir(), "wrong")
	os.WriteFile(wrong, []byte("not-the-token\n"), 0o600)
	for _, flags := range [][]string{{"--token", "not-the-token"}, {"--token-file", wrong}} {
		if code, _, _ := cli(t, append([]string{"inspect", "--domain", "api", "user=a", "--admin", s.admin}, flags...)...); code != exitAuth {
			t.Fatalf("%v with the right FLOODGATE_ADMIN_TOKEN: exit %d, want %d", flags, code, exitAuth)
		}
	}
	os.Unsetenv("FLOODGATE_ADMIN_TOKEN")
	for _, args := range [][]string{
		{"reset", "--domain", "api", "user=a"},
		{"overrides", "set", "--domain", "api", "user=a", "--limit", "1", "--period", "1s"},
		{"overrides", "list", "--domain", "api"},
		{"overrides", "export"},
		{"top"},
	} {
		if code, _, errs := cli(t, append(args, "--admin", s.admin)...); code != exitAuth {
			t.Errorf("%v without a token: exit %d, %s", args, code, errs)
		}
	}
	if code, _, _ := s.adminCLI(t, "overrides", "get", "--domain", "api", "user=a"); code != exitNotFound {
		t.Fatalf("the set without a token was applied (get: exit %d)", code)
	}
}

// An override set with the command changes the next real decision; get,
// list (table and --json) show it; delete takes it away.
func TestAdminCLIOverrides(t *testing.T) {
	s := startAdminServer(t)
	out := s.mustCLI(t, "overrides", "set", "--domain", "api", "user=dave", "--limit", "1", "--period", "24h", "--note", "abuse ticket 7")
	if !strings.Contains(out, "set api user=dave: 1 per 24h0m0s") {
		t.Fatalf("set: %s", out)
	}
	if r := s.ask(t, "api", desc("user", "dave")); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("dave's first request: %v", r.OverallCode)
	}
	if r := s.ask(t, "api", desc("user", "dave")); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("dave's second request under an override of 1 a day: %v (the rule's 3 would allow it)", r.OverallCode)
	}
	if st := s.inspect(t, "user=dave"); !st.Override || st.Allowed {
		t.Fatalf("inspect under the override: %+v", st)
	}
	s.mustCLI(t, "overrides", "set", "--domain", "api", "user=erin", "--limit", "7", "--period", "24h")
	out = s.mustCLI(t, "overrides", "list", "--domain", "api")
	if !strings.Contains(out, "user=dave") || !strings.Contains(out, "abuse ticket 7") || !strings.Contains(out, "user=erin") {
		t.Fatalf("list:\n%s", out)
	}
	var list []struct {
		Key   string `json:"key"`
		Limit int64  `json:"limit"`
	}
	out = s.mustCLI(t, "overrides", "list", "--domain", "api", "--json", "--limit", "1", "--after", "user=dave")
	if err := json.Unmarshal([]byte(out), &list); err != nil || len(list) != 1 || list[0].Key != "user=erin" || list[0].Limit != 7 {
		t.Fatalf("list --json --limit 1 --after user=dave: %v %s", err, out)
	}
	var one map[string]any
	if out := s.mustCLI(t, "overrides", "get", "--domain", "api", "user=erin", "--json"); json.Unmarshal([]byte(out), &one) != nil || one["limit"] != 7.0 {
		t.Fatalf("get --json: %s", out)
	}
	s.mustCLI(t, "overrides", "delete", "--domain", "api", "user=dave")
	if code, _, _ := s.adminCLI(t, "overrides", "delete", "--domain", "api", "user=dave"); code != exitNotFound {
		t.Fatalf("a second delete: exit %d", code)
	}
	// without its override, dave is back under the rule (3 a day, 1 used)
	if r := s.ask(t, "api", desc("user", "dave")); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("dave after the delete: %v", r.OverallCode)
	}
}

// A key holding '|', '=', '/' or '%' (as the store writes them) goes
// through the URL intact.
func TestAdminCLIOverrideKeyEscaping(t *testing.T) {
	s := startAdminServer(t)
	key := "user=a%7Cb/c?d#e f"
	s.mustCLI(t, "overrides", "set", "--domain", "api", key, "--limit", "2", "--period", "1h")
	var got map[string]any
	out := s.mustCLI(t, "overrides", "get", "--domain", "api", "--json", key)
	if json.Unmarshal([]byte(out), &got) != nil || got["key"] != key {
		t.Fatalf("get %q: %s", key, out)
	}
	s.mustCLI(t, "overrides", "delete", "--domain", "api", key)
}

// --admin unix:PATH reaches an admin API on a socket.
func TestAdminCLIUnixSocket(t *testing.T) {
	for _, k := range []string{"FLOODGATE_ADMIN_TOKEN", "FLOODGATE_ADMIN_URL", "FLOODGATE_ADMIN_TOKEN_FILE"} {
		t.Setenv(k, "")
		os.Unsetenv(k)
	}
	sock, err := os.MkdirTemp("", "fgadm") // short: a socket path has a length limit
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sock) })
	dir := t.TempDir()
	writeRules(t, dir, "api.yaml", cliRules)
	s := startServer(t, "--rules", dir, "--data", t.TempDir(), "--admin-addr", "unix:"+filepath.Join(sock, "a.sock"))
	if !strings.HasPrefix(s.admin, "unix:") {
		t.Fatalf("admin address %q", s.admin)
	}
	code, out, errs := cli(t, "inspect", "--domain", "api", "user=a", "--admin", s.admin)
	if code != 0 || !strings.Contains(out, "user=a") {
		t.Fatalf("inspect over %s: %d %s %s", s.admin, code, out, errs)
	}
}

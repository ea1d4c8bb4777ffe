package main

import (
	"bufio"
	"bytes"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/floodgate/floodgate/internal/testproc"
)

// An admin token that could never be sent as it is (blank, with leading or
// trailing blanks, with control bytes) is refused before anything starts,
// naming the flag; it would otherwise leave an admin API beyond loopback
// guarded by nothing a client can type, or by nothing at all.
func TestServeRefusesUnusableAdminTokens(t *testing.T) {
	for _, tok := range []string{" ", "   ", " s3cret", "s3cret ", "s3\ncret", "s3\x00cret", "sé"} {
		var out, errb bytes.Buffer
		code := run([]string{"serve", "--data", t.TempDir(), "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
			"--admin-addr", "0.0.0.0:0", "--admin-token", tok}, &out, &errb)
		if code == 0 || !strings.Contains(errb.String(), "--admin-token") {
			t.Errorf("--admin-token %q: exit %d, want a refusal naming the flag:\n%s", tok, code, errb.String())
		}
	}
}

// startRefused runs the binary with args and env (and no other FLOODGATE_
// variables) and returns what it wrote, failing the test at once if it
// starts listening instead of refusing with exit 1.
func startRefused(t *testing.T, env []string, args ...string) string {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Env = append(slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "FLOODGATE_") }), env...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	proc, err := testproc.Start(cmd) // dies with the test binary
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	sc := bufio.NewScanner(stderr)
	for sc.Scan() { // until the process exits and its stderr closes
		out.WriteString(sc.Text() + "\n")
		if strings.Contains(sc.Text(), `"msg":"listening"`) {
			cmd.Process.Kill()
			proc.Wait()
			t.Fatalf("%v %v started listening, want a refusal:\n%s", env, args, out.String())
		}
	}
	err = proc.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("%v %v: %v, want exit 1\n%s", env, args, err, out.String())
	}
	return out.String()
}

// A weak admin token beyond loopback is refused, by serve and by proxy,
// from the flag and from FLOODGATE_ADMIN_TOKEN, with a message that says
// how to make a good one, and without showing the token.
func TestWeakAdminTokenRefusedBeyondLoopback(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(up.Close)
	const weak = "letmein"
	for _, cmdArgs := range [][]string{
		{"serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"},
		{"proxy", "--upstream", up.URL, "--listen", "127.0.0.1:0"},
	} {
		args := append(cmdArgs, "--data", t.TempDir(), "--log-format", "json", "--admin-addr", "0.0.0.0:0")
		for _, via := range []struct {
			env  []string
			args []string
		}{
			{nil, append(slices.Clone(args), "--admin-token", weak)},
			{[]string{"FLOODGATE_ADMIN_TOKEN=" + weak}, args},
		} {
			out := startRefused(t, via.env, via.args...)
			for _, want := range []string{"--admin-token", "FLOODGATE_ADMIN_TOKEN", "128 bits", "openssl rand -hex 32", "head -c 32 /dev/urandom | base64"} {
				if !strings.Contains(out, want) {
					t.Errorf("%s %v: the refusal does not say %q:\n%s", cmdArgs[0], via.env, want, out)
				}
			}
			if strings.Contains(out, weak) {
				t.Errorf("%s: the refusal shows the token:\n%s", cmdArgs[0], out)
			}
		}
	}
}

// The estimate of a token's strength: length × log2 of the alphabet of
// the character classes it uses (16 for hex digits alone), and none at all
// with fewer than 8 distinct characters. A random 32-hex or 22-base64
// token passes 128 bits; one character less does not.
func TestAdminTokenBits(t *testing.T) {
	hex32 := "3f9c2a7b1e6d4c8a9b0f5e2d7c1a6b3e"
	for tok, strong := range map[string]bool{
		"a":                      false,
		"s3cret":                 false,
		hex32:                    true,  // openssl rand -hex 16: 128 bits
		hex32[:31]:               false, // 124 bits
		strings.ToUpper(hex32):   true,
		"q3Zk9Xw2Lp0Vb7Nc4Rt8Yh": true,  // 22 base64 characters, no + or /: 22 × log2(62) = 131
		"q3Zk9Xw2Lp0Vb7Nc4Rt8Y":  false, // 21: 125
		"q3Z+9Xw2L/0Vb7Nc4Rt8Yh": true,  // 22 × log2(64) = 132
		"Jm4Sx8Rv2Wq6Tz0Pb3Ny7Kc5Hd1Lg9Fa2Ue6Oi4Yw8Q=": true,  // head -c 32 /dev/urandom | base64
		strings.Repeat("a", 100):                       false, // one distinct character
		strings.Repeat("0123456", 30):                  false, // seven
	} {
		if got := adminTokenBits(tok) >= minAdminTokenBits; got != strong {
			t.Errorf("%q: %.1f bits, strong %v, want %v", tok, adminTokenBits(tok), got, strong)
		}
	}
}

// On loopback a weak token is taken, with a warning that names the rule;
// beyond it, refused; a strong one is taken anywhere without a word.
func TestAdminTokenStrengthByAddress(t *testing.T) {
	const strong = "3f9c2a7b1e6d4c8a9b0f5e2d7c1a6b3e"
	for _, c := range []struct {
		addr, token string
		refused     bool
		warned      bool
	}{
		{"127.0.0.1:6070", "a", false, true},
		{"[::1]:6070", "a", false, true},
		{"localhost:6070", "a", false, true},
		{"unix:/run/fg.sock", "a", false, true},
		{"0.0.0.0:6070", "a", true, false},
		{"10.0.0.5:6070", "s3cret", true, false},
		{":6070", "s3cret", true, false},
		{"0.0.0.0:6070", strong, false, false},
		{"127.0.0.1:6070", strong, false, false},
		{"127.0.0.1:6070", "", false, false}, // no token at all on loopback: no guard, as before
	} {
		var logs bytes.Buffer
		log := slog.New(slog.NewTextHandler(&logs, nil))
		err := checkAdminToken(c.addr, c.token, log)
		if (err != nil) != c.refused {
			t.Errorf("--admin-addr %s with a token of %d bytes: %v, want refused %v", c.addr, len(c.token), err, c.refused)
		}
		if warned := strings.Contains(logs.String(), "128 bits"); warned != c.warned {
			t.Errorf("--admin-addr %s with a token of %d bytes: warned %v, want %v:\n%s", c.addr, len(c.token), warned, c.warned, logs.String())
		}
	}
}

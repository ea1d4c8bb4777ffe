package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Two files whose http routes give one limit name ("x/a/b": route "a/b" of
// domain "x", route "b" of domain "x/a") are each fine alone; validate
// refuses them together, with both places, as the proxy does.
func TestValidateRefusesRouteNamesThatMeet(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("x.yaml", `domain: x
http:
  - name: a/b
    key: [remote_address]
    rate_limit: {unit: second, requests_per_unit: 5}
`)
	write("xa.yaml", `domain: x/a
http:
  - name: b
    key: [remote_address]
    rate_limit: {unit: second, requests_per_unit: 5}
`)
	var out, errb bytes.Buffer
	code := run([]string{"validate", dir}, &out, &errb)
	if code != 1 || !strings.Contains(errb.String(), `"x/a/b"`) || !strings.Contains(errb.String(), "x.yaml:3") || !strings.Contains(errb.String(), "xa.yaml:3") {
		t.Fatalf("validate: %d\n%s%s", code, out.String(), errb.String())
	}
	// renamed, they pass
	write("xa.yaml", `domain: x/a
http:
  - name: c
    key: [remote_address]
    rate_limit: {unit: second, requests_per_unit: 5}
`)
	out.Reset()
	errb.Reset()
	if code := run([]string{"validate", dir}, &out, &errb); code != 0 {
		t.Fatalf("validate after renaming: %d\n%s%s", code, out.String(), errb.String())
	}
}

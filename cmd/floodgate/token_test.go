package main

import (
	"bytes"
	"strings"
	"testing"
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

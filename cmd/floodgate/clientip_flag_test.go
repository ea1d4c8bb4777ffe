package main

import (
	"bytes"
	"strings"
	"testing"
)

// --client-ip-header takes the forwarding headers the proxy understands,
// and refuses anything else by name before starting.
func TestProxyClientIPHeaderFlag(t *testing.T) {
	for _, bad := range []string{"X-Client-IP", "X-Forwarded-For,", "Forwarded; X-Real-IP"} {
		var out, errb bytes.Buffer
		code := run([]string{"proxy", "--upstream", "http://127.0.0.1:1", "--listen", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0",
			"--data", t.TempDir(), "--client-ip-header", bad}, &out, &errb)
		if code == 0 || !strings.Contains(errb.String(), "--client-ip-header") {
			t.Errorf("--client-ip-header %q: exit %d\n%s", bad, code, errb.String())
		}
	}
	c, err := proxyFlags([]string{"--upstream", "http://127.0.0.1:1", "--client-ip-header", "Forwarded, X-Forwarded-For"}, &bytes.Buffer{})
	if err != nil || c.clientIPHeaders != "Forwarded, X-Forwarded-For" {
		t.Fatalf("a good value: %+v %v", c, err)
	}
}

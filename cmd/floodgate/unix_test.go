package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
)

// --grpc-addr and --http-addr take unix:PATH (a sidecar's Unix socket, as
// envoyproxy/ratelimit's GRPC_UDS): the gRPC API and /json answer there, a
// socket file left by a process that has gone is replaced, and one that a
// running server holds is refused.
func TestServeUnixSockets(t *testing.T) {
	dir := t.TempDir()
	writeRules(t, dir, "api.yaml", apiRules)
	sockDir := t.TempDir()
	gsock, hsock := filepath.Join(sockDir, "g.sock"), filepath.Join(sockDir, "h.sock")
	// a stale socket file: bound, then closed without removing it
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: gsock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	l.Close()

	s := startServer(t, "--rules", dir, "--data", t.TempDir(), "--grpc-addr", "unix:"+gsock, "--http-addr", "unix:"+hsock)
	if s.grpc != "unix:"+gsock || s.http != "unix:"+hsock {
		t.Fatalf("logged addresses %q and %q", s.grpc, s.http)
	}
	if r := s.ask(t, "api", desc("user", "uds")); len(r.Statuses) != 1 || r.Statuses[0].LimitRemaining == 0 {
		t.Fatalf("over the Unix socket: %v", r)
	}
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", hsock)
	}}}
	resp, err := hc.Post("http://floodgate/json", "application/json", strings.NewReader(`{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"uds"}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"overallCode":"OK"`) {
		t.Fatalf("/json over the Unix socket: %d %s", resp.StatusCode, b)
	}

	// a second server on the same socket: refused, naming it
	var out, errb bytes.Buffer
	code := run([]string{"serve", "--rules", dir, "--data", t.TempDir(), "--grpc-addr", "unix:" + gsock,
		"--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"}, &out, &errb)
	if code == 0 || !strings.Contains(errb.String(), "in use") || !strings.Contains(errb.String(), gsock) {
		t.Fatalf("a second server on %s: exit %d\n%s", gsock, code, errb.String())
	}
	if r := s.ask(t, "api", desc("user", "uds")); len(r.Statuses) != 1 {
		t.Fatalf("the first server after the refused second: %v", r)
	}
}

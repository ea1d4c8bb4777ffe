package httplimit_test

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/gate"
	"github.com/floodgate/floodgate/httplimit"
)

// A server on a Unix socket behind a local proxy that trusts 127.0.0.1
// keys each client by its X-Forwarded-For entry, as on loopback TCP: the
// socket's peer is this host. Every such client had shared the key
// "unknown", and without trusted proxies they still share one (the host's).
func TestUnixSocketPeerIsThisHost(t *testing.T) {
	p := mustPolicy(t, "ip", floodgate.Rule{Algorithm: floodgate.TokenBucket, Limit: 1, Period: time.Hour})
	limits := []gate.Limit{{Name: "ip", Policy: p, Key: []gate.Part{gate.IP()}}}
	dir, err := os.MkdirTemp("", "hl")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	serveUnix := func(name string, ci gate.ClientIP) *http.Client {
		mw, err := httplimit.New(httplimit.Options{Config: gate.Config{Limits: limits, ClientIP: ci}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(mw.Close)
		sock := filepath.Join(dir, name)
		l, err := net.Listen("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))}
		go srv.Serve(l)
		t.Cleanup(func() { srv.Close() })
		return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		}}}
	}
	status := func(c *http.Client, xff string) int {
		t.Helper()
		req, _ := http.NewRequest("GET", "http://local/", nil)
		req.Header.Set("X-Forwarded-For", xff)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	trusted := serveUnix("trusted.sock", gate.ClientIP{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}})
	for _, ip := range []string{"203.0.113.1", "203.0.113.2"} {
		if got := status(trusted, ip); got != 200 {
			t.Fatalf("client %s through the socket: %d, want 200 (a key of its own)", ip, got)
		}
	}
	if got := status(trusted, "203.0.113.1"); got != 429 {
		t.Fatalf("client 203.0.113.1 again: %d, want 429", got)
	}
	untrusted := serveUnix("untrusted.sock", gate.ClientIP{})
	status(untrusted, "203.0.113.1")
	if got := status(untrusted, "203.0.113.2"); got != 429 {
		t.Fatalf("without trusted proxies, a second client: %d, want 429 (the host's one key)", got)
	}
}

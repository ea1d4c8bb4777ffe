package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/floodgate/floodgate/internal/redistest"
	"github.com/floodgate/floodgate/internal/testproc"
)

// runCheck runs `floodgate check` (the binary) with args.
func runCheck(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, append([]string{"check"}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	proc, err := testproc.Start(cmd)
	if err == nil {
		err = proc.Wait()
	}
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit) && ctx.Err() == nil:
		code = exit.ExitCode()
	default:
		t.Fatalf("floodgate check %v: %v\n%s", args, err, errb.String())
	}
	return code, out.String(), errb.String()
}

// checkAnswer is the part of check's JSON answer the tests look at.
type checkAnswer struct {
	OverallCode string `json:"overallCode"`
	Statuses    []struct {
		Code           string `json:"code"`
		LimitRemaining uint32 `json:"limitRemaining"`
		CurrentLimit   struct {
			RequestsPerUnit uint32 `json:"requestsPerUnit"`
		} `json:"currentLimit"`
	} `json:"statuses"`
}

// `floodgate check` asks a server that runs with TLS, with the same client
// TLS flags as `floodgate bench`: with the server's CA it gets the
// decision; over plaintext, or with another CA, it fails and says why.
func TestCheckTLS(t *testing.T) {
	p := newPKI(t)
	cert, key := p.issue(t, "server", x509.ExtKeyUsageServerAuth)
	dir := t.TempDir()
	writeRules(t, dir, "api.yaml", apiRules)
	s := startServerNoClient(t, "--rules", dir, "--data", t.TempDir(), "--tls-cert", cert, "--tls-key", key)
	base := []string{"--addr", s.grpc, "--domain", "api", "--descriptor", "user=tls-check"}

	code, out, errOut := runCheck(t, append(base, "--tls-ca", p.caPath)...)
	var got checkAnswer
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("check --tls-ca: exit %d, no JSON answer: %v\n%s\n%s", code, err, out, errOut)
	}
	if code != 0 || got.OverallCode != "OK" || len(got.Statuses) != 1 ||
		got.Statuses[0].CurrentLimit.RequestsPerUnit != 50 || got.Statuses[0].LimitRemaining != 49 {
		t.Fatalf("check --tls-ca: exit %d, answer %+v\n%s\n%s", code, got, out, errOut)
	}

	// --tls-insecure skips verification; --tls-server-name is verified.
	if code, out, errOut := runCheck(t, append(base, "--tls-insecure", "--hits", "0")...); code != 0 || !strings.Contains(out, `"OK"`) {
		t.Fatalf("check --tls-insecure: exit %d\n%s\n%s", code, out, errOut)
	}
	if code, _, errOut := runCheck(t, append(base, "--tls-ca", p.caPath, "--tls-server-name", "other.test")...); code != 1 || !strings.Contains(errOut, "other.test") {
		t.Fatalf("check with a server name the certificate does not carry: exit %d, want 1 naming it\n%s", code, errOut)
	}

	// Plaintext against the TLS listener: a failure that points at TLS.
	code, out, errOut = runCheck(t, base...)
	if code != 1 || out != "" || !strings.Contains(errOut, "ShouldRateLimit:") || !strings.Contains(errOut, "plaintext") || !strings.Contains(errOut, "--tls-ca") {
		t.Fatalf("check without TLS flags: exit %d, want 1 with a hint at --tls-ca\nstdout %q\nstderr %s", code, out, errOut)
	}

	// Another CA: the server's certificate does not verify.
	other := newPKI(t)
	code, out, errOut = runCheck(t, append(base, "--tls-ca", other.caPath)...)
	if code != 1 || out != "" || !strings.Contains(errOut, "x509: certificate signed by unknown authority") || !strings.Contains(errOut, "did not verify") {
		t.Fatalf("check with a wrong CA: exit %d, want 1 with a verification failure\nstdout %q\nstderr %s", code, out, errOut)
	}

	// Flags that cannot work are usage errors.
	if code, _, errOut := runCheck(t, append(base, "--tls-cert", cert)...); code != 2 || !strings.Contains(errOut, "--tls-cert and --tls-key go together") {
		t.Fatalf("check --tls-cert without --tls-key: exit %d, want 2\n%s", code, errOut)
	}
	if code, _, errOut := runCheck(t, append(base, "--tls-ca", p.caPath+".missing")...); code != 1 || !strings.Contains(errOut, "TLS:") {
		t.Fatalf("check with a missing CA file: exit %d, want 1\n%s", code, errOut)
	}
}

// `floodgate check --tls-cert --tls-key` presents a client certificate to a
// server that requires one.
func TestCheckMutualTLS(t *testing.T) {
	p, s, ccert, ckey := startMutualTLS(t)
	base := []string{"--addr", s.grpc, "--domain", "api", "--descriptor", "user=mtls-check", "--tls-ca", p.caPath}
	if code, out, errOut := runCheck(t, append(base, "--tls-cert", ccert, "--tls-key", ckey)...); code != 0 || !strings.Contains(out, `"OK"`) {
		t.Fatalf("check with a client certificate: exit %d\n%s\n%s", code, out, errOut)
	}
	// How the refusal shows (the server's alert, or a broken pipe when the
	// client writes first under TLS 1.3) varies: only the failure is sure.
	if code, out, errOut := runCheck(t, base...); code != 1 || out != "" || !strings.Contains(errOut, "ShouldRateLimit:") {
		t.Fatalf("check without a client certificate: exit %d, want 1\nstdout %q\nstderr %s", code, out, errOut)
	}
}

// POST /json answers 200 while the descriptor is within its limit and 429
// once it is over, with Envoy's response as JSON either way.
func TestServeJSONOverLimit(t *testing.T) {
	dir := t.TempDir()
	writeRules(t, dir, "api.yaml", apiRules)
	s := startServer(t, "--rules", dir, "--data", t.TempDir())
	clearOfWindowEnd(t, time.Hour, 30*time.Second) // login: 3 an hour, a fixed window
	const body = `{"domain":"api","descriptors":[{"entries":[{"key":"remote_address","value":"10.7.7.7"},{"key":"path","value":"/login"}]}]}`
	post := func() (int, http.Header, checkAnswer) {
		t.Helper()
		resp, err := http.Post("http://"+s.http+"/json", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		var a checkAnswer
		if err := json.Unmarshal(raw, &a); err != nil {
			t.Fatalf("/json %d: body is not JSON: %v\n%s", resp.StatusCode, err, raw)
		}
		if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
			t.Fatalf("/json %d: Content-Type %q", resp.StatusCode, ct)
		}
		return resp.StatusCode, resp.Header, a
	}
	for i := range 3 {
		code, _, a := post()
		if code != http.StatusOK || a.OverallCode != "OK" || len(a.Statuses) != 1 || a.Statuses[0].LimitRemaining != uint32(2-i) {
			t.Fatalf("request %d within the limit: HTTP %d, %+v", i+1, code, a)
		}
	}
	code, h, a := post()
	if code != http.StatusTooManyRequests || a.OverallCode != "OVER_LIMIT" || len(a.Statuses) != 1 || a.Statuses[0].Code != "OVER_LIMIT" {
		t.Fatalf("request over the limit: HTTP %d, %+v; want 429 OVER_LIMIT", code, a)
	}
	if h.Get("Retry-After") == "" {
		t.Fatalf("429 without Retry-After: %v", h)
	}
}

// An admin listener beyond loopback needs a token: without one serve
// refuses to start; with one the admin API answers only requests that
// carry it.
func TestServeAdminBeyondLoopback(t *testing.T) {
	dir := t.TempDir()
	writeRules(t, dir, "api.yaml", apiRules)

	// Without a token: it must exit 1 before listening on anything. Its
	// log is read as it comes, so a server that starts fails the test at
	// once instead of at a timeout.
	cmd := exec.Command(binary, "serve", "--rules", dir, "--data", t.TempDir(), "--log-format", "json",
		"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--admin-addr", "0.0.0.0:0")
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "FLOODGATE_") })
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	proc, err := testproc.Start(cmd)
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
			t.Fatalf("serve --admin-addr 0.0.0.0:0 without a token started listening:\n%s", out.String())
		}
	}
	err = proc.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("serve --admin-addr 0.0.0.0:0 without a token: %v, want exit 1\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "--admin-token") || !strings.Contains(out.String(), "beyond loopback") {
		t.Fatalf("the refusal does not name --admin-token:\n%s", out.String())
	}

	s := startServerNoClient(t, "--rules", dir, "--data", t.TempDir(), "--admin-addr", "0.0.0.0:0", "--admin-token", strongToken)
	host, port, err := net.SplitHostPort(s.admin)
	if err != nil {
		t.Fatal(err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsUnspecified() {
		t.Fatalf("admin listens on %s, want every address", s.admin)
	}
	get := func(auth string) (int, string) {
		req, _ := http.NewRequest("GET", "http://127.0.0.1:"+port+"/v1/rules", nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, auth := range []string{"", "Bearer wrong", strongToken, "Basic " + strongToken} {
		if code, _ := get(auth); code != http.StatusUnauthorized && code != http.StatusForbidden {
			t.Fatalf("admin with Authorization %q: %d, want 401 or 403", auth, code)
		}
	}
	if code, body := get("Bearer " + strongToken); code != http.StatusOK || !strings.Contains(body, `"api"`) {
		t.Fatalf("admin with the token: %d\n%s", code, body)
	}
}

// The gRPC health service says SERVING, for the server and for the rate
// limit service, and reflection lists and describes the rate limit service.
func TestServeGRPCHealthAndReflection(t *testing.T) {
	dir := t.TempDir()
	writeRules(t, dir, "api.yaml", apiRules)
	s := startServer(t, "--rules", dir, "--data", t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const rls = "envoy.service.ratelimit.v3.RateLimitService"

	health := healthpb.NewHealthClient(s.conn)
	for _, svc := range []string{"", rls, "ratelimit"} { // "ratelimit": envoyproxy/ratelimit's name
		r, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health of %q: %v %v, want SERVING", svc, r, err)
		}
	}
	if _, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: "no.such.Service"}); status.Code(err) != codes.NotFound {
		t.Fatalf("health of an unknown service: %v, want NotFound", err)
	}
	// envoyproxy/ratelimit's HTTP liveness path, and /json by any method, as there
	for _, method := range []string{"GET", "POST", "HEAD"} {
		req, _ := http.NewRequest(method, "http://"+s.http+"/healthcheck", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s /healthcheck: %v %v", method, resp, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if want := map[bool]string{true: "", false: "OK"}[method == "HEAD"]; string(b) != want {
			t.Fatalf("%s /healthcheck: body %q, want %q as envoyproxy/ratelimit sends", method, b, want)
		}
	}
	req, _ := http.NewRequest("PUT", "http://"+s.http+"/json", strings.NewReader(`{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"h"}]}]}`))
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 200 {
		t.Fatalf("PUT /json: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}

	stream, err := reflectionpb.NewServerReflectionClient(s.conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ask := func(req *reflectionpb.ServerReflectionRequest) *reflectionpb.ServerReflectionResponse {
		t.Helper()
		if err := stream.Send(req); err != nil {
			t.Fatal(err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if e := resp.GetErrorResponse(); e != nil {
			t.Fatalf("reflection: %v", e)
		}
		return resp
	}
	var names []string
	for _, svc := range ask(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}).GetListServicesResponse().GetService() {
		names = append(names, svc.GetName())
	}
	if !slices.Contains(names, rls) || !slices.Contains(names, "grpc.health.v1.Health") {
		t.Fatalf("reflection lists %v, want %s and grpc.health.v1.Health", names, rls)
	}
	files := ask(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: rls}}).
		GetFileDescriptorResponse().GetFileDescriptorProto()
	if len(files) == 0 || !bytes.Contains(files[0], []byte("ShouldRateLimit")) {
		t.Fatalf("reflection has no descriptor of %s with ShouldRateLimit (%d files)", rls, len(files))
	}
	stream.CloseSend()
}

// SIGTERM lets a request in flight finish: a decision held on its way to
// Redis when the signal comes is answered from Redis once released, and
// the process exits 0 after it.
func TestServeSIGTERMDrainsInFlight(t *testing.T) {
	srv := redistest.Standalone(t)
	// Decisions are FCALLs of the floodgate_v1_ functions; the proxy
	// holds the first one after it is armed and lets everything else by.
	proxy := newHoldProxy(t, srv.Addr, []byte("floodgate_v1_"))
	dir := t.TempDir()
	writeRules(t, dir, "api.yaml", apiRules)
	// The store timeout and the drain timeout are far longer than the
	// test: the held request can only end by its answer from Redis.
	s := startServer(t, "--rules", dir, "--data", t.TempDir(), "--store", "redis://"+proxy.addr,
		"--store-timeout", "60s", "--drain-timeout", "120s")
	clearOfWindowEnd(t, time.Hour, 30*time.Second) // the user limit: 50 an hour, a fixed window
	if r := s.ask(t, "api", desc("user", "drain")); r.Statuses[0].LimitRemaining != 49 {
		t.Fatalf("first decision: %v", r)
	}

	proxy.arm()
	type result struct {
		resp *rlsv3.RateLimitResponse
		err  error
	}
	answered := make(chan result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		resp, err := s.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlcommon.RateLimitDescriptor{desc("user", "drain")}})
		answered <- result{resp, err}
	}()
	select {
	case <-proxy.held:
	case r := <-answered:
		t.Fatalf("answered before its store call was held: %v %v", r.resp, r.err)
	case <-time.After(15 * time.Second):
		t.Fatal("the decision never reached the store")
	}

	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// Draining has begun once the gRPC listener refuses new connections.
	waitFor(t, "the gRPC listener to close", func() bool {
		c, err := net.DialTimeout("tcp", s.grpc, time.Second)
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	select {
	case r := <-answered:
		t.Fatalf("the request in flight ended when the drain began: %v %v", r.resp, r.err)
	case <-s.done:
		t.Fatalf("floodgate exited with a request in flight: %v\n%s", s.exit, s.logs())
	default:
	}

	proxy.releaseHeld()
	select {
	case r := <-answered:
		if r.err != nil || r.resp.OverallCode != rlsv3.RateLimitResponse_OK || r.resp.Statuses[0].LimitRemaining != 48 {
			t.Fatalf("the drained request: %v %v, want OK with 48 remaining (decided by Redis)", r.resp, r.err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the drained request was not answered")
	}
	select {
	case <-s.done:
		if s.exit != nil {
			t.Fatalf("exit after the drain: %v\n%s", s.exit, s.logs())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("floodgate did not exit after the drain\n%s", s.logs())
	}
	s.conn.Close()
}

// holdProxy forwards TCP connections to a Redis server. Once armed, it
// holds the first write toward Redis that contains marker (and what
// follows it on that connection) until releaseHeld; other connections and
// earlier writes pass.
type holdProxy struct {
	addr    string
	marker  []byte
	held    chan struct{} // closed when a write is held
	release chan struct{}

	mu       sync.Mutex
	armed    bool
	holding  bool
	released bool
	conns    []net.Conn
}

func newHoldProxy(t *testing.T, target string, marker []byte) *holdProxy {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &holdProxy{addr: lis.Addr().String(), marker: marker, held: make(chan struct{}), release: make(chan struct{})}
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, up)
			p.mu.Unlock()
			go func() { io.Copy(c, up); c.Close() }()
			go p.forward(up, c)
		}
	}()
	t.Cleanup(func() {
		lis.Close()
		p.releaseHeld()
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, c := range p.conns {
			c.Close()
		}
	})
	return p
}

func (p *holdProxy) arm() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.armed = true
}

func (p *holdProxy) releaseHeld() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.released {
		p.released = true
		close(p.release)
	}
}

// forward copies src to dst, holding at the first marked write once armed.
func (p *holdProxy) forward(dst, src net.Conn) {
	defer dst.Close()
	buf := make([]byte, 64<<10)
	var tail []byte // the last bytes seen, for a marker split across reads
	for {
		n, err := src.Read(buf)
		if n > 0 {
			seen := append(tail, buf[:n]...)
			if p.hold(seen) {
				<-p.release
			}
			tail = append([]byte(nil), seen[max(0, len(seen)-len(p.marker)):]...)
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *holdProxy) hold(seen []byte) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.armed || p.holding || !bytes.Contains(seen, p.marker) {
		return false
	}
	p.holding = true
	close(p.held)
	return true
}

// An envoyproxy/ratelimit-style file with wildcards and replaces, on the
// binary: an exact value before a wildcard before the key alone, each
// value a wildcard matches counted on its own, and a named limit replaced
// by another descriptor's of the same request.
func TestServeEnvoyWildcardsAndReplaces(t *testing.T) {
	dir := t.TempDir()
	writeRules(t, dir, "edge.yaml", `domain: edge
descriptors:
  - key: client
    value: vip
    rate_limit:
      unit: hour
      requests_per_unit: 100
  - key: client
    value: "tenant-*"
    rate_limit:
      unit: hour
      requests_per_unit: 2
  - key: client
    rate_limit:
      unit: hour
      requests_per_unit: 1
  - key: plan
    value: free
    rate_limit:
      name: free_plan
      unit: hour
      requests_per_unit: 1
  - key: promo
    rate_limit:
      unit: hour
      requests_per_unit: 3
      replaces:
        - name: free_plan
`)
	s := startServer(t, "--rules", dir, "--data", t.TempDir())
	clearOfWindowEnd(t, time.Hour, 30*time.Second)
	limitOf := func(r *rlsv3.RateLimitResponse) uint32 { return r.Statuses[0].CurrentLimit.GetRequestsPerUnit() }
	if r := s.ask(t, "edge", desc("client", "vip")); limitOf(r) != 100 {
		t.Fatalf("exact value: %v", r)
	}
	for _, tenant := range []string{"tenant-a", "tenant-b"} { // each its own 2
		for i := range 3 {
			r := s.ask(t, "edge", desc("client", tenant))
			if limitOf(r) != 2 || (r.OverallCode == rlsv3.RateLimitResponse_OK) != (i < 2) {
				t.Fatalf("%s request %d: %v", tenant, i, r)
			}
		}
	}
	if r := s.ask(t, "edge", desc("client", "someone")); limitOf(r) != 1 {
		t.Fatalf("key alone: %v", r)
	}
	// free_plan allows 1 an hour, but promo replaces it in a request that
	// carries both: three pass, the fourth is over promo's 3
	for i := range 4 {
		r := s.ask(t, "edge", desc("plan", "free"), desc("promo", "spring"))
		if (r.OverallCode == rlsv3.RateLimitResponse_OK) != (i < 3) {
			t.Fatalf("request %d with the replacing descriptor: %v", i, r)
		}
		if r.Statuses[0].CurrentLimit != nil {
			t.Fatalf("the replaced limit was reported: %v", r.Statuses[0])
		}
	}
	s.ask(t, "edge", desc("plan", "free"))
	if r := s.ask(t, "edge", desc("plan", "free")); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("free_plan alone, second request: %v", r)
	}
}

// SIGTERM with a health Watch stream open (a load balancer's, with no
// deadline): the watcher hears NOT_SERVING for the rate limit service, its
// stream ends, and the process exits at once instead of at the end of
// --drain-timeout (GracefulStop waited for the stream).
func TestServeDrainEndsHealthWatch(t *testing.T) {
	dir := t.TempDir()
	writeRules(t, dir, "api.yaml", apiRules)
	s := startServer(t, "--rules", dir, "--data", t.TempDir(), "--drain-timeout", "60s")
	watch, err := healthpb.NewHealthClient(s.conn).Watch(context.Background(),
		&healthpb.HealthCheckRequest{Service: rlsv3.RateLimitService_ServiceDesc.ServiceName})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := watch.Recv(); err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("first status: %v %v", r, err)
	}
	start := time.Now()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	var statuses []healthpb.HealthCheckResponse_ServingStatus
	for {
		r, err := watch.Recv()
		if err != nil {
			break
		}
		statuses = append(statuses, r.Status)
	}
	if len(statuses) == 0 || statuses[len(statuses)-1] != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("the watcher heard %v, want NOT_SERVING last", statuses)
	}
	select {
	case <-s.done:
	case <-time.After(20 * time.Second):
		t.Fatalf("still running %v after SIGTERM with a Watch stream open\n%s", time.Since(start), s.logs())
	}
	if s.exit != nil {
		t.Fatalf("exit: %v\n%s", s.exit, s.logs())
	}
}

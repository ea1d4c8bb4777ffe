package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// pki makes a CA and a certificate it signs for 127.0.0.1 (server or
// client), written as PEM files in dir.
type pki struct {
	dir    string
	ca     *x509.Certificate
	caKey  *ecdsa.PrivateKey
	caPath string
}

func newPKI(t *testing.T) *pki {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(der)
	p := &pki{dir: t.TempDir(), ca: ca, caKey: key}
	p.caPath = filepath.Join(p.dir, "ca.pem")
	os.WriteFile(p.caPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	return p
}

func (p *pki) issue(t *testing.T, name string, usage x509.ExtKeyUsage) (certPath, keyPath string) {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		KeyUsage: x509.KeyUsageDigitalSignature, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := x509.MarshalECPrivateKey(key)
	certPath, keyPath = filepath.Join(p.dir, name+".pem"), filepath.Join(p.dir, name+"-key.pem")
	os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600)
	return certPath, keyPath
}

// startMutualTLS starts the binary on apiRules with TLS on its gRPC and
// HTTP listeners, requiring client certificates from a fresh CA; it
// returns the CA and a client certificate and key it issued.
func startMutualTLS(t *testing.T) (p *pki, s *server, clientCert, clientKey string) {
	t.Helper()
	p = newPKI(t)
	cert, key := p.issue(t, "server", x509.ExtKeyUsageServerAuth)
	clientCert, clientKey = p.issue(t, "client", x509.ExtKeyUsageClientAuth)
	dir := t.TempDir()
	writeRules(t, dir, "api.yaml", apiRules)
	s = startServerNoClient(t, "--rules", dir, "--data", t.TempDir(), "--tls-cert", cert, "--tls-key", key, "--tls-client-ca", p.caPath)
	return p, s, clientCert, clientKey
}

// TLS with required client certificates on both the gRPC and HTTP
// listeners: a client with a certificate from the CA gets answers; one
// without is refused.
func TestServeMutualTLS(t *testing.T) {
	p, s, ccert, ckey := startMutualTLS(t)

	pool := x509.NewCertPool()
	pool.AddCert(p.ca)
	pair, err := tls.LoadX509KeyPair(ccert, ckey)
	if err != nil {
		t.Fatal(err)
	}
	good := &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}}
	noCert := &tls.Config{RootCAs: pool}

	call := func(conf *tls.Config) error {
		conn, err := grpc.NewClient(s.grpc, grpc.WithTransportCredentials(credentials.NewTLS(conf)))
		if err != nil {
			return err
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err = rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "api",
			Descriptors: []*rlcommon.RateLimitDescriptor{desc("user", "tls")}})
		return err
	}
	if err := call(good); err != nil {
		t.Fatalf("gRPC with a client certificate: %v", err)
	}
	if err := call(noCert); err == nil {
		t.Fatal("gRPC without a client certificate was answered")
	}
	get := func(conf *tls.Config) error {
		c := &http.Client{Transport: &http.Transport{TLSClientConfig: conf}, Timeout: 10 * time.Second}
		resp, err := c.Get("https://" + s.http + "/healthz")
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	if err := get(good); err != nil {
		t.Fatalf("HTTPS with a client certificate: %v", err)
	}
	if err := get(noCert); err == nil {
		t.Fatal("HTTPS without a client certificate was answered")
	}
	// The admin listener too: its bearer token is not sent in the clear.
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: good}, Timeout: 10 * time.Second}
	resp, err := c.Get("https://" + s.addrs["admin"] + "/v1/rules")
	if err != nil {
		t.Fatalf("admin over HTTPS: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("admin over HTTPS: %d", resp.StatusCode)
	}
	if resp, err := http.Get("http://" + s.addrs["admin"] + "/v1/rules"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Fatal("admin answered plain HTTP with TLS configured")
		}
	}
}

func TestCheckCommand(t *testing.T) {
	dir := t.TempDir()
	writeRules(t, dir, "api.yaml", apiRules)
	s := startServer(t, "--rules", dir, "--data", t.TempDir())
	clearOfWindowEnd(t, time.Hour, 30*time.Second) // login: 3 an hour, a fixed window
	var out, errb bytes.Buffer
	code := run([]string{"check", "--addr", s.grpc, "--domain", "api", "--descriptor", "remote_address=10.1.1.1,path=/login"}, &out, &errb)
	// protojson varies its spacing on purpose: compare the parsed answer.
	var got struct {
		OverallCode string
		Statuses    []struct{ CurrentLimit struct{ Name string } }
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("check printed no JSON: %v\n%s", err, out.String())
	}
	if code != 0 || got.OverallCode != "OK" || len(got.Statuses) != 1 || got.Statuses[0].CurrentLimit.Name != "login" {
		t.Fatalf("check: exit %d\n%s\n%s", code, out.String(), errb.String())
	}
	for range 3 {
		out.Reset()
		code = run([]string{"check", "--addr", s.grpc, "--domain", "api", "--descriptor", "remote_address=10.1.1.1,path=/login"}, &out, &errb)
	}
	if code != 3 || !strings.Contains(out.String(), "OVER_LIMIT") {
		t.Fatalf("check over the limit: exit %d, want 3\n%s", code, out.String())
	}
	if code := run([]string{"check", "--domain", "api"}, &out, &errb); code != 2 {
		t.Fatalf("check without a descriptor: exit %d, want 2", code)
	}
}

func TestValidateCommand(t *testing.T) {
	dir := t.TempDir()
	writeRules(t, dir, "good.yaml", apiRules)
	var out, errb bytes.Buffer
	if code := run([]string{"validate", dir}, &out, &errb); code != 0 {
		t.Fatalf("validate good rules: exit %d\n%s", code, errb.String())
	}
	writeRules(t, dir, "bad.yaml", "domain: other\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n")
	errb.Reset()
	if code := run([]string{"validate", dir}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "bad.yaml:5") || !strings.Contains(errb.String(), "fortnight") {
		t.Fatalf("validate a bad file: exit %d, want 1 naming bad.yaml:5\n%s", code, errb.String())
	}

	// A monthly token bucket is fine as 30 days, refused as a calendar
	// month: validate must judge as serve --calendar-month would.
	monthly := t.TempDir()
	writeRules(t, monthly, "m.yaml", "domain: m\ndescriptors:\n  - key: k\n    rate_limit: {unit: month, requests_per_unit: 5, algorithm: token_bucket}\n")
	if code := run([]string{"validate", monthly}, &out, &errb); code != 0 {
		t.Fatalf("monthly token bucket: exit %d", code)
	}
	errb.Reset()
	if code := run([]string{"validate", "--calendar-month", monthly}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "calendar month") {
		t.Fatalf("monthly token bucket with --calendar-month: exit %d\n%s", code, errb.String())
	}
}

// validate reads a directory as serve does: hidden files and
// subdirectories are not rules files, a FIFO is refused unread (it would
// block), a second file for a domain is refused naming the first, and a
// file named on the command line that serve would not read gets a note.
func TestValidateReadsAsServe(t *testing.T) {
	dir := t.TempDir()
	writeRules(t, dir, "a.yaml", domainRules("d1", 5))
	writeRules(t, dir, ".backup.yaml", "not: [valid")
	if err := os.Mkdir(filepath.Join(dir, "sub.yaml"), 0o755); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := run([]string{"validate", dir}, &out, &errb); code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out.String(), errb.String())
	}

	writeRules(t, dir, "b.yaml", domainRules("d1", 7))
	out.Reset()
	errb.Reset()
	if code := run([]string{"validate", dir}, &out, &errb); code != 1 ||
		!strings.Contains(errb.String(), "b.yaml: domain: domain \"d1\" is already defined in "+filepath.Join(dir, "a.yaml")) ||
		!strings.Contains(out.String(), "ok    "+filepath.Join(dir, "a.yaml")) {
		t.Fatalf("duplicate domain: exit %d\n%s%s", code, out.String(), errb.String())
	}
	os.Remove(filepath.Join(dir, "b.yaml"))

	if err := syscall.Mkfifo(filepath.Join(dir, "fifo.yaml"), 0o644); err != nil {
		t.Fatal(err)
	}
	errb.Reset()
	done := make(chan int, 1)
	go func() {
		var o, e bytes.Buffer
		code := run([]string{"validate", dir}, &o, &e)
		errb.WriteString(e.String())
		done <- code
	}()
	select {
	case code := <-done:
		if code != 1 || !strings.Contains(errb.String(), "fifo.yaml: not a regular file (a named pipe)") {
			t.Fatalf("FIFO: exit %d\n%s", code, errb.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("validate blocked on a FIFO")
	}

	txt := filepath.Join(t.TempDir(), "rules.txt")
	if err := os.WriteFile(txt, []byte(domainRules("d1", 5)), 0o644); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if code := run([]string{"validate", txt}, &out, &errb); code != 0 || !strings.Contains(out.String(), "serve would not read this name") {
		t.Fatalf("a .txt file named: exit %d\n%s", code, out.String())
	}
}

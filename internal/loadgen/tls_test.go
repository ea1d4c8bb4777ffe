package loadgen

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

func TestTLS(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ratelimit.test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		DNSNames: []string{"ratelimit.test"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	lis := listen(t)
	s := serveHandler(lis, emptyHandler{}, grpc.Creds(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}},
	})))
	defer s.Stop()
	addr := lis.Addr().String()

	for _, tc := range []struct {
		name string
		tls  TLSConfig
		err  string
	}{
		{"ca", TLSConfig{Enabled: true, CAFile: ca}, ""},
		{"server name", TLSConfig{Enabled: true, CAFile: ca, ServerName: "ratelimit.test"}, ""},
		{"insecure", TLSConfig{Enabled: true, Insecure: true}, ""},
		{"unknown authority", TLSConfig{Enabled: true}, "cannot reach"},
		{"plaintext", TLSConfig{}, "cannot reach"},
		{"missing ca", TLSConfig{Enabled: true, CAFile: filepath.Join(dir, "nope.pem")}, "TLS: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// a short timeout where the connection must fail; where it
			// must work, one a starved host meets (a handshake under -race
			// on 2 shared cores can take longer than 250 ms)
			timeout := 250 * time.Millisecond
			if tc.err == "" {
				timeout = starvedTimeout
			}
			res, err := Run(context.Background(), Config{Addr: addr, Concurrency: 2, Duration: 100 * time.Millisecond, Timeout: timeout, TLS: tc.tls})
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			checkSane(t, res, timeout)
		})
	}
}

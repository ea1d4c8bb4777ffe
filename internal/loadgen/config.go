package loadgen

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// Entry is one key=value entry of a rate limit descriptor.
type Entry struct{ Key, Value string }

// Descriptor is the ordered entries of one RateLimitDescriptor.
type Descriptor []Entry

func (d Descriptor) String() string {
	var b strings.Builder
	for i, e := range d {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(e.Key)
		b.WriteByte('=')
		b.WriteString(e.Value)
	}
	return b.String()
}

// ParseDescriptor parses "key=value[,key2=value2...]". Keys must be
// non-empty; a value may hold '=' but not ','.
func ParseDescriptor(s string) (Descriptor, error) {
	if strings.TrimSpace(s) == "" {
		return nil, errors.New("empty descriptor (want key=value[,key2=value2])")
	}
	var d Descriptor
	for _, part := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(part, "=")
		if !ok {
			return nil, fmt.Errorf("descriptor entry %q is not key=value", part)
		}
		k = strings.TrimSpace(k)
		if k == "" {
			return nil, fmt.Errorf("descriptor entry %q has an empty key", part)
		}
		if v == "" {
			return nil, fmt.Errorf("descriptor entry %q has an empty value", part)
		}
		d = append(d, Entry{k, v})
	}
	return d, nil
}

// TLSConfig holds the client-side TLS options; the zero value is plaintext.
type TLSConfig struct {
	Enabled    bool
	CAFile     string // PEM roots to verify the server with; system roots if empty
	CertFile   string // client certificate (mTLS), with KeyFile
	KeyFile    string
	ServerName string // overrides the name verified and sent as SNI
	Insecure   bool   // skip verification of the server certificate
}

// AddFlags registers the client TLS flags on fs: --tls, --tls-ca,
// --tls-cert, --tls-key, --tls-server-name and --tls-insecure. Call Resolve
// after parsing.
func (t *TLSConfig) AddFlags(fs *flag.FlagSet) {
	fs.BoolVar(&t.Enabled, "tls", false, "use TLS (implied by the other --tls-* flags)")
	fs.StringVar(&t.CAFile, "tls-ca", "", "PEM `file` of roots to verify the server with (default: system roots)")
	fs.StringVar(&t.CertFile, "tls-cert", "", "client certificate PEM `file` (mTLS; with --tls-key)")
	fs.StringVar(&t.KeyFile, "tls-key", "", "client key PEM `file`")
	fs.StringVar(&t.ServerName, "tls-server-name", "", "server `name` to verify and send as SNI")
	fs.BoolVar(&t.Insecure, "tls-insecure", false, "do not verify the server certificate")
}

// Resolve checks the parsed flags (--tls-cert and --tls-key go together)
// and sets Enabled when another --tls-* flag implies it.
func (t *TLSConfig) Resolve() error {
	if (t.CertFile == "") != (t.KeyFile == "") {
		return errors.New("--tls-cert and --tls-key go together")
	}
	if t.CAFile != "" || t.CertFile != "" || t.ServerName != "" || t.Insecure {
		t.Enabled = true
	}
	return nil
}

// Credentials returns the gRPC transport credentials t describes: TLS when
// Enabled, plaintext otherwise.
func (t TLSConfig) Credentials() (credentials.TransportCredentials, error) {
	if !t.Enabled {
		return insecure.NewCredentials(), nil
	}
	return t.credentials()
}

func (t TLSConfig) credentials() (credentials.TransportCredentials, error) {
	c := &tls.Config{ServerName: t.ServerName, InsecureSkipVerify: t.Insecure, MinVersion: tls.VersionTLS12}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s: no PEM certificate found", t.CAFile)
		}
		c.RootCAs = pool
	}
	if t.CertFile != "" || t.KeyFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, err
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return credentials.NewTLS(c), nil
}

// Config describes one benchmark run. Rate > 0 selects the open loop (a
// fixed offered rate); otherwise Concurrency callers run closed-loop.
type Config struct {
	Addr        string
	Conns       int // gRPC connections (HTTP/2 transports); callers are spread over them
	Concurrency int // closed loop: callers, each with one request in flight
	Rate        float64
	MaxInFlight int // open loop: most requests in flight (workers) at once

	Duration time.Duration // measured phase
	Warmup   time.Duration // load before it, not measured
	Timeout  time.Duration // per request

	// LateThreshold: an open-loop request that goes out more than this
	// after its intended send time is counted as late.
	LateThreshold time.Duration

	Domain      string
	Descriptors []Descriptor
	// Keys distinct keys: the last entry of every descriptor gets a numeric
	// suffix 0..Keys-1, one drawn uniformly per request (the same for all of
	// the request's descriptors). Keys <= 1 sends the values as given.
	Keys int
	Hits uint32 // hits_addend; 0 leaves it unset (the server counts 1)

	TLS TLSConfig

	CPUPid int // server process to charge CPU time to; 0 for none
	// StorePid is the store's process (a redis-server the server calls),
	// whose CPU time per decision is reported beside the server's; 0 for
	// none.
	StorePid int

	// Progress, if not nil, gets a line every second while the run goes on.
	Progress io.Writer
}

func (c *Config) setDefaults() {
	if c.Conns <= 0 {
		c.Conns = 1
	}
	if c.Concurrency <= 0 {
		c.Concurrency = 64
	}
	if c.MaxInFlight <= 0 {
		c.MaxInFlight = 10000
	}
	if c.Duration <= 0 {
		c.Duration = 10 * time.Second
	}
	if c.Timeout <= 0 {
		c.Timeout = 5 * time.Second
	}
	if c.LateThreshold <= 0 {
		c.LateThreshold = defaultLate
	}
	if c.Keys <= 0 {
		c.Keys = 1
	}
	if c.Domain == "" {
		c.Domain = "bench"
	}
	if len(c.Descriptors) == 0 {
		c.Descriptors = []Descriptor{{{"generic_key", "bench"}}}
	}
}

const defaultLate = time.Millisecond

// requests hands out the request for each call: prebuilt (and shared, which
// protobuf allows for concurrent marshaling) for up to prebuildMax keys,
// built per call above that.
type requests struct {
	cfg      *Config
	prebuilt []*rlsv3.RateLimitRequest
}

const prebuildMax = 1 << 16

func newRequests(cfg *Config) *requests {
	r := &requests{cfg: cfg}
	if cfg.Keys <= prebuildMax {
		r.prebuilt = make([]*rlsv3.RateLimitRequest, cfg.Keys)
		for k := range r.prebuilt {
			r.prebuilt[k] = r.build(k)
		}
	}
	return r
}

func (r *requests) get(k int) *rlsv3.RateLimitRequest {
	if r.prebuilt != nil {
		return r.prebuilt[k]
	}
	return r.build(k)
}

func (r *requests) build(k int) *rlsv3.RateLimitRequest {
	req := &rlsv3.RateLimitRequest{Domain: r.cfg.Domain, HitsAddend: r.cfg.Hits}
	for _, d := range r.cfg.Descriptors {
		pd := &rlcommon.RateLimitDescriptor{}
		for i, e := range d {
			v := e.Value
			if r.cfg.Keys > 1 && i == len(d)-1 {
				v += strconv.Itoa(k)
			}
			pd.Entries = append(pd.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: e.Key, Value: v})
		}
		req.Descriptors = append(req.Descriptors, pd)
	}
	return req
}

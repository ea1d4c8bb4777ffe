package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/floodgate/floodgate/gate"
	"github.com/floodgate/floodgate/internal/loadgen"
	"github.com/floodgate/floodgate/rules"
)

// validate checks every rule file of a directory (or single files) without
// starting anything: exit 0 when all are good, 1 with each error (file,
// line, field) otherwise.
func validate(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("validate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	calendarMonth := fs.Bool("calendar-month", envBool("CALENDAR_MONTH"),
		"unit: month is a calendar month, as serve and proxy take it [FLOODGATE_CALENDAR_MONTH]")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: floodgate validate [--calendar-month] DIR|FILE...")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	args = fs.Args()
	if len(args) == 0 {
		fs.Usage()
		return 2
	}
	opts := rules.Options{CalendarMonth: *calendarMonth}
	var files []string
	named := map[string]bool{} // files named on the command line
	for _, a := range args {
		info, err := os.Stat(a)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		if !info.IsDir() {
			files = append(files, a)
			named[a] = true
			continue
		}
		m, skipped, err := rules.List(a) // what serve and proxy read, and skip
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		for _, s := range skipped {
			fmt.Fprintf(stdout, "skip  %s\n      note: not loaded: a rules directory's files are its own *.yaml and *.yml (envoyproxy/ratelimit reads every file, subdirectories included)\n", s)
		}
		files = append(files, m...)
	}
	if len(files) == 0 {
		fmt.Fprintln(stderr, "no *.yaml or *.yml files found")
		return 1
	}
	bad := 0
	byDomain := map[string]string{} // the file declaring each domain
	var domains []*rules.Domain
	for _, f := range files {
		data, err := rules.ReadFile(f)
		if err == nil {
			var d *rules.Domain
			if d, err = rules.ParseWith(f, data, opts); err == nil {
				if other, dup := byDomain[d.Name]; dup {
					err = rules.DuplicateDomain(f, d.Name, other)
				} else {
					byDomain[d.Name] = f
					domains = append(domains, d)
					fmt.Fprintf(stdout, "ok    %s (domain %q)\n", f, d.Name)
					if named[f] && !rules.IsRulesFile(filepath.Base(f)) {
						fmt.Fprintf(stdout, "      note: a rules directory's files are its *.yaml and *.yml, not hidden; serve would not read this name\n")
					}
					continue
				}
			}
		}
		bad++
		fmt.Fprintf(stderr, "FAIL  %s\n%s\n", f, indent(err.Error()))
	}
	if bad > 0 {
		fmt.Fprintf(stderr, "%d of %d files refused\n", bad, len(files))
		return 1
	}
	// what only the files together can break: the proxy's limits from
	// every file's http routes
	cfg, err := rules.NewConfig(domains...)
	if err == nil {
		_, err = gate.FromRules(cfg)
	}
	if err != nil {
		fmt.Fprintf(stderr, "FAIL  the files together\n%s\n", indent(err.Error()))
		return 1
	}
	return 0
}

func indent(s string) string {
	return "      " + strings.ReplaceAll(strings.TrimSpace(s), "\n", "\n      ")
}

// check asks a running server about one or more descriptors.
func check(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:8081", "the server's gRPC address")
	domain := fs.String("domain", "", "the domain")
	hits := fs.Uint("hits", 1, "hits to add (0 checks without consuming)")
	timeout := fs.Duration("timeout", 5*time.Second, "deadline of the call")
	var descs multiFlag
	fs.Var(&descs, "descriptor", "key=value[,key2=value2...] (repeat for several descriptors)")
	var tlsConf loadgen.TLSConfig // the same client TLS flags as floodgate bench
	tlsConf.AddFlags(fs)
	if err := parseFlags(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *domain == "" || len(descs) == 0 || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "usage: floodgate check --addr HOST:PORT --domain D --descriptor key=value[,key=value] [--hits N] [--tls-ca FILE ...]")
		return 2
	}
	if err := tlsConf.Resolve(); err != nil {
		fmt.Fprintln(stderr, "floodgate check:", err)
		return 2
	}
	creds, err := tlsConf.Credentials()
	if err != nil {
		fmt.Fprintln(stderr, "floodgate check: TLS:", err)
		return 1
	}
	req := &rlsv3.RateLimitRequest{Domain: *domain, HitsAddend: uint32(*hits)}
	for _, d := range descs {
		var desc rlcommon.RateLimitDescriptor
		for _, kv := range strings.Split(d, ",") {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				fmt.Fprintf(stderr, "--descriptor %q: want key=value pairs separated by commas\n", d)
				return 2
			}
			desc.Entries = append(desc.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: k, Value: v})
		}
		req.Descriptors = append(req.Descriptors, &desc)
	}
	if *hits == 0 || *hits > math.MaxUint32 {
		// 0 checks without consuming: said on each descriptor, as the
		// request's 0 means 1. Hits beyond the request's 32 bits go on
		// each descriptor (64 bits) too: cut to 32, 2^32 hits were sent
		// as 0, counted as 1.
		req.HitsAddend = 0
		for _, d := range req.Descriptors {
			d.HitsAddend = wrapperspb.UInt64(uint64(*hits))
		}
	}
	conn, err := grpc.NewClient(*addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	resp, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, req)
	if err != nil {
		fmt.Fprintln(stderr, "ShouldRateLimit:", err)
		if hint := tlsHint(err, tlsConf); hint != "" {
			fmt.Fprintln(stderr, hint)
		}
		return 1
	}
	out, _ := protojson.MarshalOptions{Multiline: true, Indent: "  "}.Marshal(resp)
	var pretty json.RawMessage = out
	fmt.Fprintln(stdout, string(pretty))
	if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
		return 3
	}
	return 0
}

// tlsHint explains a failed call when TLS is the likely cause: plaintext
// to a TLS listener (which drops the connection before gRPC's server
// preface), a server certificate that did not verify, or a server that
// requires a client certificate (when its alert arrives).
func tlsHint(err error, t loadgen.TLSConfig) string {
	if status.Code(err) != codes.Unavailable {
		return ""
	}
	msg := status.Convert(err).Message()
	switch {
	case !t.Enabled && containsAny(msg, "server preface", "EOF", "connection reset", "broken pipe"):
		return "floodgate check: no answer over plaintext gRPC; if the server runs with --tls-cert, " +
			"call it with TLS: --tls-ca FILE (its CA), or --tls for the system roots"
	case strings.Contains(msg, "x509:"):
		return "floodgate check: the server's certificate did not verify: give its CA with --tls-ca FILE " +
			"(and --tls-server-name if it is issued for another name)"
	case strings.Contains(msg, "tls: certificate required"):
		return "floodgate check: the server requires a client certificate: --tls-cert FILE --tls-key FILE"
	}
	return ""
}

func containsAny(s string, subs ...string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, " ") }
func (m *multiFlag) Set(s string) error { *m = append(*m, s); return nil }

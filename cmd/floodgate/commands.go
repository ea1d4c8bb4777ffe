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
	opts, args, code := validateFlags(args, stderr)
	if len(args) == 0 {
		return code
	}
	files, named, err := validateFiles(args, stdout)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	if len(files) == 0 {
		fmt.Fprintln(stderr, "no *.yaml or *.yml files found")
		return 1
	}
	domains, bad := validateEach(files, named, opts, stdout, stderr)
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

// validateFlags parses validate's command line: the options and the files
// and directories named, or none and the exit code.
func validateFlags(args []string, stderr io.Writer) (rules.Options, []string, int) {
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
			return rules.Options{}, nil, 0
		}
		return rules.Options{}, nil, 2
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return rules.Options{}, nil, 2
	}
	return rules.Options{CalendarMonth: *calendarMonth}, fs.Args(), 0
}

// validateFiles lists the rules files of args: a file as named, a
// directory's as serve and proxy read it (the entries they skip are noted
// on stdout). named holds the files named on the command line.
func validateFiles(args []string, stdout io.Writer) (files []string, named map[string]bool, err error) {
	named = map[string]bool{}
	for _, a := range args {
		info, err := os.Stat(a)
		if err != nil {
			return nil, nil, err
		}
		if !info.IsDir() {
			files = append(files, a)
			named[a] = true
			continue
		}
		m, skipped, err := rules.List(a) // what serve and proxy read, and skip
		if err != nil {
			return nil, nil, err
		}
		for _, s := range skipped {
			fmt.Fprintf(stdout, "skip  %s\n      note: not loaded: a rules directory's files are its own *.yaml and *.yml (envoyproxy/ratelimit reads every file, subdirectories included)\n", s)
		}
		files = append(files, m...)
	}
	return files, named, nil
}

// validateEach reads and parses each file, saying ok or FAIL for each; a
// file declaring a domain an earlier file declared fails. It returns the
// domains of the good files and the number of bad ones.
func validateEach(files []string, named map[string]bool, opts rules.Options, stdout, stderr io.Writer) ([]*rules.Domain, int) {
	bad := 0
	byDomain := map[string]string{} // the file declaring each domain
	var domains []*rules.Domain
	for _, f := range files {
		d, err := validateFile(f, opts, byDomain)
		if err != nil {
			bad++
			fmt.Fprintf(stderr, "FAIL  %s\n%s\n", f, indent(err.Error()))
			continue
		}
		byDomain[d.Name] = f
		domains = append(domains, d)
		fmt.Fprintf(stdout, "ok    %s (domain %q)\n", f, d.Name)
		if named[f] && !rules.IsRulesFile(filepath.Base(f)) {
			fmt.Fprintf(stdout, "      note: a rules directory's files are its *.yaml and *.yml, not hidden; serve would not read this name\n")
		}
	}
	return domains, bad
}

// validateFile reads and parses one file, whose domain must not be one of
// byDomain's.
func validateFile(f string, opts rules.Options, byDomain map[string]string) (*rules.Domain, error) {
	data, err := rules.ReadFile(f)
	if err != nil {
		return nil, err
	}
	d, err := rules.ParseWith(f, data, opts)
	if err != nil {
		return nil, err
	}
	if other, dup := byDomain[d.Name]; dup {
		return nil, rules.DuplicateDomain(f, d.Name, other)
	}
	return d, nil
}

func indent(s string) string {
	return "      " + strings.ReplaceAll(strings.TrimSpace(s), "\n", "\n      ")
}

// check asks a running server about one or more descriptors.
func check(args []string, stdout, stderr io.Writer) int {
	a, code := checkFlags(args, stderr)
	if a == nil {
		return code
	}
	creds, err := a.tls.Credentials()
	if err != nil {
		fmt.Fprintln(stderr, "floodgate check: TLS:", err)
		return 1
	}
	if a.capacity.resource != "" {
		return a.capacity.run(a.addr, creds, a.timeout, stdout, stderr)
	}
	req, err := a.request()
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	conn, err := grpc.NewClient(a.addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), a.timeout)
	defer cancel()
	resp, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, req)
	if err != nil {
		fmt.Fprintln(stderr, "ShouldRateLimit:", err)
		if hint := tlsHint(err, a.tls); hint != "" {
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

// checkArgs is what check is told.
type checkArgs struct {
	addr, domain string
	hits         uint
	timeout      time.Duration
	descs        multiFlag
	tls          loadgen.TLSConfig // the same client TLS flags as floodgate bench
	capacity     capacityCheck     // --capacity: ask for a lease instead (checkcapacity.go)
}

// checkFlags parses check's command line: its arguments, or nil and the
// exit code.
func checkFlags(args []string, stderr io.Writer) (*checkArgs, int) {
	a := &checkArgs{}
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&a.addr, "addr", "127.0.0.1:8081", "the server's gRPC address")
	fs.StringVar(&a.domain, "domain", "", "the domain")
	fs.UintVar(&a.hits, "hits", 1, "hits to add (0 checks without consuming)")
	fs.DurationVar(&a.timeout, "timeout", 5*time.Second, "deadline of the call")
	fs.Var(&a.descs, "descriptor", "key=value[,key2=value2...] (repeat for several descriptors)")
	fs.Func("server", "the server's gRPC address (the same as --addr)", func(v string) error { a.addr = v; return nil })
	a.capacity.register(fs)
	a.tls.AddFlags(fs)
	if err := parseFlags(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, 0
		}
		return nil, 2
	}
	if a.capacity.resource != "" {
		if err := a.capacity.check(a.domain, len(a.descs), fs.NArg()); err != nil {
			fmt.Fprintln(stderr, "floodgate check:", err)
			return nil, 2
		}
	} else if a.domain == "" || len(a.descs) == 0 || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "usage: floodgate check --addr HOST:PORT --domain D --descriptor key=value[,key=value] [--hits N] [--tls-ca FILE ...]\n       floodgate check --server HOST:PORT --capacity RESOURCE --wants N [--priority P] [--client-id ID] [--release=false]")
		return nil, 2
	}
	if err := a.tls.Resolve(); err != nil {
		fmt.Fprintln(stderr, "floodgate check:", err)
		return nil, 2
	}
	return a, 0
}

// request is the RateLimitRequest of the descriptors and hits.
func (a *checkArgs) request() (*rlsv3.RateLimitRequest, error) {
	req := &rlsv3.RateLimitRequest{Domain: a.domain, HitsAddend: uint32(a.hits)}
	for _, d := range a.descs {
		var desc rlcommon.RateLimitDescriptor
		for _, kv := range strings.Split(d, ",") {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				return nil, fmt.Errorf("--descriptor %q: want key=value pairs separated by commas", d)
			}
			desc.Entries = append(desc.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: k, Value: v})
		}
		req.Descriptors = append(req.Descriptors, &desc)
	}
	if a.hits == 0 || a.hits > math.MaxUint32 {
		// 0 checks without consuming: said on each descriptor, as the
		// request's 0 means 1. Hits beyond the request's 32 bits go on
		// each descriptor (64 bits) too: cut to 32, 2^32 hits were sent
		// as 0, counted as 1.
		req.HitsAddend = 0
		for _, d := range req.Descriptors {
			d.HitsAddend = wrapperspb.UInt64(uint64(a.hits))
		}
	}
	return req, nil
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

// Command floodgate is the Floodgate rate limiter's command line.
//
//	floodgate serve [flags]         the rate-limit service (Envoy's API over gRPC, HTTP/JSON, admin)
//	floodgate proxy [flags]         a rate-limiting reverse proxy in front of an HTTP service
//	floodgate validate DIR|FILE...  check rule files without starting
//	floodgate check [flags]         ask a running server about a descriptor
//	floodgate bench [flags]         drive ShouldRateLimit and report throughput and latency
//	floodgate inspect|reset ...     a key's state on a running server, or forget it (admin API)
//	floodgate top [flags]           the heaviest keys per rule, live (admin API)
//	floodgate overrides ...         get, set, delete, list, import and export per-key overrides (admin API)
//	floodgate deadletters ...       list and requeue the proxy's deferred requests that failed (proxy's admin API)
//	floodgate version               print the version
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	_ "time/tzdata" // rule files name time zones; the binary carries the zone database

	"github.com/floodgate/floodgate/internal/loadgen"
)

// version is set at build time with -ldflags "-X main.version=v1.2.3".
var version = "dev"

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	switch args[0] {
	case "serve":
		return serve(context.Background(), args[1:], stdout, stderr)
	case "proxy":
		return proxyCommand(context.Background(), args[1:], stdout, stderr)
	case "validate":
		return validate(args[1:], stdout, stderr)
	case "check":
		return check(args[1:], stdout, stderr)
	case "bench":
		return loadgen.Main(args[1:], stdout, stderr)
	case "inspect":
		return inspectCommand(args[1:], stdout, stderr)
	case "reset":
		return resetCommand(args[1:], stdout, stderr)
	case "top":
		return topCommand(args[1:], stdout, stderr)
	case "overrides":
		return overridesCommand(args[1:], stdout, stderr)
	case "deadletters":
		return deadlettersCommand(args[1:], stdout, stderr)
	case "version", "--version", "-v":
		fmt.Fprintf(stdout, "floodgate %s (%s, %s/%s)\n", buildVersion(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
		return 0
	case "help", "--help", "-h":
		if len(args) > 1 && args[1] != "help" {
			// a command's own help, on stdout: its flags and exit codes
			return run(append(args[1:], "-h"), stdout, stdout)
		}
		usage(stdout)
		return 0
	}
	fmt.Fprintf(stderr, "floodgate: unknown command %q\n\n", args[0])
	usage(stderr)
	return 2
}

func buildVersion() string {
	if version != "dev" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return version
}

func usage(w io.Writer) {
	fmt.Fprint(w, `usage: floodgate <command>

commands:
  serve      run the rate-limit service (floodgate serve -h for its flags)
  proxy      a rate-limiting reverse proxy: floodgate proxy --upstream URL (floodgate proxy -h)
  validate   check rule files: floodgate validate DIR|FILE...
  check      ask a running server: floodgate check --domain D --descriptor key=value
             or for a capacity lease: floodgate check --capacity RESOURCE --wants N
  bench      load-test a server's ShouldRateLimit (floodgate bench -h)
  inspect    a key's state and next decision: floodgate inspect --domain D key=value...
  reset      forget a key's state: floodgate reset --domain D key=value...
  top        the heaviest keys per rule, live: floodgate top [--domain D] [--rule R] [--watch]
  overrides  per-key overrides: floodgate overrides get|set|delete|list|import FILE|export
  deadletters  the proxy's deferred requests whose delivery failed:
             floodgate deadletters list | requeue --queue NAME ID...|--all
  version    print the version and exit
  help       print this help; floodgate help CMD: a command's flags and exit codes
`)
}

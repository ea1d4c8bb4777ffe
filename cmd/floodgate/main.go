// Command floodgate is the Floodgate rate limiter's command line.
//
//	floodgate serve [flags]         the rate-limit service (Envoy's API over gRPC, HTTP/JSON, admin)
//	floodgate proxy [flags]         a rate-limiting reverse proxy in front of an HTTP service
//	floodgate validate DIR|FILE...  check rule files without starting
//	floodgate check [flags]         ask a running server about a descriptor
//	floodgate bench [flags]         drive ShouldRateLimit and report throughput and latency
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
	case "version", "--version", "-v":
		fmt.Fprintf(stdout, "floodgate %s (%s, %s/%s)\n", buildVersion(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
		return 0
	case "help", "--help", "-h":
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
  version    print the version and exit
  help       print this help
`)
}

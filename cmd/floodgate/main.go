// Command floodgate is the Floodgate rate limiter's command line.
//
//	floodgate version    print the version
//
// Later releases add "serve" (the rate-limit service) and "proxy" (a
// rate-limiting reverse proxy).
package main

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
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
  version   print the version and exit
  help      print this help
`)
}

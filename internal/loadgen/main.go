package loadgen

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/floodgate/floodgate/internal/gcfloor"
)

const usageText = `usage: floodgate bench --addr HOST:PORT [flags]
       floodgate bench --serve-empty HOST:PORT [--stock]

Drives Envoy's RateLimitService/ShouldRateLimit over gRPC and reports
requests/s, OK / OVER_LIMIT / error counts and latency percentiles.

Closed loop (default): --concurrency callers, each sending its next request
when the previous one is answered. Open loop (--rate R): R requests/s on a
fixed schedule whatever the server does; latency is measured from each
request's intended send time, so stalls are not hidden (no coordinated
omission). Workers are started as needed, up to --max-inflight.

--serve-empty ADDR runs a RateLimitService that answers OK with no work, the
ceiling of the gRPC stack, until interrupted: with the gRPC options and
garbage-collection floor of floodgate serve, or with --stock as grpc-go and
the Go runtime come (grpc.NewServer() with no options, GOGC as set).

Flags:
`

// Main is the "floodgate bench" command: it parses args (without the
// command name), runs the benchmark or the empty server, and returns the
// exit code: 0 on success, 1 if the run failed, 2 for a usage error.
// SIGINT or SIGTERM ends a benchmark early (its summary covers what was
// measured) or stops the empty server; a second one kills the process.
func Main(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		stop() // restore the default handling: a second ^C kills
	}()
	return mainCtx(ctx, args, stdout, stderr)
}

type options struct {
	cfg        Config
	jsonOut    bool
	quiet      bool
	serveEmpty string
	stock      bool
}

type descriptorFlag struct{ d *[]Descriptor }

func (f descriptorFlag) String() string {
	if f.d == nil {
		return ""
	}
	var s []string
	for _, d := range *f.d {
		s = append(s, d.String())
	}
	return strings.Join(s, " ")
}

func (f descriptorFlag) Set(s string) error {
	d, err := ParseDescriptor(s)
	if err != nil {
		return err
	}
	*f.d = append(*f.d, d)
	return nil
}

// usageError is a bad command line: exit code 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func parseArgs(args []string, help io.Writer) (*options, error) {
	o := &options{}
	var hits uint64
	fs := o.flagSet(&hits)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(help, usageText)
			fs.SetOutput(help)
			fs.PrintDefaults()
			return nil, err
		}
		return nil, usageError{err.Error()}
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if fs.NArg() > 0 {
		return nil, usageError{fmt.Sprintf("unexpected argument %q (flags only)", fs.Arg(0))}
	}
	if o.serveEmpty != "" {
		for name := range set {
			if name != "serve-empty" && name != "stock" {
				return nil, usageError{fmt.Sprintf("--serve-empty takes no other flag but --stock (got --%s)", name)}
			}
		}
		return o, nil
	}
	if err := checkBench(&o.cfg, set, hits); err != nil {
		return nil, err
	}
	o.cfg.Hits = uint32(hits)
	return o, nil
}

// flagSet is bench's flags, set into o (and --hits into hits).
func (o *options) flagSet(hits *uint64) *flag.FlagSet {
	c := &o.cfg
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&c.Addr, "addr", "", "`host:port` of the rate limit service (required)")
	fs.IntVar(&c.Conns, "conns", 1, "gRPC connections to spread the load over")
	fs.IntVar(&c.Concurrency, "concurrency", 64, "closed loop: concurrent callers")
	fs.Float64Var(&c.Rate, "rate", 0, "open loop: offered `requests/s` on a fixed schedule (0: closed loop)")
	fs.IntVar(&c.MaxInFlight, "max-inflight", 10000, "open loop: most requests in flight at once")
	fs.DurationVar(&c.Duration, "duration", 10*time.Second, "measured phase")
	fs.DurationVar(&c.Warmup, "warmup", 2*time.Second, "unmeasured load before it")
	fs.DurationVar(&c.Timeout, "timeout", 5*time.Second, "per-request deadline")
	fs.DurationVar(&c.LateThreshold, "late", defaultLate, "open loop: a request sent later than this after its intended time counts as late")
	fs.StringVar(&c.Domain, "domain", "bench", "rate limit domain")
	fs.Var(descriptorFlag{&c.Descriptors}, "descriptor", "one descriptor `key=value[,key2=value2]` of every request; repeatable (default generic_key=bench)")
	fs.IntVar(&c.Keys, "keys", 1, "distinct keys: the last entry of each descriptor gets a suffix 0..N-1 drawn uniformly per request (1: one hot key, no suffix)")
	fs.Uint64Var(hits, "hits", 1, "hits_addend of every request (0 leaves it unset)")
	c.TLS.AddFlags(fs)
	fs.IntVar(&c.CPUPid, "cpu-pid", 0, "server `pid`: report its CPU time per decision, from /proc/PID/stat")
	fs.IntVar(&c.StorePid, "store-pid", 0, "store `pid` (a redis-server the server uses): report its CPU time per decision too")
	fs.BoolVar(&o.jsonOut, "json", false, "print the summary as JSON")
	fs.BoolVar(&o.quiet, "quiet", false, "no progress lines on stderr")
	fs.StringVar(&o.serveEmpty, "serve-empty", "", "run the empty RateLimitService on `host:port` until interrupted")
	fs.BoolVar(&o.stock, "stock", false, "with --serve-empty: grpc-go's default server options and no garbage-collection floor")
	return fs
}

// checkBench checks a benchmark's flags (set: those given), each against
// the rules below in turn: the first broken is the usage error.
func checkBench(c *Config, set map[string]bool, hits uint64) error {
	_, _, addrErr := net.SplitHostPort(c.Addr)
	for _, r := range []struct {
		broken bool
		msg    string
	}{
		{set["stock"], "--stock goes with --serve-empty"},
		{c.Addr == "", "--addr HOST:PORT is required"},
		{addrErr != nil, fmt.Sprintf("--addr %q: want host:port", c.Addr)},
		{c.Conns < 1, fmt.Sprintf("--conns must be at least 1 (got %d)", c.Conns)},
		{c.Concurrency < 1, fmt.Sprintf("--concurrency must be at least 1 (got %d)", c.Concurrency)},
		{c.Rate < 0 || math.IsNaN(c.Rate) || math.IsInf(c.Rate, 0), fmt.Sprintf("--rate must be a positive number of requests/s (got %v)", c.Rate)},
		{set["rate"] && c.Rate == 0, "--rate must be positive (omit it for the closed loop)"},
		{set["rate"] && set["concurrency"], "--rate (open loop) and --concurrency (closed loop) exclude each other; bound the open loop with --max-inflight"},
		{!set["rate"] && (set["max-inflight"] || set["late"]), "--max-inflight and --late apply to the open loop only (add --rate)"},
		{c.MaxInFlight < 1, fmt.Sprintf("--max-inflight must be at least 1 (got %d)", c.MaxInFlight)},
		{c.Duration <= 0, fmt.Sprintf("--duration must be positive (got %v)", c.Duration)},
		{c.Warmup < 0, fmt.Sprintf("--warmup must not be negative (got %v)", c.Warmup)},
		{c.Timeout <= 0, fmt.Sprintf("--timeout must be positive (got %v)", c.Timeout)},
		{c.LateThreshold <= 0, fmt.Sprintf("--late must be positive (got %v)", c.LateThreshold)},
		{c.Domain == "", "--domain must not be empty"},
		{c.Keys < 1, fmt.Sprintf("--keys must be at least 1 (got %d)", c.Keys)},
		{hits > math.MaxUint32, fmt.Sprintf("--hits %d is out of range (max %d)", hits, uint64(math.MaxUint32))},
		{c.CPUPid < 0, fmt.Sprintf("--cpu-pid must be a process id (got %d)", c.CPUPid)},
		{c.StorePid < 0, fmt.Sprintf("--store-pid must be a process id (got %d)", c.StorePid)},
	} {
		if r.broken {
			return usageError{r.msg}
		}
	}
	if err := c.TLS.Resolve(); err != nil {
		return usageError{err.Error()}
	}
	if c.Rate > 0 && c.Duration.Seconds()*c.Rate < 1 {
		return usageError{fmt.Sprintf("--rate %v over --duration %v schedules no request", c.Rate, c.Duration)}
	}
	return nil
}

func mainCtx(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseArgs(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "floodgate bench: %v\nRun 'floodgate bench -h' for the flags.\n", err)
		return 2
	}
	if o.serveEmpty != "" {
		return serveEmpty(ctx, o.serveEmpty, o.stock, stderr)
	}
	if !o.quiet {
		o.cfg.Progress = stderr
	}
	res, err := Run(ctx, o.cfg)
	if err != nil {
		fmt.Fprintf(stderr, "floodgate bench: %v\n", err)
		return 1
	}
	if o.jsonOut {
		err = res.WriteJSON(stdout)
	} else {
		err = res.WriteText(stdout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "floodgate bench: %v\n", err)
		return 1
	}
	return 0
}

func serveEmpty(ctx context.Context, addr string, stock bool, stderr io.Writer) int {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintf(stderr, "floodgate bench: %v\n", err)
		return 1
	}
	s, kind := StockEmptyServer(lis), "stock "
	if !stock {
		gcfloor.Set(gcfloor.Default) // as `floodgate serve` runs
		s, kind = EmptyServer(lis), ""
	}
	fmt.Fprintf(stderr, "floodgate bench: %sempty RateLimitService on %s (pid %d); interrupt to stop\n", kind, lis.Addr(), os.Getpid())
	<-ctx.Done()
	done := make(chan struct{})
	go func() { s.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		s.Stop()
	}
	return 0
}

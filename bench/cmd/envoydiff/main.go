// Command envoydiff is a differential check of `floodgate serve` against
// envoyproxy/ratelimit, the service it stands in for.
//
// For each group of rules files (envoyproxy/ratelimit's own test and example
// files, read from its module source at run time, unmodified), it starts a
// private redis-server on a free loopback port, envoyproxy/ratelimit on it,
// and `floodgate serve` on the same rules (on the same redis-server, or in
// memory), sends both the same sequence of ShouldRateLimit requests and
// compares the answers: whether the call fails, overall_code, and per
// descriptor code, current_limit (requests_per_unit, unit, name),
// limit_remaining and duration_until_reset (within a tolerance, since both
// count windows aligned to the wall clock).
//
// It also loads each of envoyproxy/ratelimit's test configuration files
// with both (its config_check_cmd and `floodgate validate`) and compares
// which are accepted.
//
// Steps where the answers differ in a way docs/RULES.md or docs/SERVICE.md
// documents are counted apart ("documented"), with the reason; any other
// difference is a mismatch, and the exit status is 1.
//
//	envoydiff -peer service_cmd -floodgate floodgate -src $(go mod download -json ...|jq -r .Dir)
//
// bench/envoydiff.sh builds everything and runs it.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/floodgate/floodgate/bench/internal/redisproc"
)

func main() {
	peer := flag.String("peer", os.Getenv("ENVOY_RATELIMIT"), "envoyproxy/ratelimit's service_cmd binary (env ENVOY_RATELIMIT)")
	check := flag.String("config-check", os.Getenv("ENVOY_RATELIMIT_CHECK"), "envoyproxy/ratelimit's config_check_cmd binary, for the load comparison (env ENVOY_RATELIMIT_CHECK; none: skipped)")
	fg := flag.String("floodgate", os.Getenv("FLOODGATE"), "the floodgate binary (env FLOODGATE)")
	src := flag.String("src", os.Getenv("ENVOY_RATELIMIT_SRC"), "envoyproxy/ratelimit's module source directory, for its rules files (env ENVOY_RATELIMIT_SRC)")
	store := flag.String("store", "redis", "floodgate's store: redis (the peer's redis-server, apart from its keys) or memory")
	only := flag.String("group", "", "run only the groups whose name contains this")
	verbose := flag.Bool("v", false, "print every step, not only differences")
	out := flag.String("out", "", "also write the report to this file")
	flag.Parse()
	if *peer == "" || *fg == "" || *src == "" {
		fmt.Fprintln(os.Stderr, "envoydiff: -peer, -floodgate and -src are required")
		flag.Usage()
		os.Exit(2)
	}
	var report bytes.Buffer
	w := io.MultiWriter(os.Stdout, &report)
	r := &runner{peer: *peer, floodgate: *fg, src: *src, store: *store, verbose: *verbose, w: w}
	err := r.run(*check, *only)
	if *out != "" {
		if werr := os.WriteFile(*out, report.Bytes(), 0o644); werr != nil && err == nil {
			err = werr
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "envoydiff:", err)
		os.Exit(2)
	}
	if r.mismatches > 0 {
		os.Exit(1)
	}
}

type runner struct {
	peer, floodgate, src, store string
	verbose                     bool
	w                           io.Writer

	steps, matches, documented, mismatches int
	loads, loadMatches, loadDocumented     int
	loadMismatches                         int
	crashes                                int // requests envoyproxy/ratelimit died of
}

func (r *runner) printf(format string, args ...any) { fmt.Fprintf(r.w, format, args...) }

func (r *runner) run(check, only string) error {
	work, err := os.MkdirTemp("", "envoydiff")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)

	r.printf("# envoydiff: floodgate serve vs envoyproxy/ratelimit\n\n")
	r.printf("peer source: %s\nfloodgate store: %s\nstarted: %s\n\n", r.src, r.store, time.Now().UTC().Format(time.RFC3339))

	if check != "" && (only == "" || strings.Contains("load", only)) {
		if err := r.compareLoads(check, work); err != nil {
			return err
		}
	}

	redisAddr, stopRedis, err := redisproc.Start()
	if err != nil {
		return err
	}
	defer stopRedis()

	for _, g := range groups() {
		if only != "" && !strings.Contains(g.name, only) {
			continue
		}
		if err := r.runGroup(g, work, redisAddr); err != nil {
			return fmt.Errorf("group %s: %w", g.name, err)
		}
	}
	r.printf("\n## Summary\n\n")
	if r.loads > 0 {
		r.printf("rules files loaded: %d; same verdict %d, documented differences %d, mismatches %d\n",
			r.loads, r.loadMatches, r.loadDocumented, r.loadMismatches)
	}
	r.printf("requests compared: %d; matches %d, documented differences %d, mismatches %d\n",
		r.steps, r.matches, r.documented, r.mismatches)
	if r.crashes > 0 {
		r.printf("requests envoyproxy/ratelimit crashed on (floodgate answered): %d\n", r.crashes)
	}
	return nil
}

// runGroup starts both services on the group's rules, runs its scenarios
// and stops them.
func (r *runner) runGroup(g group, work, redisAddr string) error {
	r.printf("\n## %s\n\n", g.name)
	dir := filepath.Join(work, "rules-"+g.name)
	cfgDir := filepath.Join(dir, "ratelimit", "config")
	if err := os.MkdirAll(cfgDir, 0o755); err != nil {
		return err
	}
	for _, f := range g.files {
		b, err := os.ReadFile(filepath.Join(r.src, f))
		if err != nil {
			return err
		}
		name := strings.ReplaceAll(f, "/", "_")
		if err := os.WriteFile(filepath.Join(cfgDir, name), b, 0o644); err != nil {
			return err
		}
		r.printf("- rules: %s\n", f)
	}
	for name, content := range g.own {
		if err := os.WriteFile(filepath.Join(cfgDir, name), []byte(content), 0o644); err != nil {
			return err
		}
		r.printf("- rules: %s (this tool's)\n", name)
	}
	if len(g.floodgateFlags) > 0 {
		r.printf("- floodgate flags: %s\n", strings.Join(g.floodgateFlags, " "))
	}
	r.printf("\n")
	if err := redisCommand(redisAddr, "FLUSHALL"); err != nil {
		return err
	}

	peerPort, err := freePort()
	if err != nil {
		return err
	}
	ports := make([]int, 3)
	for i := range ports {
		if ports[i], err = freePort(); err != nil {
			return err
		}
	}
	peerCmd := exec.Command(r.peer)
	peerCmd.Env = append(os.Environ(),
		"USE_STATSD=false", "LOG_LEVEL=warn", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL="+redisAddr,
		"RUNTIME_ROOT="+dir, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false",
		"GRPC_HOST=127.0.0.1", "GRPC_PORT="+strconv.Itoa(peerPort),
		"HOST=127.0.0.1", "PORT="+strconv.Itoa(ports[0]),
		"DEBUG_HOST=127.0.0.1", "DEBUG_PORT="+strconv.Itoa(ports[1]))
	var peerLog bytes.Buffer
	peerCmd.Stdout, peerCmd.Stderr = &peerLog, &peerLog
	peerProc, err := start(peerCmd)
	if err != nil {
		return fmt.Errorf("start envoyproxy/ratelimit: %w", err)
	}
	defer peerProc.stop()

	fgPort := ports[2]
	args := []string{"serve", "--rules", cfgDir, "--data", filepath.Join(dir, "data"),
		"--grpc-addr", "127.0.0.1:" + strconv.Itoa(fgPort), "--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0",
		"--log-level", "warn"}
	if r.store == "redis" {
		args = append(args, "--store", "redis://"+redisAddr)
	}
	args = append(args, g.floodgateFlags...)
	fgCmd := exec.Command(r.floodgate, args...)
	var fgLog bytes.Buffer
	fgCmd.Stdout, fgCmd.Stderr = &fgLog, &fgLog
	fgProc, err := start(fgCmd)
	if err != nil {
		return fmt.Errorf("start floodgate: %w", err)
	}
	defer fgProc.stop()

	if err := waitPort(peerPort, peerProc); err != nil {
		return fmt.Errorf("envoyproxy/ratelimit: %w\n%s", err, peerLog.String())
	}
	if err := waitPort(fgPort, fgProc); err != nil {
		return fmt.Errorf("floodgate: %w\n%s", err, fgLog.String())
	}
	pc, err := grpc.NewClient("127.0.0.1:"+strconv.Itoa(peerPort), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer pc.Close()
	fc, err := grpc.NewClient("127.0.0.1:"+strconv.Itoa(fgPort), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer fc.Close()
	peerClient, fgClient := rlsv3.NewRateLimitServiceClient(pc), rlsv3.NewRateLimitServiceClient(fc)

scenarios:
	for _, sc := range g.scenarios {
		r.printf("### %s\n", sc.name)
		for i, st := range sc.steps {
			for rep := 0; rep < max(st.repeat, 1); rep++ {
				alignStep()
				pr, perr := call(peerClient, st.req)
				fr, ferr := call(fgClient, st.req)
				if peerProc.exited() {
					r.printf("  %d CRASH  %s\n        envoyproxy/ratelimit crashed on this request; floodgate: %s\n", i+1, describe(st.req), summarize(fr, ferr))
					r.crashes++
					break scenarios
				}
				diffs := compare(pr, perr, fr, ferr)
				label := fmt.Sprintf("%d", i+1)
				if st.repeat > 1 {
					label = fmt.Sprintf("%d.%d", i+1, rep+1)
				}
				r.steps++
				switch {
				case len(diffs) == 0:
					r.matches++
					if r.verbose {
						r.printf("  %s match  %s\n        both: %s\n", label, describe(st.req), summarize(pr, perr))
					}
				case st.known != "":
					r.documented++
					r.printf("  %s DOCUMENTED  %s\n        peer:      %s\n        floodgate: %s\n        why: %s\n",
						label, describe(st.req), summarize(pr, perr), summarize(fr, ferr), st.known)
				default:
					r.mismatches++
					r.printf("  %s MISMATCH  %s\n        peer:      %s\n        floodgate: %s\n        differs: %s\n",
						label, describe(st.req), summarize(pr, perr), summarize(fr, ferr), strings.Join(diffs, "; "))
				}
			}
		}
	}
	// Floodgate must never crash: it is still running and answering.
	if fgProc.exited() {
		return fmt.Errorf("floodgate exited during the run:\n%s", fgLog.String())
	}
	if err := waitPort(fgPort, fgProc); err != nil {
		return fmt.Errorf("floodgate stopped answering: %w\n%s", err, fgLog.String())
	}
	if peerProc.exited() {
		r.printf("\nenvoyproxy/ratelimit exited during this group; its output begins:\n%s\n", head(peerLog.String(), "panic", 4))
	}
	return nil
}

// head returns n lines of s from the first holding from (or from the start).
func head(s, from string, n int) string {
	if i := strings.Index(s, from); i >= 0 {
		s = s[i:]
	}
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[:n]
	}
	return strings.Join(lines, "\n")
}

func call(c rlsv3.RateLimitServiceClient, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return c.ShouldRateLimit(ctx, req)
}

// alignStep keeps one step's two calls within one wall-clock second: if
// the next second starts within 40 ms, it waits until just after it.
func alignStep() {
	now := time.Now()
	next := now.Truncate(time.Second).Add(time.Second)
	if next.Sub(now) < 40*time.Millisecond {
		time.Sleep(next.Sub(now) + 5*time.Millisecond)
	}
}

// proc is a started process.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
}

func start(c *exec.Cmd) (*proc, error) {
	if err := c.Start(); err != nil {
		return nil, err
	}
	p := &proc{cmd: c, done: make(chan struct{})}
	go func() { c.Wait(); close(p.done) }()
	return p, nil
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop kills the process (only this one) and waits for it.
func (p *proc) stop() {
	p.cmd.Process.Kill()
	<-p.done
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// waitPort waits until port accepts connections (10 s at most), or c exits.
func waitPort(port int, p *proc) error {
	addr := "127.0.0.1:" + strconv.Itoa(port)
	for i := 0; i < 200; i++ {
		if conn, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			conn.Close()
			return nil
		}
		if p != nil && p.exited() {
			return errors.New("exited")
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s never opened", addr)
}

// redisCommand sends one argument-less command and expects a simple "+" reply.
func redisCommand(addr, cmd string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintf(c, "*1\r\n$%d\r\n%s\r\n", len(cmd), cmd); err != nil {
		return err
	}
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	if err != nil {
		return err
	}
	if n == 0 || buf[0] != '+' {
		return fmt.Errorf("redis %s: %q", cmd, buf[:n])
	}
	return nil
}

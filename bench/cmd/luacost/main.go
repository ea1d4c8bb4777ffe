// Command luacost measures what a decision costs redis-server itself: its
// CPU time (INFO cpu, user + system) per request, for the request
// `floodgate serve` sends for an Envoy request of D descriptors (one
// BatchFunction call of D keys, one fixed-window rule each, Redis's clock),
// beside what envoyproxy/ratelimit sends for the same request (INCRBY and
// EXPIRE per descriptor, pipelined), and beside other versions of the
// library (from luaab -print). Every variant is loaded under a name of its
// own and the variants take turns in blocks of requests, one request per
// round trip, over keys of their own (-keys per descriptor), so that a
// drifting machine weighs on all alike. It prints each variant's median
// over the blocks, and its ratio to the first. With -callgrind, against a
// redis-server run under valgrind --tool=callgrind, it counts
// instructions per request instead (docs/BENCHMARKS.md, issue 19), which
// repeat where a shared machine's timings do not.
//
//	go run ./cmd/luacost                          # this tree's library against envoyproxy/ratelimit's commands
//	go run ./cmd/luacost -lib /tmp/before.lua     # and another library
//	go run ./cmd/luacost -descriptors 1
//	valgrind --tool=callgrind --callgrind-out-file=/tmp/cg/callgrind.out.%p redis-server --port 7404 --save "" &
//	go run ./cmd/luacost -addr 127.0.0.1:7404 -callgrind /tmp/cg -keys 10 -block 1000 -lib /tmp/before.lua
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/bench/internal/redisproc"
	"github.com/floodgate/floodgate/redisstore"
)

type libFlag []string

func (l *libFlag) String() string     { return strings.Join(*l, ",") }
func (l *libFlag) Set(s string) error { *l = append(*l, s); return nil }

func main() {
	var libs libFlag
	flag.Var(&libs, "lib", "another library `file` (luaab -print) to measure; repeatable")
	addr := flag.String("addr", "", "Redis address (default: start a redis-server on a free loopback port)")
	descs := flag.Int("descriptors", 3, "descriptors per request")
	block := flag.Int("block", 2000, "requests per block")
	blocks := flag.Int("blocks", 10, "blocks per variant")
	flag.IntVar(&keys, "keys", 1000, "distinct keys per descriptor, taken in turn (floodgate serve's benchmark draws from 1,000 at 5,000–10,000 requests/s: a key is written several times a second; under callgrind take fewer)")
	flag.BoolVar(&breakdown, "breakdown", false, "add the parts of a call as variants: an empty function with no arguments, with the request's KEYS and ARGV, with the same bytes in one argument, with the batch's reply, and this tree's library deciding nothing (docs/BENCHMARKS.md, issue 19)")
	flag.BoolVar(&garbage, "garbage", false, "print the Lua memory each variant's request leaves for the collector (collectgarbage('count') over 20 requests, the collector stopped) instead of timing")
	flag.StringVar(&callgrind, "callgrind", "", "the `directory` of a redis-server run under valgrind --tool=callgrind (-addr): count its instructions per request instead of CPU time, one block per variant after a warm-up")
	flag.Parse()
	if err := run(*addr, libs, *descs, *block, *blocks); err != nil {
		fmt.Fprintln(os.Stderr, "luacost:", err)
		os.Exit(1)
	}
}

var (
	breakdown bool
	garbage   bool
	callgrind string
	keys      int
)

type variant struct {
	name string
	reqs func(i int) [][]string // request i's commands, pipelined
}

func run(addr string, libs []string, descs, block, blocks int) error {
	if descs < 1 || descs > 8 {
		return errors.New("-descriptors: 1 to 8")
	}
	addr, stop, err := redisproc.Use(addr)
	if err != nil {
		return err
	}
	defer stop()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	r := bufio.NewReaderSize(c, 1<<16)
	vs, err := variants(addr, libs, c, r, descs)
	if err != nil {
		return err
	}
	if garbage {
		return countGarbage(c, r, vs)
	}
	if callgrind != "" {
		return countInstructions(c, r, vs, block)
	}
	return timeCPU(c, r, vs, descs, block, blocks)
}

// variants loads this tree's library and libs, and returns them and
// envoyproxy/ratelimit's commands as the variants to measure.
func variants(addr string, libs []string, c net.Conn, r *bufio.Reader, descs int) ([]variant, error) {
	vs := []variant{
		{name: "this tree", reqs: floodgateReqs(addr, "lc0", redisstore.Library(), c, r, descs, keys, false)},
		{name: "this tree, BatchFunction", reqs: floodgateReqs(addr, "lcb", redisstore.Library(), c, r, descs, keys, true)},
	}
	for i, f := range libs {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		vs = append(vs, variant{name: f, reqs: floodgateReqs(addr, fmt.Sprint("lc", i+1), string(b), c, r, descs, keys, true)})
	}
	if breakdown {
		bs, err := breakdownVariants(c, r, vs[1].reqs, vs[0].reqs)
		if err != nil {
			return nil, err
		}
		vs = append(vs, bs...)
	}
	vs = append(vs, variant{name: "envoyproxy/ratelimit", reqs: func(i int) [][]string {
		var cmds [][]string
		for d := range descs {
			k := fmt.Sprintf("envoy_bench_d%d_%d_%d", d, i%keys, time.Now().Unix())
			cmds = append(cmds, []string{"INCRBY", k, "1"}, []string{"EXPIRE", k, "1"})
		}
		return cmds
	}}, variant{name: "INCRBY + PEXPIRE NX, no Lua", reqs: func(i int) [][]string {
		// issue 19's candidate (b), its admitted request: a counter per
		// descriptor and window, its TTL set once (a refusal would add a
		// DECRBY per descriptor)
		var cmds [][]string
		for d := range descs {
			k := fmt.Sprintf("incr_bench_d%d_%d_%d", d, i%keys, time.Now().Unix())
			cmds = append(cmds, []string{"INCRBY", k, "1"}, []string{"PEXPIRE", k, "1001", "NX"})
		}
		return cmds
	}})
	for _, v := range vs {
		if v.reqs == nil {
			return nil, errors.New("a library did not load")
		}
	}
	return vs, nil
}

// timeCPU runs blocks of each variant in turn, after a warm-up round,
// and prints redis-server's CPU per request.
func timeCPU(c net.Conn, r *bufio.Reader, vs []variant, descs, block, blocks int) error {
	per := make([][]float64, len(vs))
	for b := range blocks + 1 { // the first round warms up
		for k := range vs {
			j := (b + k) % len(vs)
			cpu0, err := cpu(c, r)
			if err != nil {
				return err
			}
			for i := range block {
				if err := pipeline(c, r, vs[j].reqs(i)); err != nil {
					return fmt.Errorf("%s: %w", vs[j].name, err)
				}
			}
			cpu1, err := cpu(c, r)
			if err != nil {
				return err
			}
			if b > 0 {
				per[j] = append(per[j], (cpu1-cpu0)*1e6/float64(block))
			}
		}
	}
	med := func(v []float64) float64 { slices.Sort(v); return v[len(v)/2] }
	base := med(per[0])
	fmt.Printf("redis-server CPU per request of %d descriptor(s), median of %d blocks of %d:\n", descs, blocks, block)
	for j, v := range vs {
		m := med(per[j])
		fmt.Printf("  %-30s %6.2f µs  (%.2f×, blocks %.2f–%.2f)\n", v.name, m, m/base, per[j][0], per[j][len(per[j])-1])
	}
	return nil
}

// floodgateReqs loads lib under name and returns the batch call of
// request i (descs keys of one rule each, as floodgate serve sends).
//
// old: BatchFunction's call (the calling convention before
// PackedFunction), not the one the store sends now.
func floodgateReqs(addr, name, lib string, c net.Conn, r *bufio.Reader, descs, keys int, old bool) func(int) [][]string {
	lib = strings.ReplaceAll(lib, "floodgate_v1", name)
	if err := pipeline(c, r, [][]string{{"FUNCTION", "LOAD", "REPLACE", lib}}); err != nil {
		fmt.Fprintln(os.Stderr, "luacost: load:", err)
		return nil
	}
	st, err := redisstore.New("redis://"+addr, redisstore.Options{Prefix: name})
	if err != nil {
		fmt.Fprintln(os.Stderr, "luacost:", err)
		return nil
	}
	defer st.Close()
	names := []string{"generic_key", "user", "route", "d3", "d4", "d5", "d6", "d7"}
	ps := make([]*floodgate.Policy, descs)
	for d := range ps {
		ps[d] = floodgate.MustPolicy("rules/bench/"+names[d], floodgate.Rule{Name: "second", Algorithm: floodgate.FixedWindow, Limit: 1_000_000_000, Period: time.Second})
	}
	cmds := make([][]string, keys)
	for i := range cmds {
		ops := make([]floodgate.Op, descs)
		for d := range ops {
			ops[d] = ps[d].Op(floodgate.OpAllow, fmt.Sprintf("bench\x00%s=%c%d", names[d], names[d][0], i), 1, 0)
		}
		batchCommand := st.BatchCommand
		if old {
			batchCommand = st.BatchFunctionCommand
		}
		cmd, err := batchCommand(context.Background(), 0, ops)
		if err != nil {
			fmt.Fprintln(os.Stderr, "luacost:", err)
			return nil
		}
		if descs == 1 && old { // releases before PackedFunction called Function for one key
			cmd, err = st.Command(context.Background(), 0, ops[0])
			if err != nil {
				fmt.Fprintln(os.Stderr, "luacost:", err)
				return nil
			}
		}
		cmd[1] = strings.ReplaceAll(cmd[1], "floodgate_v1", name)
		cmds[i] = cmd
	}
	return func(i int) [][]string { return [][]string{cmds[i%keys]} }
}

// cpu returns redis-server's CPU seconds (user + system) so far.
func cpu(c net.Conn, r *bufio.Reader) (float64, error) {
	if err := send(c, [][]string{{"INFO", "cpu"}}); err != nil {
		return 0, err
	}
	line, err := r.ReadString('\n')
	if err != nil {
		return 0, err
	}
	n, _ := strconv.Atoi(strings.TrimSpace(line[1:]))
	buf := make([]byte, n+2)
	if _, err := io.ReadFull(r, buf); err != nil {
		return 0, err
	}
	var sum float64
	for _, l := range strings.Split(string(buf), "\r\n") {
		k, v, ok := strings.Cut(l, ":")
		if ok && (k == "used_cpu_user" || k == "used_cpu_sys") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return 0, err
			}
			sum += f
		}
	}
	return sum, nil
}

func send(c net.Conn, cmds [][]string) error {
	var b strings.Builder
	for _, args := range cmds {
		fmt.Fprintf(&b, "*%d\r\n", len(args))
		for _, a := range args {
			fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
		}
	}
	_, err := c.Write([]byte(b.String()))
	return err
}

// pipeline sends cmds at once and reads every reply, failing on an error
// anywhere in them.
func pipeline(c net.Conn, r *bufio.Reader, cmds [][]string) error {
	if err := send(c, cmds); err != nil {
		return err
	}
	for range cmds {
		if err := skipReply(r); err != nil {
			return err
		}
	}
	return nil
}

func skipReply(r *bufio.Reader) error {
	line, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return errors.New("empty reply line")
	}
	switch line[0] {
	case '-':
		return errors.New(line[1:])
	case '+', ':':
		return nil
	case '$':
		n, _ := strconv.Atoi(line[1:])
		if n < 0 {
			return nil
		}
		_, err := r.Discard(n + 2)
		return err
	case '*':
		n, _ := strconv.Atoi(line[1:])
		for range max(n, 0) {
			if err := skipReply(r); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("unexpected reply %q", line)
}

// countInstructions runs a block of each variant after a warm-up one, the
// callgrind counters zeroed before and dumped after, and prints the
// instructions per request.
func countInstructions(c net.Conn, r *bufio.Reader, vs []variant, block int) error {
	ctl := func(arg string) error {
		out, err := exec.Command("callgrind_control", arg, callgrindPid()).CombinedOutput()
		if err != nil {
			return fmt.Errorf("callgrind_control %s: %v: %s", arg, err, out)
		}
		return nil
	}
	fmt.Printf("redis-server instructions per request (callgrind), block of %d:\n", block)
	var base float64
	for j, v := range vs {
		for pass := range 2 {
			if pass == 1 {
				if err := ctl("-z"); err != nil {
					return err
				}
			}
			for i := range block {
				if err := pipeline(c, r, v.reqs(i)); err != nil {
					return fmt.Errorf("%s: %w", v.name, err)
				}
			}
		}
		if err := ctl("-d"); err != nil {
			return err
		}
		ir, dump, err := lastDumpTotal()
		if err != nil {
			return err
		}
		per := ir / float64(block)
		if j == 0 {
			base = per
		}
		fmt.Printf("  %-36s %8.0f  (%.3f×)  %s\n", v.name, per, per/base, filepath.Base(dump))
	}
	return nil
}

func callgrindPid() string {
	fs, _ := filepath.Glob(filepath.Join(callgrind, "callgrind.out.*"))
	for _, f := range fs {
		parts := strings.Split(filepath.Base(f), ".")
		if len(parts) >= 3 {
			return parts[2]
		}
	}
	return ""
}

// lastDumpTotal returns the instruction total of the newest dump.
func lastDumpTotal() (float64, string, error) {
	fs, err := filepath.Glob(filepath.Join(callgrind, "callgrind.out.*"))
	if err != nil || len(fs) == 0 {
		return 0, "", fmt.Errorf("no callgrind dump in %s", callgrind)
	}
	var newest string
	var t time.Time
	for _, f := range fs {
		if st, err := os.Stat(f); err == nil && !st.ModTime().Before(t) {
			newest, t = f, st.ModTime()
		}
	}
	b, err := os.ReadFile(newest)
	if err != nil {
		return 0, "", err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "summary: "); ok {
			f, err := strconv.ParseFloat(strings.Fields(v)[0], 64)
			return f, newest, err
		}
		if v, ok := strings.CutPrefix(l, "totals: "); ok {
			f, err := strconv.ParseFloat(strings.Fields(v)[0], 64)
			return f, newest, err
		}
	}
	return 0, "", fmt.Errorf("%s: no totals", newest)
}

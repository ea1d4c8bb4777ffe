// Command luaab compares two versions of the Redis decision code (the Lua
// of redisstore/lua) on one redis-server: both libraries are loaded under
// names of their own, and batches of decisions (BatchFunction, each key
// holding state) go to one and the other in turn, so that a drifting
// machine weighs on both alike. It prints the time per decision seen by
// the client (p10 and p50) and the ratio. Two runs of the same code
// differ by well under 1 %.
//
//	git stash; go run ./cmd/luaab -print > /tmp/before.lua; git stash pop
//	go run ./cmd/luaab -before /tmp/before.lua      # the working tree's code against it
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/bench/internal/redisproc"
	"github.com/floodgate/floodgate/redisstore"
)

func main() {
	print := flag.Bool("print", false, "print this tree's library and exit")
	before := flag.String("before", "", "the other library (from -print), compared with this tree's")
	addr := flag.String("addr", "", "Redis address (default: start a redis-server on a free loopback port)")
	n := flag.Int("batch", 20, "decisions per call")
	rounds := flag.Int("rounds", 2000, "calls to each library")
	flag.Parse()
	if *print {
		fmt.Print(redisstore.Library())
		return
	}
	if err := run(*addr, *before, *n, *rounds); err != nil {
		fmt.Fprintln(os.Stderr, "luaab:", err)
		os.Exit(1)
	}
}

func run(addr, beforePath string, n, rounds int) error {
	if beforePath == "" {
		return errors.New("-before FILE is required (make it with -print)")
	}
	old, err := os.ReadFile(beforePath)
	if err != nil {
		return err
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
	rename := func(lib, name string) string { return strings.ReplaceAll(lib, "floodgate_v1", name) }
	for _, lib := range []string{rename(string(old), "luaab_before"), rename(redisstore.Library(), "luaab_after")} {
		if err := call(c, r, []string{"FUNCTION", "LOAD", "REPLACE", lib}); err != nil {
			return err
		}
	}

	// n decisions under one policy (one rule: a fixed window no request
	// reaches), as the store sends them together; keys of their own for
	// each library.
	p := floodgate.MustPolicy("ab", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 1_000_000_000, Period: time.Second})
	ops := make([]floodgate.Op, n)
	for i := range ops {
		ops[i] = p.Op(floodgate.OpAllow, fmt.Sprint("k", i), 1, 0)
	}
	batch := func(fn, prefix string) ([]string, error) {
		st, err := redisstore.New("redis://"+addr, redisstore.Options{Prefix: prefix})
		if err != nil {
			return nil, err
		}
		defer st.Close()
		// BatchFunction's call: the function both libraries have
		cmd, err := st.BatchFunctionCommand(context.Background(), 0, ops)
		if err != nil {
			return nil, err
		}
		cmd[1] = fn
		return cmd, nil
	}
	a, err := batch("luaab_before_batch_groups", "before")
	if err != nil {
		return err
	}
	b, err := batch("luaab_after_batch_groups", "after")
	if err != nil {
		return err
	}
	libs := [2][]string{a, b}
	var times [2][]time.Duration
	for i := range rounds {
		for k := range 2 {
			j := (i + k) % 2 // alternate which goes first
			t := time.Now()
			if err := call(c, r, libs[j]); err != nil {
				return err
			}
			times[j] = append(times[j], time.Since(t))
		}
	}
	ta, tb := times[0], times[1]
	slices.Sort(ta)
	slices.Sort(tb)
	per := func(v []time.Duration, q float64) float64 {
		return float64(v[int(float64(len(v))*q)].Nanoseconds()) / 1000 / float64(n)
	}
	fmt.Printf("before: p10 %.2f µs, p50 %.2f µs per decision\n", per(ta, .1), per(ta, .5))
	fmt.Printf("after:  p10 %.2f µs, p50 %.2f µs per decision\n", per(tb, .1), per(tb, .5))
	fmt.Printf("after/before at p50: %.3f (%d calls of %d decisions each)\n", per(tb, .5)/per(ta, .5), rounds, n)
	return nil
}

// call sends one command and reads its whole reply, failing on an error
// anywhere in it.
func call(c net.Conn, r *bufio.Reader, args []string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := c.Write([]byte(b.String())); err != nil {
		return err
	}
	return skipReply(r)
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

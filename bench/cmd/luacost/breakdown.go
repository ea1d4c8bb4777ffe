package main

import (
	"bufio"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/floodgate/floodgate/redisstore"
)

// probeLibrary holds functions that do nothing but return: what an FCALL
// costs before any Lua of Floodgate's runs. probe_reply returns a batch's
// reply of three 52-byte strings, built once.
//
// probe_counter is a sketch of a layout not built (docs/BENCHMARKS.md,
// issue 19): each key a plain integer counter of its window, INCRBY of the
// cost, PEXPIREAT at the window's end when it creates the key, DECRBY
// when the count passes the limit (a refusal charges nothing), TIME once,
// a 17-byte reply record per key; ARGV[1] the limit.
const probeLibrary = `#!lua name=lcprobe
local reply = nil
redis.register_function('probe_counter', function(keys, args)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local ws = math.floor(now / 1000000) * 1000000
  local e = ws + 1000000 - now
  local limit = tonumber(args[1])
  local out = {}
  for i = 1, #keys do
    local n = redis.call('INCRBY', keys[i], 1)
    if n == 1 then redis.call('PEXPIREAT', keys[i], (ws + 1000000) / 1000) end
    if n > limit then redis.call('DECRBY', keys[i], 1) n = n - 1 end
    out[i] = struct.pack('>Bi8i8', n <= limit and 1 or 0, limit - n, e)
  end
  return table.concat(out)
end)
redis.register_function('probe_empty', function(keys, args) return 0 end)
redis.register_function('probe_reply', function(keys, args)
  if reply == nil then reply = {string.rep('x', 52), string.rep('y', 52), string.rep('z', 52)} end
  return reply
end)
`

// breakdownVariants returns the parts of the real call (reqs, one FCALL a
// request) as variants: the empty function with no arguments, with the
// same KEYS and ARGV, with the same bytes in one argument after the
// KEYS, with the batch's reply, and this tree's library with its
// decisions replaced by a constant (dispatch, parsing, TIME and packing
// the replies).
//
// packed is the same request as this tree's store sends it
// (PackedFunction): the empty function with its KEYS and two ARGV too.
func breakdownVariants(c2 net.Conn, r *bufio.Reader, reqs, packed func(int) [][]string) ([]variant, error) {
	if err := pipeline(c2, r, [][]string{{"FUNCTION", "LOAD", "REPLACE", probeLibrary}}); err != nil {
		return nil, err
	}
	// the library with parts replaced, under a name of its own
	type cut struct{ name, lib string }
	var cuts []cut
	part := func(name, lib string, repl ...string) string {
		for i := 0; i < len(repl); i += 2 {
			if !strings.Contains(lib, repl[i]) {
				panic("luacost: the library has no " + repl[i])
			}
			lib = strings.Replace(lib, repl[i], repl[i+1], 1)
		}
		cuts = append(cuts, cut{name, lib})
		return lib
	}
	nothing := part("lcnothing", redisstore.Library(), "pcall(decide, keys[i], ps, n, now, rclock, as or op, cost, maxdelay, spare)",
		"true, 1, 0, 0, 0, 1000, 999, 1000, 0, 0, now")
	notime := part("lcnotime", nothing, "bnow = bnow or redisnow()", "bnow = bnow or 1795760047000000")
	nopack := part("lcnopack", notime, "spack('>I4i8i8i8i8i8i8', a * 16777216 + b * 65536 + c * 256 + d % 256, e, f, g, h, k, l)",
		"'0123456789012345678901234567890123456789012345678901'")
	part("lcnounpack", nopack, "pi, _, now, op, cost, maxdelay, spare, nx = sunpack('>HBi8i8i8i8i8', s)",
		"pi, _, now, op, cost, maxdelay, spare, nx = sbyte(s, 2), 0, 0, 0, 1, 0, 0, 44")
	part("lcpolicies", nopack, "  local out = {}\n  bnow, ls = nil, false\n", "  if argv then return {'0123456789012345678901234567890123456789012345678901', '0123456789012345678901234567890123456789012345678901', '0123456789012345678901234567890123456789012345678901'} end\n  local out = {}\n  bnow, ls = nil, false\n")
	part("lcentry", redisstore.Library(), "local function batch(keys, argv, grouped)\n",
		"local constreply = nil\nlocal function batch(keys, argv, grouped)\n  constreply = constreply or {string.rep('x', 52), string.rep('y', 52), string.rep('z', 52)}\n  if argv then return constreply end\n")
	for _, c := range cuts {
		lib := strings.ReplaceAll(c.lib, "floodgate_v1", c.name)
		if err := pipeline(c2, r, [][]string{{"FUNCTION", "LOAD", "REPLACE", lib}}); err != nil {
			return nil, fmt.Errorf("%s: %w", c.name, err)
		}
	}
	// withReqs gives request i of reqs as a call to function fn, its
	// arguments reshaped by f; with, of the BatchFunction call
	withReqs := func(reqs func(int) [][]string, fn string, f func(keys, args []string) (k, a []string)) func(int) [][]string {
		return func(i int) [][]string {
			cmd := reqs(i)[0]
			nk, _ := strconv.Atoi(cmd[2])
			k, a := f(cmd[3:3+nk], cmd[3+nk:])
			out := append([]string{"FCALL", fn, strconv.Itoa(len(k))}, k...)
			return [][]string{append(out, a...)}
		}
	}
	with := func(fn string, f func(keys, args []string) (k, a []string)) func(int) [][]string {
		return withReqs(reqs, fn, f)
	}
	lib := func(name, fn string) variant {
		return variant{name: name, reqs: func(i int) [][]string {
			cmd := append([]string(nil), reqs(i)[0]...)
			cmd[1] = strings.Replace(cmd[1], "lcb", fn, 1)
			return [][]string{cmd}
		}}
	}
	same := func(k, a []string) ([]string, []string) { return k, a }
	return []variant{
		{name: "empty, no arguments", reqs: with("probe_empty", func(k, a []string) ([]string, []string) { return nil, nil })},
		{name: "empty, the KEYS and ARGV", reqs: with("probe_empty", same)},
		{name: "empty, KEYS and ARGV in one", reqs: with("probe_empty", func(k, a []string) ([]string, []string) { return k, []string{strings.Join(a, "\x00")} })},
		{name: "empty, PackedFunction's KEYS and ARGV", reqs: withReqs(packed, "probe_empty", same)},
		{name: "empty, all in one argument", reqs: with("probe_empty", func(k, a []string) ([]string, []string) {
			return nil, []string{strings.Join(k, "\x00") + "\x00" + strings.Join(a, "\x00")}
		})},
		{name: "the reply alone, the KEYS and ARGV", reqs: with("probe_reply", same)},
		{name: "a plain counter per key (not built)", reqs: withReqs(packed, "probe_counter", func(k, a []string) ([]string, []string) {
			out := make([]string, len(k))
			for i := range k {
				out[i] = k[i] + ":counter"
			}
			return out, []string{"1000000000"}
		})},
		lib("the library's entry, returning at once", "lcentry"),
		lib("… and reading the policies", "lcpolicies"),
		lib("… the batch's work deciding nothing", "lcnothing"),
		lib("… without TIME", "lcnotime"),
		lib("… and without packing the replies", "lcnopack"),
		lib("… and without unpacking the decisions", "lcnounpack"),
	}, nil
}

// gcLibrary stops and restarts the function engine's collector and reads
// its memory.
const gcLibrary = `#!lua name=lcgc
redis.register_function('lcgc_stop', function(keys, args) collectgarbage('stop') return tostring(collectgarbage('count')) end)
redis.register_function('lcgc_count', function(keys, args) return tostring(collectgarbage('count')) end)
redis.register_function('lcgc_restart', function(keys, args) collectgarbage('restart') return 0 end)
`

// countGarbage prints, per variant, the bytes of Lua memory a request
// allocates, read with the collector stopped over 20 requests, the most of five windows (Redis
// steps the collector itself every 50 calls).
func countGarbage(c net.Conn, r *bufio.Reader, vs []variant) error {
	if err := pipeline(c, r, [][]string{{"FUNCTION", "LOAD", "REPLACE", gcLibrary}}); err != nil {
		return err
	}
	count := func(fn string) (float64, error) {
		if err := send(c, [][]string{{"FCALL", fn, "0"}}); err != nil {
			return 0, err
		}
		line, err := r.ReadString('\n')
		if err != nil {
			return 0, err
		}
		line, err = r.ReadString('\n')
		if err != nil {
			return 0, err
		}
		return strconv.ParseFloat(strings.TrimSpace(line), 64)
	}
	const n = 20
	fmt.Printf("Lua memory allocated per request (KB, collector stopped, %d requests):\n", n)
	for _, v := range vs {
		if strings.HasPrefix(v.name, "envoyproxy") {
			continue
		}
		for i := range n { // warm up: caches filled
			if err := pipeline(c, r, v.reqs(i)); err != nil {
				return err
			}
		}
		best := 0.0
		for range 5 { // a window Redis's own step fell in reads low: the most of 5
			k0, err := count("lcgc_stop")
			if err != nil {
				return err
			}
			for i := range n {
				if err := pipeline(c, r, v.reqs(i)); err != nil {
					return err
				}
			}
			k1, err := count("lcgc_count")
			if err != nil {
				return err
			}
			if err := pipeline(c, r, [][]string{{"FCALL", "lcgc_restart", "0"}}); err != nil {
				return err
			}
			best = max(best, k1-k0)
		}
		fmt.Printf("  %-40s %6.2f KB\n", v.name, best/n)
	}
	return nil
}

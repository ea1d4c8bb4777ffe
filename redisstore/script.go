package redisstore

import (
	"embed"
	"encoding/binary"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/algo"
	"github.com/floodgate/floodgate/internal/compiled"
)

// The decision code: redisstore/lua/*.lua in name order (helpers, one file
// per algorithm, conversions, the dispatcher, the move), loaded as a Redis
// 7 function library (FUNCTION LOAD once, then FCALL) so its helpers are
// compiled once, or run as one script (EVALSHA) on servers without
// functions.
//
//go:embed lua/*.lua
var luaFiles embed.FS

// LibraryName is the function library's name, Function the function one
// decision calls, and BatchFunction the function that makes several
// decisions in one call (KEYS: one key per decision; ARGV: each policy's
// rules once, then each decision's own numbers, as 90_apply.lua says, with
// its all-or-nothing group; the reply: per decision, Function's ten numbers
// packed into 52 bytes, or an error for that decision alone).
// The "1" is the layout version of the keys.
const (
	LibraryName   = "floodgate_v1"              // the function library (FUNCTION LOAD)
	Function      = "floodgate_v1_apply"        // decides one key
	BatchFunction = "floodgate_v1_batch_groups" // decides a batch, with its all-or-nothing groups
	// MoveFunction carries a key's state from one policy to another
	// (Store.Move; 95_move.lua).
	MoveFunction = "floodgate_v1_move"
	// WriteBackFunction adds a node's unsynced hits to a write-back key
	// and may decide one request exactly (writeback.go; 97_writeback.lua).
	WriteBackFunction = "floodgate_v1_writeback"
	// ShareFunction gives back what is left of a local share's slice and
	// takes a new one (floodgate.TierLocalShare; 97_share.lua).
	ShareFunction = "floodgate_v1_share"
	// PackedFunction makes BatchFunction's decisions in a cheaper call:
	// every policy in one argument, every decision in one, one reply
	// string, and the Envoy request's fixed-window decision made inline
	// (92_packed.lua). The coalescer's calls use it; BatchFunction stays
	// for releases before it that share the Redis during an upgrade.
	PackedFunction = "floodgate_v1_batch_packed"
)

// legacyBatchFunction is the batch function of releases before groups (its
// decisions carry no group byte), kept in the library for instances of
// those releases that share the Redis during an upgrade: whichever release
// loads the library last, each finds the functions it calls (one that
// finds its function missing loads the library again).
const legacyBatchFunction = "floodgate_v1_batch"

var luaBody = sync.OnceValue(func() string {
	names, err := fs.Glob(luaFiles, "lua/*.lua")
	if err != nil {
		panic(err)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		src, err := luaFiles.ReadFile(n)
		if err != nil {
			panic(err)
		}
		fmt.Fprintf(&b, "-- %s\n", n)
		b.Write(src)
		b.WriteString("\n")
	}
	return b.String()
})

// Script returns the decision code as one script for EVAL/EVALSHA.
func Script() string { return luaBody() + "return apply(KEYS, ARGV)\n" }

// BatchScript returns the code of BatchFunction as one script for
// EVAL/EVALSHA.
func BatchScript() string { return luaBody() + "return batch(KEYS, ARGV, true)\n" }

// Library returns the decision code as a Redis 7 function library.
//
// A library cannot reach Lua's standard libraries while it loads, so the
// code is set up on the first call (init) and kept for the library's life.
func Library() string {
	fn := func(name, call string) string {
		return "redis.register_function('" + name + "', function(keys, args)\n" +
			"  if apply == nil then apply, batch, move, share, writeback, packed = init() end\n" +
			"  return " + call + "\nend)\n"
	}
	return "#!lua name=" + LibraryName + "\n" +
		"local apply, batch, move, share, writeback, packed\nlocal function init()\n" + luaBody() + "return apply, batch, move, share, writeback, packed\nend\n" +
		fn(Function, "apply(keys, args)") +
		fn(BatchFunction, "batch(keys, args, true)") +
		fn(legacyBatchFunction, "batch(keys, args, false)") +
		fn(MoveFunction, "move(keys, args)") +
		fn(ShareFunction, "share(keys, args)") +
		fn(WriteBackFunction, "writeback(keys, args)") +
		fn(PackedFunction, "packed(keys, args)")
}

// PackedScript returns the code of PackedFunction as one script for
// EVAL/EVALSHA.
func PackedScript() string { return luaBody() + "return packed(KEYS, ARGV)\n" }

// ShareScript returns the code of ShareFunction as one script for
// EVAL/EVALSHA.
func ShareScript() string { return luaBody() + "return share(KEYS, ARGV)\n" }

// MoveScript returns the code of MoveFunction as one script for
// EVAL/EVALSHA.
func MoveScript() string { return luaBody() + "return move(KEYS, ARGV)\n" }

// ruleFields is the number of arguments per rule (RULE_FIELDS in
// 90_apply.lua): name, signature, and three calendar bounds.
const ruleFields = 5

// policyArgs is the static part of a policy's script arguments, computed
// once per policy version.
type policyArgs struct {
	rules  []algo.Params
	names  []string
	static []string // ruleFields per rule; calendar bounds filled per call
	cal    bool     // some rule follows the calendar
	packed []byte   // the policy's part of PackedFunction's arguments; nil: too long
}

// compiledOf returns a policy's compiled rules, which the Lua is given.
var compiledOf = compiled.Of.(func(*floodgate.Policy) *compiled.Policy)

func newPolicyArgs(p *floodgate.Policy) *policyArgs {
	ps := compiledOf(p).Params
	rules := p.Rules()
	pa := &policyArgs{rules: ps, static: make([]string, 0, len(ps)*ruleFields)}
	for i := range ps {
		r := &ps[i]
		pa.names = append(pa.names, rules[i].Name)
		loc, cal, cr := "", "0", "0"
		if r.Loc != nil {
			loc = r.Loc.String()
		}
		if r.Cal != algo.CalNone {
			cal = strconv.Itoa(int(r.Cal))
			pa.cal = true
		}
		if r.CountRejected {
			cr = "1"
		}
		// The signature (parse in 80_convert.lua): every parameter that
		// gives the state its meaning; the first five fields are the window.
		sig := fmt.Sprintf("%d|%d|%s|%s|%d|%d|%d|%d|%d|%d|%d|%s",
			r.Kind, r.Period, cal, loc, r.WeekDay0, r.Limit, r.Burst, r.Gran, r.Soft, r.Elastic, r.MaxCeiling(), cr)
		if r.Approx { // a bucket whose exact units would not fit: its own
			sig += fmt.Sprintf("|%d|%d", r.Unit, r.Rate)
		}
		pa.static = append(pa.static, rules[i].Name, sig, "0", "0", "0")
	}
	pa.packed = pa.packedStatic()
	return pa
}

// opNums are one operation's own numbers: now (0: Redis TIME), op, cost,
// max delay and spare mask, then b0, b1, b2 for each calendar rule.
type opNums struct {
	v   [5]int64
	cal []int64
}

// nums returns op's numbers at now, calendar bounds around calNow.
func (pa *policyArgs) nums(now, calNow int64, op *floodgate.Op) opNums {
	var maxDelay int64
	if op.Kind == floodgate.OpReserve {
		maxDelay = min(op.MaxDelay.Microseconds(), algo.MaxExact)
	}
	o := opNums{v: [5]int64{now, int64(op.Kind), min(op.Cost, algo.MaxExact), maxDelay, int64(op.Spare & (1<<algo.MaxRules - 1))}}
	if pa.cal {
		for i := range pa.rules {
			r := &pa.rules[i]
			if r.Cal == algo.CalNone {
				continue
			}
			b0, b1 := r.Window(calNow)
			_, b2 := r.Window(b1)
			o.cal = append(o.cal, b0, b1, b2)
		}
	}
	return o
}

// singleArgs returns Function's arguments for an operation's numbers.
func (pa *policyArgs) singleArgs(o opNums) []string {
	a := make([]string, 0, 6+len(pa.static))
	for _, v := range o.v {
		a = append(a, strconv.FormatInt(v, 10))
	}
	a = append(a, strconv.Itoa(len(pa.rules)))
	a = append(a, pa.static...)
	k := 0
	for i := range pa.rules {
		if pa.rules[i].Cal == algo.CalNone {
			continue
		}
		base := 6 + i*ruleFields
		for f := range 3 {
			a[base+2+f] = strconv.FormatInt(o.cal[k+f], 10)
		}
		k += 3
	}
	return a
}

// appendPacked appends an operation's part of a BatchFunction call, one
// string (90_apply.lua unpacks it): its policy's index (uint16), its group
// (a byte: 0 for none; members of one all-or-nothing group are next to
// each other and share a nonzero byte), then its numbers (int64 each),
// big-endian.
func appendPacked(b []byte, policy int, group byte, o *opNums) []byte {
	b = binary.BigEndian.AppendUint16(b, uint16(policy))
	b = append(b, group)
	for _, v := range o.v {
		b = binary.BigEndian.AppendUint64(b, uint64(v))
	}
	for _, v := range o.cal {
		b = binary.BigEndian.AppendUint64(b, uint64(v))
	}
	return b
}

// batchStatic appends the policy's part of a BatchFunction call: its rule
// count, then each rule's name and signature.
func (pa *policyArgs) batchStatic(a []string) []string {
	a = append(a, strconv.Itoa(len(pa.rules)))
	for i := range pa.rules {
		a = append(a, pa.static[i*ruleFields], pa.static[i*ruleFields+1])
	}
	return a
}

// result turns the script's reply into a decision.
func (pa *policyArgs) result(v []int64) (floodgate.Decision, error) {
	if len(v) < 10 {
		return floodgate.Decision{}, fmt.Errorf("redisstore: script returned %d values, want 10", len(v))
	}
	if v[3] < 0 || int(v[3]) >= len(pa.names) {
		return floodgate.Decision{}, fmt.Errorf("redisstore: script named rule %d of %d", v[3], len(pa.names))
	}
	d := floodgate.Decision{
		Allowed:    v[0] == 1,
		Limit:      v[4],
		Remaining:  v[5],
		ResetAfter: time.Duration(v[6]) * time.Microsecond,
		RetryAfter: time.Duration(v[7]) * time.Microsecond,
		Delay:      time.Duration(v[8]) * time.Microsecond,
		Rule:       pa.names[v[3]],
		Excess:     v[2] == 1,
	}
	switch {
	case v[1] == 1:
		d.Reason = floodgate.ReasonCostTooLarge
	case !d.Allowed:
		d.Reason = floodgate.ReasonLimited
	}
	return d, nil
}

package redisstore

import (
	"embed"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/algo"
)

// The decision script: redisstore/lua/*.lua in name order, one file per
// algorithm between the helpers and the dispatcher, run as one script so a
// whole policy is one atomic call.
//
//go:embed lua/*.lua
var luaFiles embed.FS

// Script returns the assembled Lua source.
func Script() string {
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
}

// ruleFields is the number of ARGV values per rule (RULE_FIELDS in
// 90_apply.lua).
const ruleFields = 19

// policyArgs is the static part of a policy's script arguments, computed
// once per policy version.
type policyArgs struct {
	rules  []algo.Params
	names  []string
	static []string // ruleFields per rule; calendar bounds filled per call
	cal    bool     // some rule follows the calendar
}

func newPolicyArgs(p *floodgate.Policy) *policyArgs {
	ps := p.Compiled()
	rules := p.Rules()
	pa := &policyArgs{rules: ps, static: make([]string, 0, len(ps)*ruleFields)}
	for _, r := range rules {
		pa.names = append(pa.names, r.Name)
	}
	i64 := func(x int64) string { return strconv.FormatInt(x, 10) }
	for i := range ps {
		r := &ps[i]
		loc := ""
		if r.Loc != nil {
			loc = r.Loc.String()
		}
		cr := "0"
		if r.CountRejected {
			cr = "1"
		}
		cal := "0"
		if r.Cal != algo.CalNone {
			cal = "1"
			pa.cal = true
		}
		wsig := fmt.Sprintf("%d/%d/%d/%s/%d", r.Kind, r.Period, r.Cal, loc, r.WeekDay0)
		sig := fmt.Sprintf("%s/%d/%d/%d/%d/%d/%d/%s", wsig, r.Limit, r.Burst, r.Gran, r.Soft, r.Elastic, r.MaxCeiling(), cr)
		pa.static = append(pa.static,
			rules[i].Name, i64(int64(r.Kind)), i64(r.Limit), i64(r.Period), i64(r.Burst),
			i64(r.Unit), i64(r.Rate), i64(r.Gran), i64(r.N), i64(r.Soft), i64(r.Elastic), cr,
			cal, "0", "0", "0", i64(r.MaxCeiling()), sig, wsig)
	}
	return pa
}

// args returns the script's ARGV for one operation at now (0: the script
// reads Redis TIME), calendar bounds computed around calNow.
func (pa *policyArgs) args(now, calNow int64, op *floodgate.Op) []string {
	var maxDelay int64
	if op.Kind == floodgate.OpReserve {
		maxDelay = min(op.MaxDelay.Microseconds(), algo.MaxExact)
	}
	a := make([]string, 0, 6+len(pa.static))
	a = append(a,
		strconv.FormatInt(now, 10),
		strconv.Itoa(int(op.Kind)),
		strconv.FormatInt(min(op.Cost, algo.MaxExact), 10),
		strconv.FormatInt(maxDelay, 10),
		strconv.FormatUint(op.Spare&(1<<algo.MaxRules-1), 10),
		strconv.Itoa(len(pa.rules)))
	a = append(a, pa.static...)
	if pa.cal {
		for i := range pa.rules {
			r := &pa.rules[i]
			if r.Cal == algo.CalNone {
				continue
			}
			b0, b1 := r.Window(calNow)
			_, b2 := r.Window(b1)
			base := 6 + i*ruleFields
			a[base+13] = strconv.FormatInt(b0, 10)
			a[base+14] = strconv.FormatInt(b1, 10)
			a[base+15] = strconv.FormatInt(b2, 10)
		}
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

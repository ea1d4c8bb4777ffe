package redisstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/redistest"
	"github.com/floodgate/floodgate/redisstore"
)

// getRaw returns key's value (empty when it has none).
func getRaw(t *testing.T, s *redisstore.Store, key string) string {
	t.Helper()
	c := s.Client()
	v, err := c.Do(context.Background(), c.B().Get().Key(key).Build()).ToString()
	if err != nil && !strings.Contains(err.Error(), "nil") {
		t.Fatal(err)
	}
	return v
}

// near reports whether two durations differ by at most what separates two
// calls' readings of Redis's TIME on a slow host.
func near(a, b time.Duration) bool {
	d := a - b
	return d >= -2*time.Second && d <= 2*time.Second && (a == 0) == (b == 0)
}

// PackedFunction makes BatchFunction's decisions: random batches on
// Redis's clock (the fast path's case: OpAllow of cost 1 to 3 under one
// fixed window) and beside it every other kind of record (costs of 0 and
// past 255, peeks, refunds, reservations, a token bucket, two rules, a
// calendar window, count_rejected, soft mode), alone or as all-or-nothing
// groups, go through one function under policy "a-…" and through the
// other under "b-…" with the same rules (so the same values, on keys of
// their own). Every decision must match field for field (the waits within
// what separates the calls' clocks), and a fixed window's value must be
// byte for byte the same: what PackedFunction writes is what
// BatchFunction, and the releases before, read and write.
func TestPackedMatchesBatchFunction(t *testing.T) {
	srv := redistest.Standalone(t)
	s := openStore(t, srv, redisstore.Options{Timeout: 5 * time.Second, Prefix: "pk"})
	day := 24 * time.Hour
	sets := []struct {
		name  string
		fixed bool // one fixed window: its value compared byte for byte
		rules []floodgate.Rule
	}{
		{"fixed", true, []floodgate.Rule{{Name: "r", Algorithm: floodgate.FixedWindow, Limit: 6, Period: day}}},
		{"logcr", false, []floodgate.Rule{{Name: "r", Algorithm: floodgate.SlidingLog, Limit: 6, Period: day, CountRejected: true}}},
		{"soft", true, []floodgate.Rule{{Name: "r", Algorithm: floodgate.FixedWindow, Limit: 6, Period: day, Mode: floodgate.Soft, SoftPercent: 50}}},
		{"bucket", false, []floodgate.Rule{{Name: "r", Algorithm: floodgate.TokenBucket, Limit: 6, Period: day}}},
		{"two", false, []floodgate.Rule{{Name: "h", Algorithm: floodgate.FixedWindow, Limit: 4, Period: time.Hour},
			{Name: "d", Algorithm: floodgate.FixedWindow, Limit: 6, Period: day}}},
		{"calendar", false, []floodgate.Rule{{Name: "m", Algorithm: floodgate.FixedWindow, Limit: 6, Calendar: floodgate.CalendarMonth}}},
	}
	var fast int
	for si, set := range sets {
		pa := floodgate.MustPolicy("a-"+set.name, set.rules...)
		pb := floodgate.MustPolicy("b-"+set.name, set.rules...)
		r := rand.New(rand.NewPCG(uint64(si), 19))
		for step := range 60 {
			n := 1 + r.IntN(3)
			var opsA, opsB []floodgate.Op
			var group []bool
			if r.IntN(3) == 0 {
				group = make([]bool, n)
			}
			first := r.IntN(4)
			for i := range n {
				key := fmt.Sprintf("k%d", (first+i)%4) // distinct keys in a call
				kind := floodgate.OpAllow
				cost := 1 + r.Int64N(3)
				switch x := r.IntN(12); {
				case x == 0:
					kind, cost = floodgate.OpPeek, r.Int64N(3)
				case x == 1:
					kind = floodgate.OpRefund
				case x == 2:
					kind = floodgate.OpReserve
				case x == 3:
					cost = 0
				case x == 4:
					cost = 300 // too large, and past a short record's byte
				}
				if group != nil {
					group[i] = kind == floodgate.OpAllow || r.IntN(2) == 0
				}
				opsA = append(opsA, floodgate.Op{Policy: pa, Key: key, Kind: kind, Cost: cost, MaxDelay: time.Hour})
				opsB = append(opsB, floodgate.Op{Policy: pb, Key: key, Kind: kind, Cost: cost, MaxDelay: time.Hour})
				if kind == floodgate.OpAllow && cost >= 1 && cost <= 6 && len(set.rules) == 1 && set.rules[0].Calendar == "" {
					fast++
				}
			}
			da, ea, err := redisstore.FunctionDo(s, redisstore.PackedFunction, time.Now().UnixMicro(), opsA, group)
			if err != nil {
				t.Fatalf("%s step %d: packed: %v", set.name, step, err)
			}
			db, eb, err := redisstore.FunctionDo(s, redisstore.BatchFunction, time.Now().UnixMicro(), opsB, group)
			if err != nil {
				t.Fatalf("%s step %d: batch: %v", set.name, step, err)
			}
			for i := range opsA {
				a, b := da[i], db[i]
				if ea[i] != nil || eb[i] != nil {
					t.Fatalf("%s step %d decision %d: errors %v, %v", set.name, step, i, ea[i], eb[i])
				}
				if !near(a.ResetAfter, b.ResetAfter) || !near(a.RetryAfter, b.RetryAfter) || !near(a.Delay, b.Delay) {
					t.Fatalf("%s step %d decision %d (%s cost %d, group %v): packed %+v, batch %+v", set.name, step, i, opsA[i].Kind, opsA[i].Cost, group, a, b)
				}
				a.ResetAfter, a.RetryAfter, a.Delay = b.ResetAfter, b.RetryAfter, b.Delay
				if a != b {
					t.Fatalf("%s step %d decision %d (%s cost %d, group %v): packed %+v, batch %+v", set.name, step, i, opsA[i].Kind, opsA[i].Cost, group, a, b)
				}
				if set.fixed {
					va, vb := getRaw(t, s, s.Key(pa.Name(), opsA[i].Key)), getRaw(t, s, s.Key(pb.Name(), opsB[i].Key))
					if va != vb {
						t.Fatalf("%s step %d key %s: values differ:\npacked % x\nbatch  % x", set.name, step, opsA[i].Key, va, vb)
					}
				}
			}
		}
	}
	if fast < 100 {
		t.Fatalf("%d decisions of the fast path's kind: the test tests too little of it", fast)
	}
}

// A request the fast path refuses consumes nothing: once a fixed
// window's key is at its limit, refusals (alone, or a group a full member
// refuses) leave every key's value and TTL as they were, and a group's
// members that fit are not charged.
func TestPackedRefusalChargesNothing(t *testing.T) {
	srv := redistest.Standalone(t)
	s := openStore(t, srv, redisstore.Options{Timeout: 5 * time.Second, Prefix: "pkr"})
	p := floodgate.MustPolicy("fixed", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 3, Period: time.Hour})
	full := s.Key("fixed", "full")
	for i := range 3 {
		d, err := s.Do(context.Background(), 0, p.Op(floodgate.OpAllow, "full", 1, 0))
		if err != nil || !d.Allowed || d.Remaining != int64(2-i) {
			t.Fatalf("admission %d: %+v %v", i, d, err)
		}
	}
	before, ttl := getRaw(t, s, full), pttl(t, srv.Addr, full)
	for range 5 {
		d, err := s.Do(context.Background(), 0, p.Op(floodgate.OpAllow, "full", 1, 0))
		if err != nil || d.Allowed || d.Remaining != 0 || d.RetryAfter <= 0 || d.RetryAfter != d.ResetAfter {
			t.Fatalf("refusal: %+v %v", d, err)
		}
	}
	ops := []floodgate.Op{p.Op(floodgate.OpAllow, "a", 1, 0), p.Op(floodgate.OpAllow, "full", 1, 0), p.Op(floodgate.OpAllow, "b", 2, 0)}
	ds, errs, err := redisstore.FunctionDo(s, redisstore.PackedFunction, 0, ops, []bool{true, true, true})
	if err != nil || errs[0] != nil || errs[1] != nil || errs[2] != nil {
		t.Fatalf("group: %v %v", err, errs)
	}
	if ds[1].Allowed {
		t.Fatalf("the full member of a group admitted: %+v", ds[1])
	}
	if after := getRaw(t, s, full); after != before {
		t.Fatalf("refusals changed the full key:\nbefore % x\nafter  % x", before, after)
	}
	if after := pttl(t, srv.Addr, full); after > ttl {
		t.Fatalf("refusals extended the full key's TTL: %d ms, then %d", ttl, after)
	}
	for _, k := range []string{"a", "b"} {
		if v := getRaw(t, s, s.Key("fixed", k)); v != "" {
			t.Fatalf("the group's member %s was charged for a refused group: % x", k, v)
		}
	}
	// and a group that fits is admitted whole
	ops[1] = p.Op(floodgate.OpAllow, "c", 1, 0)
	ds, _, err = redisstore.FunctionDo(s, redisstore.PackedFunction, 0, ops, []bool{true, true, true})
	if err != nil || !ds[0].Allowed || !ds[1].Allowed || !ds[2].Allowed || ds[2].Remaining != 1 {
		t.Fatalf("a group that fits: %+v %v", ds, err)
	}
}

// The fast path reads only its own layout, under its own rule: a value of
// the release before issue 19 (cmsgpack's encoding), a value written
// under another limit, and a window ahead of Redis's clock (a state a
// client clock ahead wrote) are read by the full decision, which converts
// them, as Function does on a twin key.
func TestPackedFastPathLeavesOtherValuesToDecide(t *testing.T) {
	srv := redistest.Standalone(t)
	old := oldLibrary(t, srv.Addr)
	s := openStore(t, srv, redisstore.Options{Timeout: 5 * time.Second, Prefix: "pkf"})
	ctx := context.Background()
	p := floodgate.MustPolicy("fixed", floodgate.Rule{Name: "r", Algorithm: floodgate.FixedWindow, Limit: 5, Period: time.Hour})

	// the release before's value: 2 counted, then this release admits 3
	for range 2 {
		oldDecide(t, s, old, 0, p.Op(floodgate.OpAllow, "old", 1, 0))
	}
	for i := range 4 {
		d, err := s.Do(ctx, 0, p.Op(floodgate.OpAllow, "old", 1, 0))
		if want := i < 3; err != nil || d.Allowed != want || d.Remaining != int64(max(0, 2-i)) {
			t.Fatalf("over the old value, request %d: %+v %v, want allowed %v", i, d, err, want)
		}
	}

	// another limit: 4 counted under 5, then the limit is 6
	for range 4 {
		if _, err := s.Do(ctx, 0, p.Op(floodgate.OpAllow, "lim", 1, 0)); err != nil {
			t.Fatal(err)
		}
	}
	p6, err := p.WithLimit("r", 6)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		d, err := s.Do(ctx, 0, p6.Op(floodgate.OpAllow, "lim", 1, 0))
		if want := i < 2; err != nil || d.Allowed != want || d.Limit != 6 {
			t.Fatalf("after the limit change, request %d: %+v %v, want allowed %v", i, d, err, want)
		}
	}

	// the value now carries the new signature (limit, burst, granularity,
	// soft, elastic, ceiling, count_rejected), not the old one's bytes
	if v := getRaw(t, s, s.Key("fixed", "lim")); !strings.Contains(v, "|6|6|0|0|0|6|0") {
		t.Fatalf("after the limit change the value is % x: want the new rule's signature", v)
	}
	// another window: 3 counted in a day's window are counted in the
	// hour's (the count moves into the new window, as Function converts)
	day := floodgate.MustPolicy("win", floodgate.Rule{Name: "r", Algorithm: floodgate.FixedWindow, Limit: 5, Period: 24 * time.Hour})
	hour := floodgate.MustPolicy("win", floodgate.Rule{Name: "r", Algorithm: floodgate.FixedWindow, Limit: 5, Period: time.Hour})
	for range 3 {
		if _, err := s.Do(ctx, 0, day.Op(floodgate.OpAllow, "w", 1, 0)); err != nil {
			t.Fatal(err)
		}
	}
	if d, err := s.Do(ctx, 0, hour.Op(floodgate.OpAllow, "w", 1, 0)); err != nil || !d.Allowed || d.Remaining != 1 {
		t.Fatalf("after the window's change: %+v %v, want 3 carried, 1 remaining", d, err)
	}

	// a window ahead: a client clock a day ahead wrote 4 of 5; on Redis's
	// clock the state is worked at its own time, as Function does
	ahead := openStore(t, srv, redisstore.Options{ClientTime: true, Timeout: 5 * time.Second, Prefix: "pkf"})
	single := openStore(t, srv, redisstore.Options{Timeout: 5 * time.Second, Prefix: "pkf", NoCoalescing: true})
	tomorrow := time.Now().Add(24 * time.Hour).UnixMicro()
	for _, k := range []string{"ahead", "twin"} {
		for range 4 {
			if _, err := ahead.Do(ctx, tomorrow, p.Op(floodgate.OpAllow, k, 1, 0)); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i := range 2 {
		got, err := s.Do(ctx, 0, p.Op(floodgate.OpAllow, "ahead", 1, 0))
		if err != nil {
			t.Fatal(err)
		}
		want, err := single.Do(ctx, 0, p.Op(floodgate.OpAllow, "twin", 1, 0))
		if err != nil {
			t.Fatal(err)
		}
		if got.Allowed != want.Allowed || got.Remaining != want.Remaining || !near(got.ResetAfter, want.ResetAfter) || got.Allowed != (i == 0) {
			t.Fatalf("a window ahead, request %d: packed %+v, Function %+v, want the 5th admitted and the 6th refused", i, got, want)
		}
	}
	// the same bytes but the expiry, which each call computes from its own
	// time when the state is ahead of it
	a, b := getRaw(t, s, s.Key("fixed", "ahead")), getRaw(t, s, s.Key("fixed", "twin"))
	wsA, countA, msA := fixedValue(t, []byte(a))
	wsB, countB, msB := fixedValue(t, []byte(b))
	if a[:len(a)-8] != b[:len(b)-8] || wsA != wsB || countA != 5 || countB != 5 || msA-msB > 2000 || msB-msA > 2000 {
		t.Fatalf("a window ahead: values differ:\npacked   % x\nFunction % x", a, b)
	}
}

// A call the function cannot read fails whole, charging nothing: a record
// naming a policy the call lacks, a truncated record, a policy argument
// cut short.
func TestPackedBadArguments(t *testing.T) {
	srv := redistest.Standalone(t)
	s := openStore(t, srv, redisstore.Options{Timeout: 5 * time.Second, Prefix: "pkb"})
	p := floodgate.MustPolicy("fixed", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 5, Period: time.Hour})
	ctx := context.Background()
	cmd, err := s.BatchCommand(ctx, 0, []floodgate.Op{p.Op(floodgate.OpAllow, "x", 1, 0), p.Op(floodgate.OpAllow, "y", 1, 0)})
	if err != nil {
		t.Fatal(err)
	}
	// FCALL fn 2 kx ky policies records
	if cmd[0] != "FCALL" || cmd[1] != redisstore.PackedFunction || cmd[2] != "2" || len(cmd) != 7 {
		t.Fatalf("command %q", cmd)
	}
	if rec := cmd[6]; rec != "\x00\x01\x00\x01\x00\x01\x00\x01" {
		t.Fatalf("records % x: want two 4-byte records of policy 1, cost 1", rec)
	}
	c := s.Client()
	for name, edit := range map[string]func([]string){
		"policy index past the call's": func(a []string) { a[6] = "\x00\x01\x00\x01\x00\x02\x00\x01" },
		"a truncated record":           func(a []string) { a[6] = "\x00\x01\x00\x01\x00\x01\x00" },
		"a record too many":            func(a []string) { a[6] += "\x00\x01\x00\x01" },
		"a policy cut short":           func(a []string) { a[5] = a[5][:len(a[5])-3] },
		"an unknown record kind":       func(a []string) { a[6] = "\x00\x01\x00\x01\x07\x01\x00\x01" },
		"an unknown kind, a full record's length": func(a []string) {
			a[6] = "\x00\x01\x00\x01\x02\x01\x00" + strings.Repeat("\x00", 40)
		},
	} {
		a := append([]string(nil), cmd...)
		edit(a)
		if err := c.Do(ctx, c.B().Arbitrary(a[0]).Args(a[1:]...).Build()).Error(); err == nil {
			t.Errorf("%s: no error", name)
		}
		for _, k := range []string{"x", "y"} {
			if v := getRaw(t, s, s.Key("fixed", k)); v != "" {
				t.Fatalf("%s: key %s charged: % x", name, k, v)
			}
		}
	}
	// the command as built decides both
	v, err := c.Do(ctx, c.B().Arbitrary(cmd[0]).Args(cmd[1:]...).Build()).ToString()
	if err != nil || len(v) != 34 || v[0] != 1 || v[17] != 1 {
		t.Fatalf("reply % x %v: want two admissions of 17 bytes", v, err)
	}
}

// During a rolling upgrade a node of the release before may load its
// library last, without PackedFunction: this release's next call finds it
// missing, loads the library again, and decides.
func TestPackedFunctionReloaded(t *testing.T) {
	srv := redistest.Standalone(t)
	s := openStore(t, srv, redisstore.Options{Timeout: 5 * time.Second, Prefix: "pkl"})
	p := floodgate.MustPolicy("fixed", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 5, Period: time.Hour})
	ctx := context.Background()
	if d, err := s.Do(ctx, 0, p.Op(floodgate.OpAllow, "k", 1, 0)); err != nil || !d.Allowed {
		t.Fatalf("%+v %v", d, err)
	}
	// the release before issue 19's library, loaded as floodgate_v1
	// (replacing this release's) by a node of that release
	old := oldLibrary(t, srv.Addr)
	code, err := old.Do(ctx, old.B().FunctionList().Libraryname("floodgate_old").Withcode().Build()).ToArray()
	if err != nil || len(code) != 1 {
		t.Fatalf("function list: %v %v", code, err)
	}
	m, err := code[0].AsMap()
	if err != nil {
		t.Fatal(err)
	}
	lc := m["library_code"]
	src, err := lc.ToString()
	if err != nil {
		t.Fatal(err)
	}
	src = strings.ReplaceAll(src, "floodgate_old", "floodgate_v1")
	if err := old.Do(ctx, old.B().FunctionLoad().Replace().FunctionCode(src).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if err := old.Do(ctx, old.B().Fcall().Function(redisstore.PackedFunction).Numkeys(0).Build()).Error(); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("the old library has %s: %v", redisstore.PackedFunction, err)
	}
	for i := range 4 {
		d, err := s.Do(ctx, 0, p.Op(floodgate.OpAllow, "k", 1, 0))
		if err != nil || !d.Allowed || d.Remaining != int64(3-i) || d.Degraded {
			t.Fatalf("after the old library was loaded, request %d: %+v %v", i, d, err)
		}
	}
}

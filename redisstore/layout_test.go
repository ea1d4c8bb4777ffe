package redisstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/redistest"
	"github.com/floodgate/floodgate/redisstore"
	"github.com/floodgate/floodgate/storekit"
)

// oldLibrary loads the library of the release before issue 19 (whose
// values are cmsgpack's own encoding: testdata/library-issue18.lua, from
// `go run ./cmd/luaab -print` at that release) under the name
// floodgate_old, and returns a client to call it with.
func oldLibrary(t *testing.T, addr string) rueidis.Client {
	t.Helper()
	lib, err := os.ReadFile("testdata/library-issue18.lua")
	if err != nil {
		t.Fatal(err)
	}
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	code := strings.ReplaceAll(string(lib), "floodgate_v1", "floodgate_old")
	if err := c.Do(context.Background(), c.B().FunctionLoad().Replace().FunctionCode(code).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	return c
}

// A fleet upgrades with its keys live, and instances of both releases
// share the Redis (each loads its own library, and the last to load wins):
// random traces whose decisions go, at random, through the old release's
// library or this one's, on the same keys, give the Go engine's decisions
// at every step. Each reads what the other wrote.
func TestLayoutOldAndNewShareKeys(t *testing.T) {
	srv := redistest.Standalone(t)
	old := oldLibrary(t, srv.Addr)
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprint("batch=", batch), func(t *testing.T) {
			s := openStore(t, srv, redisstore.Options{ClientTime: true, Timeout: 5 * time.Second, Prefix: fmt.Sprint("mix", batch)})
			if batch {
				redisstore.SetBatchAlways(s)
			}
			mixedTraces(t, s, old, 40)
		})
	}
}

func mixedTraces(t *testing.T, s *redisstore.Store, old rueidis.Client, traces int) {
	ctx := context.Background()
	var viaOld, viaNew int
	for trace := range traces {
		r := rand.New(rand.NewPCG(uint64(trace)*104729+3, 19))
		spare := false
		p := randomPolicy(r, fmt.Sprintf("m%d", trace), &spare)
		if trace%4 == 0 { // a state of more than 15 words: cmsgpack's encoding both ways
			p = floodgate.MustPolicy(fmt.Sprintf("m%d", trace), floodgate.Rule{Name: "log", Algorithm: floodgate.SlidingLog, Limit: 40, Period: time.Minute})
		}
		st := map[string][]int64{}
		now := time.Date(2026, time.Month(1+r.IntN(12)), 1+r.IntN(28), r.IntN(24), 0, 0, 0, time.UTC).UnixMicro()
		for step := range 60 {
			now += r.Int64N(5_000_000)
			spare = r.IntN(2) == 0
			op := mixedOp(r, p, spare)
			key := op.Key
			if st[key] == nil {
				st[key] = make([]int64, storekit.Width(p))
			}
			want := storekit.Apply(p, st[key], now, op)
			var got floodgate.Decision
			if r.IntN(2) == 0 {
				viaOld++
				got = oldDecide(t, s, old, now, op)
			} else {
				viaNew++
				var err error
				if got, err = s.Do(ctx, now, op); err != nil {
					t.Fatal(err)
				}
			}
			if !sameDecision(got, want) {
				t.Fatalf("trace %d step %d (%s %s cost %d, rules %+v): got %+v, want %+v", trace, step, key, op.Kind, op.Cost, p.Rules(), got, want)
			}
		}
	}
	if viaOld == 0 || viaNew == 0 {
		t.Fatalf("decisions through the old library %d, the new %d", viaOld, viaNew)
	}
}

// mixedOp draws one operation of a mixed trace under p.
func mixedOp(r *rand.Rand, p *floodgate.Policy, spare bool) floodgate.Op {
	kinds := []floodgate.OpKind{floodgate.OpAllow, floodgate.OpAllow, floodgate.OpAllow, floodgate.OpPeek, floodgate.OpCharge, floodgate.OpRefund}
	op := floodgate.Op{Policy: p, Key: fmt.Sprintf("k%d", r.IntN(2)), Kind: kinds[r.IntN(len(kinds))], Cost: r.Int64N(3)}
	for i, rule := range p.Rules() {
		if rule.Mode == floodgate.Elastic && spare {
			op.Spare |= 1 << i
		}
	}
	return op
}

// sameDecision compares what the old library's reply carries.
func sameDecision(got, want floodgate.Decision) bool {
	return got.Allowed == want.Allowed && got.Remaining == want.Remaining && got.Limit == want.Limit &&
		got.ResetAfter == want.ResetAfter && got.RetryAfter == want.RetryAfter && got.Rule == want.Rule
}

// oldDecide makes op's decision through the old library's apply, with the
// arguments this store sends (they did not change), and reads its reply.
func oldDecide(t *testing.T, s *redisstore.Store, old rueidis.Client, now int64, op floodgate.Op) floodgate.Decision {
	t.Helper()
	cmd, err := s.Command(context.Background(), now, op)
	if err != nil {
		t.Fatal(err)
	}
	if cmd[0] != "FCALL" {
		t.Fatalf("command %q", cmd[0])
	}
	cmd[1] = strings.ReplaceAll(cmd[1], "floodgate_v1", "floodgate_old")
	v, err := old.Do(context.Background(), old.B().Arbitrary(cmd...).Build()).AsIntSlice()
	if err != nil {
		t.Fatal(err)
	}
	return floodgate.Decision{Allowed: v[0] == 1, Limit: v[4], Remaining: v[5], ResetAfter: time.Duration(v[6]) * time.Microsecond,
		RetryAfter: time.Duration(v[7]) * time.Microsecond, Rule: op.Policy.Rules()[v[3]].Name}
}

// pttl returns key's TTL in ms.
func pttl(t *testing.T, addr, key string) int64 {
	t.Helper()
	out, err := redistest.Cmd(addr, "PTTL", key)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseInt(out, 10, 64)
	if err != nil {
		t.Fatalf("PTTL %s: %q", key, out)
	}
	return n
}

// On Redis's clock a write keeps the key's TTL (SET KEEPTTL) only while
// it lasts as long as the state needs: a token bucket's key, whose state
// needs longer with every request, gets a longer TTL each time; a fixed
// window's keeps the end of its window.
func TestLayoutTTLFollowsState(t *testing.T) {
	srv := redistest.Standalone(t)
	s := openStore(t, srv, redisstore.Options{Timeout: 5 * time.Second})
	ctx := context.Background()
	bucket := floodgate.MustPolicy("bucket", floodgate.Rule{Algorithm: floodgate.TokenBucket, Limit: 10, Period: time.Hour})
	var ttls []int64
	for range 5 {
		d, err := s.Do(ctx, 0, bucket.Op(floodgate.OpAllow, "b", 1, 0))
		if err != nil || !d.Allowed {
			t.Fatalf("%+v %v", d, err)
		}
		ttls = append(ttls, pttl(t, srv.Addr, s.Key("bucket", "b")))
	}
	// each request adds 6 minutes to the bucket's drain: the k-th leaves
	// a TTL above k*6 minutes less a minute of slack for a slow host
	for k, ttl := range ttls {
		if lo := int64(k+1)*360_000 - 60_000; ttl < lo {
			t.Fatalf("bucket TTLs %v ms: request %d left %d, want at least %d", ttls, k+1, ttl, lo)
		}
	}
	fixed := floodgate.MustPolicy("fixed", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 10, Period: time.Hour})
	ttls = ttls[:0]
	for range 3 {
		if _, err := s.Do(ctx, 0, fixed.Op(floodgate.OpAllow, "f", 1, 0)); err != nil {
			t.Fatal(err)
		}
		ttls = append(ttls, pttl(t, srv.Addr, s.Key("fixed", "f")))
	}
	// the window's end, whichever write set it: within the hour, and
	// never growing
	if ttls[0] <= 0 || ttls[0] > 3_600_001 || !slices.IsSortedFunc(ttls, func(a, b int64) int { return int(b - a) }) {
		t.Fatalf("fixed window TTLs %v ms", ttls)
	}
}

// The same on Redis's clock, where this release's values carry the key's
// expiry after the rules (a second MessagePack object, which the old
// release's cmsgpack.unpack returns and it ignores): requests through
// either library, at random, admit exactly the limit, in order.
func TestLayoutOldAndNewOnRedisClock(t *testing.T) {
	srv := redistest.Standalone(t)
	old := oldLibrary(t, srv.Addr)
	s := openStore(t, srv, redisstore.Options{Timeout: 5 * time.Second})
	r := rand.New(rand.NewPCG(7, 19))
	for _, p := range []*floodgate.Policy{
		floodgate.MustPolicy("fixed", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 7, Period: time.Hour}),
		floodgate.MustPolicy("bucket", floodgate.Rule{Algorithm: floodgate.TokenBucket, Limit: 7, Period: time.Hour}),
		floodgate.MustPolicy("log", floodgate.Rule{Algorithm: floodgate.SlidingLog, Limit: 20, Period: time.Hour}),
		floodgate.MustPolicy("two", floodgate.Rule{Name: "hour", Algorithm: floodgate.FixedWindow, Limit: 9, Period: time.Hour},
			floodgate.Rule{Name: "day", Algorithm: floodgate.SlidingWindow, Limit: 6, Period: 24 * time.Hour}),
	} {
		limit := p.Rules()[len(p.Rules())-1].Limit
		for i := range 2*limit + 2 {
			op := p.Op(floodgate.OpAllow, "k", 1, 0)
			var d floodgate.Decision
			if r.IntN(2) == 0 {
				d = oldDecide(t, s, old, 0, op)
			} else {
				var err error
				if d, err = s.Do(context.Background(), 0, op); err != nil {
					t.Fatal(err)
				}
			}
			if want := i < limit; d.Allowed != want || d.Remaining != max(0, limit-i-1) {
				t.Fatalf("%s: request %d: %+v, want allowed %v, remaining %d", p.Name(), i, d, want, max(0, limit-i-1))
			}
		}
	}
}

// shareOn calls ShareFunction on op's key as share.go does (the apply
// call's arguments, the four numbers t0, back, want, 0), and returns its
// reply: granted, now, rule, limit, remaining, reset.
func shareOn(t *testing.T, s *redisstore.Store, c rueidis.Client, now int64, op floodgate.Op, t0, back, want int64) []int64 {
	t.Helper()
	cmd, err := s.Command(context.Background(), now, op)
	if err != nil {
		t.Fatal(err)
	}
	cmd[1] = redisstore.ShareFunction
	cmd[5], cmd[6], cmd[7], cmd[8] = fmt.Sprint(t0), fmt.Sprint(back), fmt.Sprint(want), "0"
	v, err := c.Do(context.Background(), c.B().Arbitrary(cmd...).Build()).AsIntSlice()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// Local share and write-back read and write a key's value through the
// same state helpers as a decision (85_state.lua), so across an upgrade
// they read the values the release before wrote (cmsgpack's encoding), and
// the old release reads what they write: a window's count is carried
// exactly both ways, and no slice or hit is lost or counted twice.
func TestLayoutTiersReadOldValues(t *testing.T) {
	srv := redistest.Standalone(t)
	old := oldLibrary(t, srv.Addr)
	s := openStore(t, srv, redisstore.Options{ClientTime: true, Timeout: 5 * time.Second, Prefix: "tiers"})
	ctx := context.Background()
	const T = int64(1_800_000_000_000_000) + 5_000_000 // µs, 5 s into an hour
	allow := func(p *floodgate.Policy, viaOld bool, n int) (d floodgate.Decision) {
		for range n {
			op := p.Op(floodgate.OpAllow, "k", 1, 0)
			if viaOld {
				d = oldDecide(t, s, old, T, op)
			} else {
				var err error
				if d, err = s.Do(ctx, T, op); err != nil {
					t.Fatal(err)
				}
			}
		}
		return d
	}
	fixed := floodgate.MustPolicy("share", floodgate.Rule{Name: "hour", Algorithm: floodgate.FixedWindow, Limit: 10, Period: time.Hour},
		floodgate.Rule{Name: "day", Algorithm: floodgate.FixedWindow, Limit: 12, Period: 24 * time.Hour})
	allow(fixed, true, 4) // the old release counts 4
	op := fixed.Op(floodgate.OpAllow, "k", 1, 0)
	if v := shareOn(t, s, old, T, op, 0, 0, 3); v[0] != 3 || v[4] != 3 {
		t.Fatalf("a slice of 3 over the old value of 4 of 10: %v, want 3 granted, 3 remaining", v)
	}
	allow(fixed, true, 1) // the old release reads the new value: 8
	if v := shareOn(t, s, old, T, op, T, 2, 0); v[0] != 0 {
		t.Fatalf("a give-back: %v", v)
	}
	// 6 counted: the new release admits 4, the old none after them
	if d := allow(fixed, false, 4); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("after the give-back of 2 of 8: %+v, want the 4th of 4 admitted", d)
	}
	if d := allow(fixed, true, 1); d.Allowed {
		t.Fatalf("the old release over the new value at the limit: %+v", d)
	}

	for _, algo := range []floodgate.Algorithm{floodgate.FixedWindow, floodgate.SlidingWindow} {
		wbOverOld(t, s, algo, T, allow)
	}
}

// A fixed window's count on Redis's clock is written in place (SETRANGE
// of the state's bytes, the window's TTL kept): the value holds exactly
// what a whole write would (the window, the count admitted, the expiry
// covering the window's end), its TTL never grows, and the release before
// reads it.
func TestLayoutInPlaceWrite(t *testing.T) {
	srv := redistest.Standalone(t)
	old := oldLibrary(t, srv.Addr)
	s := openStore(t, srv, redisstore.Options{Timeout: 5 * time.Second, Prefix: "inplace"})
	ctx := context.Background()
	p := floodgate.MustPolicy("fixed", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 5, Period: time.Hour})
	key := s.Key("fixed", "k")
	var ttls []int64
	for i := range 7 {
		d, err := s.Do(ctx, 0, p.Op(floodgate.OpAllow, "k", 1, 0))
		if err != nil {
			t.Fatal(err)
		}
		if want := i < 5; d.Allowed != want || d.Remaining != int64(max(0, 4-i)) {
			t.Fatalf("request %d: %+v, want allowed %v, remaining %d", i, d, want, max(0, 4-i))
		}
		ttls = append(ttls, pttl(t, srv.Addr, key))
	}
	if !slices.IsSortedFunc(ttls, func(a, b int64) int { return int(b - a) }) || ttls[0] <= 0 {
		t.Fatalf("TTLs %v ms: want positive, never growing", ttls)
	}
	raw, err := old.Do(ctx, old.B().Get().Key(key).Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	ws, count, ms := fixedValue(t, []byte(raw))
	if count != 5 || ws%3_600_000_000 != 0 || ms*1000 < ws+3_600_000_000 {
		t.Fatalf("value: window %d, count %d, expiry %d ms: want an hour's window, 5, the window's end or later", ws, count, ms)
	}
	if d := oldDecide(t, s, old, 0, p.Op(floodgate.OpAllow, "k", 1, 0)); d.Allowed || d.Remaining != 0 {
		t.Fatalf("the release before over the value: %+v, want refused", d)
	}
}

// fixedValue reads the end of a value in this release's layout holding one
// rule's state of two words and an expiry: the window, the count, the
// expiry in ms.
func fixedValue(t *testing.T, b []byte) (ws, count, ms int64) {
	t.Helper()
	n := len(b)
	if n < 28 || b[n-28] != 0x92 || b[n-27] != 0xcf || b[n-18] != 0xcf || b[n-9] != 0xcf {
		t.Fatalf("value % x: want a state of two fixed-width words and an expiry", b)
	}
	word := func(at int) int64 {
		var v int64
		for _, c := range b[at : at+8] {
			v = v<<8 | int64(c)
		}
		return v
	}
	return word(n - 26), word(n - 17), word(n - 8)
}

// wbOverOld: write-back's function over a value the release before wrote
// (4 admitted of 10), then the release before over its value.
func wbOverOld(t *testing.T, s *redisstore.Store, algo floodgate.Algorithm, T int64, allow func(*floodgate.Policy, bool, int) floodgate.Decision) {
	t.Helper()
	wb := floodgate.MustPolicy("wb"+string(algo), floodgate.Rule{Name: "r", Algorithm: algo, Limit: 10, Period: time.Hour,
		Tier: floodgate.TierWriteBack, Budget: 0.5})
	allow(wb, true, 4)
	ws := T - T%3_600_000_000
	v, err := s.WriteBackCall(wb, "k", T, ws, 2, 1)
	if err != nil {
		t.Fatal(err)
	}
	if want := []int64{1, 4, 6, ws, 0, 7}; !slices.Equal(v[:6], want) {
		t.Fatalf("%s: 2 hits and 1 exact over the old value of 4: %v, want %v", algo, v[:6], want)
	}
	if d := allow(wb, true, 3); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("%s: the old release over the new value of 7 of 10: %+v, want 3 more admitted", algo, d)
	}
	if d := allow(wb, false, 1); d.Allowed {
		t.Fatalf("%s: at the limit: %+v", algo, d)
	}
}

package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
)

// Limit and policy changes: a new version of a policy (same name) keeps
// what each key consumed, in requests, clamped to the new capacity, rule by
// rule matched by name; a rule new to the policy starts fresh.
func testChange(t *testing.T, newStore NewStore) {
	for _, c := range algoCases() {
		switch c.name {
		case "token_bucket_burst", "elastic_token_bucket":
			continue // a fixed burst or ceiling; see Change/Burst
		}
		t.Run("SetLimit/"+c.name, func(t *testing.T) {
			e := newEnv(t, newStore)
			l := e.limiter("p", c.rule)
			// The capacity a key's count is clamped to at limit n.
			capacity := func(n int64) int64 { return n }
			if c.rule.Mode == floodgate.Soft {
				capacity = func(n int64) int64 { return n + max(1, n*c.rule.SoftPercent/100) }
			}
			e.at(5 * time.Second)
			if d := e.allowN(l, "k", 6); !d.Allowed {
				t.Fatalf("AllowN(6): %s", show(d))
			}
			used := int64(6)
			for _, n := range []int64{20, 4, 10, 3, 30} {
				if err := l.SetLimit("r", n); err != nil {
					t.Fatal(err)
				}
				used = min(used, capacity(n))
				d := e.peek(l, "k", 0)
				// Absolute: 6 of 10 is 6 of 20, not 12.
				if d.Limit != n || d.Remaining != max(0, n-used) || d.Rule != "r" {
					t.Errorf("after SetLimit(%d): %s; want limit %d, %d remaining", n, show(d), n, max(0, n-used))
				}
			}
			// Other keys are untouched and start fresh under the new limit.
			e.expect("a new key", e.peek(l, "other", 0), ok("r", 30, 30, 0))
		})
	}
	// Consumption from an earlier window or sub-window is clamped too: 6
	// requests at 55 s still count at 65 s; lowered to 4 they count 4,
	// raised back to 10 they count 4.
	for _, c := range []struct {
		name string
		rule floodgate.Rule
	}{
		{"token_bucket", floodgate.Rule{Name: "r", Limit: 10, Period: time.Minute}},
		{"sliding_log", floodgate.Rule{Name: "r", Algorithm: floodgate.SlidingLog, Limit: 10, Period: time.Minute}},
		{"sliding_window", floodgate.Rule{Name: "r", Algorithm: floodgate.SlidingWindow, Limit: 10, Period: time.Minute}},
		{"sliding_subwindow", floodgate.Rule{Name: "r", Algorithm: floodgate.SlidingSubwindow, Limit: 10, Period: time.Minute, Granularity: 10 * time.Second}},
	} {
		t.Run("SetLimitEarlierWindow/"+c.name, func(t *testing.T) {
			e := newEnv(t, newStore)
			l := e.limiter("p", c.rule)
			e.at(55 * time.Second)
			e.allowN(l, "k", 6)
			e.at(65 * time.Second)
			if d := e.peek(l, "k", 0); d.Remaining != 4 && d.Remaining != 5 {
				t.Fatalf("before: %s", show(d))
			}
			if err := l.SetLimit("r", 4); err != nil {
				t.Fatal(err)
			}
			if d := e.peek(l, "k", 0); !d.Allowed || d.Remaining != 0 {
				t.Errorf("at limit 4: %s; want allowed (cost 0) with 0 remaining", show(d))
			}
			if err := l.SetLimit("r", 10); err != nil {
				t.Fatal(err)
			}
			if d := e.peek(l, "k", 0); d.Remaining != 6 {
				t.Errorf("back at limit 10: %s; want 6 remaining (4 counted)", show(d))
			}
		})
	}

	// The burst, when set apart from the limit, stays: the rate changes.
	t.Run("SetLimit/Burst", func(t *testing.T) {
		e := newEnv(t, newStore)
		l := e.limiter("p", floodgate.Rule{Name: "r", Limit: 10, Period: time.Minute, Burst: 20})
		e.expect("AllowN(6)", e.allowN(l, "k", 6), ok("r", 10, 14, 36*time.Second))
		if err := l.SetLimit("r", 5); err != nil {
			t.Fatal(err)
		}
		// 6 requests of 12 s each at 5 a minute.
		e.expect("after SetLimit(5)", e.peek(l, "k", 0), ok("r", 5, 14, 72*time.Second))
		e.at(12 * time.Second)
		e.expect("12 s later", e.peek(l, "k", 0), ok("r", 5, 15, 60*time.Second))
	})
	t.Run("SetLimit/UnknownRule", func(t *testing.T) {
		e := newEnv(t, newStore)
		l := e.limiter("p", floodgate.Rule{Name: "r", Limit: 10, Period: time.Minute})
		var re *floodgate.RuleError
		if err := l.SetLimit("nope", 5); !errors.As(err, &re) {
			t.Errorf("SetLimit of an unknown rule: %v, want a *RuleError", err)
		}
	})

	t.Run("SetPolicy/ByRuleName", func(t *testing.T) {
		e := newEnv(t, newStore)
		m := time.Minute
		a := floodgate.Rule{Name: "a", Algorithm: floodgate.FixedWindow, Limit: 10, Period: m}
		b := floodgate.Rule{Name: "b", Algorithm: floodgate.FixedWindow, Limit: 5, Period: m}
		c := floodgate.Rule{Name: "c", Algorithm: floodgate.FixedWindow, Limit: 3, Period: m}
		l := floodgate.NewLimiter(e.policy("P", a, b), e.store, floodgate.WithClock(e.clk))
		e.at(20 * time.Second)
		e.expect("AllowN(4)", e.allowN(l, "k", 4), ok("b", 5, 1, 40*time.Second))
		// b is dropped and c added in its place: c starts fresh (matched by
		// name, not by position), a keeps its 4.
		l.SetPolicy(e.policy("P", a, c))
		e.expect("with a and c", e.peek(l, "k", 0), ok("c", 3, 3, 0))
		l.SetPolicy(e.policy("P", a))
		e.expect("with a alone", e.peek(l, "k", 0), ok("a", 10, 6, 40*time.Second))
		// A renamed rule is a new rule.
		a2 := a
		a2.Name = "a2"
		l.SetPolicy(e.policy("P", a2))
		e.expect("a renamed", e.peek(l, "k", 0), ok("a2", 10, 10, 0))
	})
	// A rule dropped from a policy and added back in a later version is
	// new to that version, and starts fresh: a key's state follows the
	// policy version to version (storekit.Migrate), it does not wait for a
	// rule's return.
	t.Run("SetPolicy/DroppedRuleReturnsFresh", func(t *testing.T) {
		e := newEnv(t, newStore)
		m := time.Minute
		a := floodgate.Rule{Name: "a", Algorithm: floodgate.FixedWindow, Limit: 10, Period: m}
		b := floodgate.Rule{Name: "b", Algorithm: floodgate.FixedWindow, Limit: 5, Period: m}
		l := floodgate.NewLimiter(e.policy("P", a, b), e.store, floodgate.WithClock(e.clk))
		e.at(20 * time.Second)
		e.expect("AllowN(4)", e.allowN(l, "k", 4), ok("b", 5, 1, 40*time.Second))
		l.SetPolicy(e.policy("P", a))
		e.expect("with a alone", e.peek(l, "k", 0), ok("a", 10, 6, 40*time.Second))
		l.SetPolicy(e.policy("P", a, b))
		e.expect("with a and b again", e.peek(l, "k", 0), ok("b", 5, 5, 0))
	})
	// A rule that changes algorithm keeps its consumption, counted as
	// consumed now.
	t.Run("SetPolicy/Algorithm", func(t *testing.T) {
		e := newEnv(t, newStore)
		m := time.Minute
		l := floodgate.NewLimiter(e.policy("P", floodgate.Rule{Name: "a", Algorithm: floodgate.FixedWindow, Limit: 10, Period: m}), e.store, floodgate.WithClock(e.clk))
		e.at(50 * time.Second)
		e.expect("AllowN(6)", e.allowN(l, "k", 6), ok("a", 10, 4, 10*time.Second))
		l.SetPolicy(e.policy("P", floodgate.Rule{Name: "a", Limit: 10, Period: m}))
		e.expect("as a token bucket", e.peek(l, "k", 0), ok("a", 10, 4, 36*time.Second))
		l.SetPolicy(e.policy("P", floodgate.Rule{Name: "a", Algorithm: floodgate.SlidingLog, Limit: 10, Period: m}))
		e.expect("as a sliding log", e.peek(l, "k", 0), ok("a", 10, 4, 60*time.Second))
	})
	// Policies of different names never share state, even for one key.
	t.Run("SetPolicy/OtherName", func(t *testing.T) {
		e := newEnv(t, newStore)
		r := floodgate.Rule{Name: "r", Algorithm: floodgate.FixedWindow, Limit: 10, Period: time.Minute}
		l := e.limiter("P", r)
		l2 := e.limiter("Q", r)
		e.allowN(l, "k", 10)
		e.expect("the same key under another policy", e.peek(l2, "k", 0), ok("r", 10, 10, 0))
	})
}

// Batches decide several keys in one store call, each on its own.
func testBatch(t *testing.T, newStore NewStore) {
	t.Run("IPAndUser", func(t *testing.T) {
		e := newEnv(t, newStore)
		m := time.Minute
		ip := e.limiter("ip", floodgate.Rule{Name: "ip", Algorithm: floodgate.FixedWindow, Limit: 3, Period: m})
		user := e.limiter("user", floodgate.Rule{Name: "user", Algorithm: floodgate.FixedWindow, Limit: 2, Period: m})
		batch := func(items []floodgate.Item, want ...floodgate.Decision) {
			t.Helper()
			out := make([]floodgate.Decision, len(items))
			if err := floodgate.AllowBatch(e.ctx, items, out); err != nil {
				t.Fatal(err)
			}
			for i := range items {
				e.expect("item "+items[i].Key, out[i], want[i])
			}
		}
		both := []floodgate.Item{{Limiter: ip, Key: "10.0.0.1", Cost: 1}, {Limiter: user, Key: "alice", Cost: 1}}
		e.at(10 * time.Second)
		batch(both, ok("ip", 3, 2, 50*time.Second), ok("user", 2, 1, 50*time.Second))
		batch(both, ok("ip", 3, 1, 50*time.Second), ok("user", 2, 0, 50*time.Second))
		// alice is spent; the IP is still counted: keys are independent,
		// not all or nothing across the batch.
		batch(both, ok("ip", 3, 0, 50*time.Second), no("user", 2, 0, 50*time.Second, 50*time.Second))
		batch(both, no("ip", 3, 0, 50*time.Second, 50*time.Second), no("user", 2, 0, 50*time.Second, 50*time.Second))
		// Another user, and the same key string under the other limiter,
		// are other keys; cost 0 peeks.
		batch([]floodgate.Item{
			{Limiter: user, Key: "bob", Cost: 2},
			{Limiter: user, Key: "10.0.0.1", Cost: 1},
			{Limiter: ip, Key: "alice", Cost: 0},
			{Limiter: ip, Key: "10.0.0.2", Cost: 4},
		}, ok("user", 2, 0, 50*time.Second), ok("user", 2, 1, 50*time.Second), ok("ip", 3, 3, 0), tooLarge("ip", 3, 3, 0))
		// The batch's decisions are the keys' state.
		e.expect("alice", e.peek(user, "alice", 0), ok("user", 2, 0, 50*time.Second))
		e.expect("10.0.0.1", e.peek(ip, "10.0.0.1", 0), ok("ip", 3, 0, 50*time.Second))
		e.expect("bob", e.peek(user, "bob", 0), ok("user", 2, 0, 50*time.Second))
		// One key twice in a batch: in order, the second sees the first.
		batch([]floodgate.Item{{Limiter: ip, Key: "k", Cost: 2}, {Limiter: ip, Key: "k", Cost: 2}, {Limiter: ip, Key: "k", Cost: 1}},
			ok("ip", 3, 1, 50*time.Second), no("ip", 3, 1, 50*time.Second, 50*time.Second), ok("ip", 3, 0, 50*time.Second))
		e.at(time.Minute)
		batch(both, ok("ip", 3, 2, time.Minute), ok("user", 2, 1, time.Minute))
	})
	// A batch of one and of none.
	t.Run("Sizes", func(t *testing.T) {
		e := newEnv(t, newStore)
		l := e.limiter("p", floodgate.Rule{Name: "r", Limit: 1, Period: time.Second})
		if err := floodgate.AllowBatch(e.ctx, nil, nil); err != nil {
			t.Fatal(err)
		}
		out := make([]floodgate.Decision, 1)
		if err := floodgate.AllowBatch(e.ctx, []floodgate.Item{{Limiter: l, Key: "k", Cost: 1}}, out); err != nil {
			t.Fatal(err)
		}
		e.expect("one", out[0], ok("r", 1, 0, time.Second))
	})
	// Many keys in one batch, on a multi-rule policy.
	t.Run("Many", func(t *testing.T) {
		e := newEnv(t, newStore)
		l := e.limiter("p",
			floodgate.Rule{Name: "tb", Limit: 5, Period: time.Second},
			floodgate.Rule{Name: "log", Algorithm: floodgate.SlidingLog, Limit: 3, Period: time.Minute})
		keys := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
		items := make([]floodgate.Item, len(keys))
		for i, k := range keys {
			items[i] = floodgate.Item{Limiter: l, Key: k, Cost: int64(i%4 + 1)}
		}
		out := make([]floodgate.Decision, len(items))
		if err := floodgate.AllowBatch(e.ctx, items, out); err != nil {
			t.Fatal(err)
		}
		for i := range items {
			var want floodgate.Decision
			switch cost := int64(i%4 + 1); {
			case cost <= 3:
				want = ok("log", 3, 3-cost, time.Minute)
			default:
				want = tooLarge("log", 3, 3, 0)
			}
			e.expect("key "+keys[i], out[i], want)
		}
	})
}

package decide

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/memstore"
	"github.com/floodgate/floodgate/rules"
)

// The store key is the domain, NUL and the bounded key, and
// SplitStoreKey gives both back; a bounded key is its own bound, so a key
// bounded twice (the admin API's, then StoreKey's) is one key.
func TestStoreKey(t *testing.T) {
	for _, k := range []string{"k=v", strings.Repeat("x", MaxKeyBytes), strings.Repeat("é", MaxKeyBytes)} {
		sk := StoreKey("dom", k)
		d, key, ok := SplitStoreKey(sk)
		if !ok || d != "dom" || key != BoundKey(k) || len(key) > MaxKeyBytes {
			t.Errorf("%d bytes: split %q %d bytes %v", len(k), d, len(key), ok)
		}
		if StoreKey("dom", key) != sk {
			t.Errorf("%d bytes: bounding twice gives another key", len(k))
		}
	}
	if BoundKey(strings.Repeat("a", 2000)) == BoundKey(strings.Repeat("a", 1999)+"b") {
		t.Error("two long keys bounded alike")
	}
}

// Plan appends to the caller's operations, and each result's Op indexes
// them there; Finish reads the decisions at those indexes, and a caller
// that moves an operation sets Op to its place.
func TestPlanIntoCallersOps(t *testing.T) {
	d, err := rules.Parse("t.yaml", []byte(`domain: t
descriptors:
  - key: a
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: q
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: z
    rate_limit: {unit: hour, requests_per_unit: 0}
`))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := rules.NewConfig(d)
	if err != nil {
		t.Fatal(err)
	}
	clk := clock.NewManual(time.Date(2026, 1, 1, 0, 0, 30, 0, time.UTC))
	store := memstore.MustNew(memstore.Options{Clock: clk})
	defer store.Close()
	own := floodgate.MustPolicy("own", floodgate.Rule{Name: "r", Limit: 9, Period: time.Second})
	dec := New(Options{})
	descs := []Descriptor{
		{Entries: []rules.Entry{{Key: "a", Value: "1"}}, Hits: 1},
		{Entries: []rules.Entry{{Key: "q", Value: "1"}}, Hits: 1},
		{Entries: []rules.Entry{{Key: "z", Value: "1"}}, Hits: 1},
		{Entries: []rules.Entry{{Key: "none", Value: "1"}}, Hits: 1},
	}
	for round, want := range [][]Code{{OK, OK, Over, OK}, {Over, QuotaViolation, Over, OK}} {
		res := make([]Result, len(descs))
		ops := []floodgate.Op{own.Op(floodgate.OpAllow, "mine", 1, 0)}
		ops, err := dec.Plan(context.Background(), cfg, "t", descs, res, ops)
		if err != nil {
			t.Fatal(err)
		}
		if len(ops) != 3 || res[0].Op != 1 || res[1].Op != 2 || res[2].Op != -1 || res[3].Op != -1 {
			t.Fatalf("%d ops, results' ops %d %d %d %d", len(ops), res[0].Op, res[1].Op, res[2].Op, res[3].Op)
		}
		if !res[0].Member || res[1].Member || ops[1].Key != StoreKey("t", "a=1") {
			t.Fatalf("members %v %v, key %q", res[0].Member, res[1].Member, ops[1].Key)
		}
		decs := make([]floodgate.Decision, len(ops))
		if err := store.DoBatch(context.Background(), clk.NowMicro(), ops, decs); err != nil {
			t.Fatal(err)
		}
		dec.Finish(clk.NowMicro(), res, decs)
		for i, w := range want {
			if res[i].Code != w {
				t.Errorf("round %d, descriptor %d: code %d, want %d", round, i, res[i].Code, w)
			}
		}
		// the blocked one states its window's end: a fixed window of an hour, 30 s in
		if w := res[2].Decision.RetryAfter; w != time.Hour-30*time.Second {
			t.Errorf("round %d: the blocked limit's wait %v", round, w)
		}
	}
}

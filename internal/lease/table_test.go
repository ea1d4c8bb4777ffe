package lease

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/floodgate/floodgate/clock"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func mustConfig(t testing.TB, src string) *Config {
	t.Helper()
	cfg, err := ParseConfig("test.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func oneResource(alg Algorithm, capa float64, extra string) string {
	return fmt.Sprintf("resources:\n  - id: r\n    capacity: %v\n    algorithm: %s\n    lease_length: 60s\n    refresh_interval: 5s\n%s  - id: \"*\"\n    capacity: 0\n", capa, alg, extra)
}

func newTable(t testing.TB, src string, opts Options) (*Table, *clock.Manual) {
	clk := clock.NewManual(t0)
	opts.Clock = clk
	return New(mustConfig(t, src), opts), clk
}

// get asks for one resource and returns the lease.
func get(t testing.TB, tb *Table, client, res string, prio int64, wants float64, has Lease) Lease {
	t.Helper()
	out, err := tb.Get(client, []Request{{Resource: res, Priority: prio, Wants: wants, Has: has}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return out[0]
}

// units is a lease's capacity in the accounting's units (exact).
func units(f float64) int64 { return int64(math.Round(f * unitsPer)) }

// Doorman's worked example through the Table: clients that refresh (each
// reporting the lease it holds) converge to the algorithm's shares, and
// the sum never exceeds the capacity on the way.
func TestTableDoormanExample(t *testing.T) {
	for _, c := range []struct {
		alg  Algorithm
		want []float64
	}{
		{FairShare, []float64{60, 50, 10}},
		{ProportionalShare, []float64{69.69, 40.31, 10}},
	} {
		tb, clk := newTable(t, oneResource(c.alg, 120, ""), Options{})
		wants := []float64{1000, 50, 10}
		has := make([]Lease, 3)
		for round := 0; round < 4; round++ {
			for i := range wants {
				has[i] = get(t, tb, fmt.Sprint("c", i), "r", 0, wants[i], has[i])
				if o := tb.Outstanding("r"); o > 120 {
					t.Fatalf("%s round %d: outstanding %v > 120", c.alg, round, o)
				}
			}
			clk.Advance(5 * time.Second)
		}
		for i := range wants {
			if !near(has[i].Capacity, c.want[i]) {
				t.Fatalf("%s: leases %v %v %v, want %v", c.alg, has[0].Capacity, has[1].Capacity, has[2].Capacity, c.want)
			}
		}
		if has[0].Refresh != 5*time.Second || !has[0].Expiry.Equal(clk.Now().Add(-5*time.Second).Add(time.Minute)) {
			t.Fatalf("lease %+v: want refresh 5s, expiry a minute after the grant", has[0])
		}
	}
}

// A lost response leaves the client on its old lease: the table keeps
// counting that lease until the client shows it holds the newer one, or
// until it expires, so no one else is granted the difference meanwhile.
func TestTableLostResponseCounted(t *testing.T) {
	tb, clk := newTable(t, oneResource(FairShare, 100, ""), Options{})
	a := get(t, tb, "a", "r", 0, 100, Lease{}) // a holds 100
	if a.Capacity != 100 {
		t.Fatalf("a got %v", a.Capacity)
	}
	clk.Advance(5 * time.Second)
	// b arrives; a's share drops to 50 but a's answer is lost: a still
	// holds 100 and says so at its next refresh.
	get(t, tb, "b", "r", 0, 100, Lease{})
	lost := get(t, tb, "a", "r", 0, 100, a)
	if lost.Capacity != 50 {
		t.Fatalf("a's new share %v, want 50", lost.Capacity)
	}
	clk.Advance(5 * time.Second)
	b := get(t, tb, "b", "r", 0, 100, Lease{})
	if b.Capacity != 0 {
		t.Fatalf("b got %v while a may still hold 100 (its answer was lost)", b.Capacity)
	}
	if o := tb.Outstanding("r"); o != 100 {
		t.Fatalf("outstanding %v, want 100", o)
	}
	// a refreshes, still reporting its old lease (the answer was lost): it
	// is still counted at 100.
	a2 := get(t, tb, "a", "r", 0, 100, a)
	b = get(t, tb, "b", "r", 0, 100, b)
	if b.Capacity != 0 {
		t.Fatalf("b got %v while a still reports its old lease of 100", b.Capacity)
	}
	// a refreshes reporting the lease it now holds: the old one is gone.
	clk.Advance(5 * time.Second)
	get(t, tb, "a", "r", 0, 100, a2)
	b = get(t, tb, "b", "r", 0, 100, b)
	if b.Capacity != 50 {
		t.Fatalf("b got %v once a confirmed its 50, want 50", b.Capacity)
	}
	// Expiry frees a lease too: a crashes; after its lease ends b gets all.
	clk.Advance(61 * time.Second)
	if b = get(t, tb, "b", "r", 0, 100, b); b.Capacity != 100 {
		t.Fatalf("b got %v after a's leases expired, want 100", b.Capacity)
	}
}

// A shrinking client keeps its old lease until it refreshes: the room it
// frees goes to the growing client only then (the 2-refresh convergence).
func TestTableShrinkThenGrow(t *testing.T) {
	tb, clk := newTable(t, oneResource(FairShare, 100, ""), Options{})
	a := get(t, tb, "a", "r", 0, 80, Lease{})
	b := get(t, tb, "b", "r", 0, 20, Lease{})
	if a.Capacity != 80 || b.Capacity != 20 {
		t.Fatalf("got %v %v", a.Capacity, b.Capacity)
	}
	clk.Advance(5 * time.Second)
	a = get(t, tb, "a", "r", 0, 10, a)  // a shrinks: gets 10, may still hold 80
	b = get(t, tb, "b", "r", 0, 200, b) // b grows: only what a's old lease leaves
	if a.Capacity != 10 || b.Capacity != 20 {
		t.Fatalf("interval 1: a %v b %v, want 10 20", a.Capacity, b.Capacity)
	}
	clk.Advance(5 * time.Second)
	a = get(t, tb, "a", "r", 0, 10, a) // a confirms 10
	b = get(t, tb, "b", "r", 0, 200, b)
	if a.Capacity != 10 || b.Capacity != 90 {
		t.Fatalf("interval 2: a %v b %v, want 10 90", a.Capacity, b.Capacity)
	}
}

// Priority bands through the Table: the higher band is served first.
func TestTablePriority(t *testing.T) {
	tb, clk := newTable(t, oneResource(FairShare, 100, ""), Options{})
	var lo, hi Lease
	for i := 0; i < 3; i++ {
		lo = get(t, tb, "lo", "r", 1, 100, lo)
		hi = get(t, tb, "hi", "r", 9, 70, hi)
		clk.Advance(5 * time.Second)
	}
	if hi.Capacity != 70 || lo.Capacity != 30 {
		t.Fatalf("hi %v lo %v, want 70 30", hi.Capacity, lo.Capacity)
	}
}

// Static caps each client; none grants wants; both within the capacity.
func TestTableStaticAndNone(t *testing.T) {
	tb, _ := newTable(t, oneResource(Static, 100, "    static_capacity: 30\n"), Options{})
	if l := get(t, tb, "a", "r", 0, 50, Lease{}); l.Capacity != 30 {
		t.Fatalf("static: %v, want 30", l.Capacity)
	}
	if l := get(t, tb, "b", "r", 0, 10, Lease{}); l.Capacity != 10 {
		t.Fatalf("static: %v, want 10", l.Capacity)
	}
	tb, _ = newTable(t, oneResource(None, 100, ""), Options{})
	if l := get(t, tb, "a", "r", 0, 70, Lease{}); l.Capacity != 70 {
		t.Fatalf("none: %v, want 70", l.Capacity)
	}
	if l := get(t, tb, "b", "r", 0, 70, Lease{}); l.Capacity != 30 {
		t.Fatalf("none: second client %v, want the 30 left", l.Capacity)
	}
}

// Release frees the capacity at once.
func TestTableRelease(t *testing.T) {
	tb, _ := newTable(t, oneResource(None, 100, ""), Options{})
	get(t, tb, "a", "r", 0, 100, Lease{})
	if l := get(t, tb, "b", "r", 0, 100, Lease{}); l.Capacity != 0 {
		t.Fatalf("b got %v", l.Capacity)
	}
	tb.Release("a", []string{"r", "unknown"})
	if l := get(t, tb, "b", "r", 0, 100, Lease{}); l.Capacity != 100 {
		t.Fatalf("b got %v after a's release, want 100", l.Capacity)
	}
}

// Learning mode: a client gets back what it reports holding (at most its
// wants, the sum capped at the capacity); a client holding nothing gets 0
// until learning ends.
func TestTableLearning(t *testing.T) {
	tb, clk := newTable(t, oneResource(FairShare, 100, "    learning_mode: 90s\n"), Options{})
	tb.StartLearning()
	exp := clk.Now().Add(30 * time.Second)
	if l := get(t, tb, "a", "r", 0, 100, Lease{Capacity: 60, Expiry: exp}); l.Capacity != 60 {
		t.Fatalf("a got %v, want the 60 it reported", l.Capacity)
	}
	if l := get(t, tb, "b", "r", 0, 10, Lease{Capacity: 30, Expiry: exp}); l.Capacity != 10 {
		t.Fatalf("b got %v, want its wants 10 (< the 30 it holds)", l.Capacity)
	}
	if l := get(t, tb, "new", "r", 0, 100, Lease{}); l.Capacity != 0 {
		t.Fatalf("a newcomer got %v in learning mode", l.Capacity)
	}
	if l := get(t, tb, "old", "r", 0, 100, Lease{Capacity: 50, Expiry: clk.Now().Add(-time.Second)}); l.Capacity != 0 {
		t.Fatalf("a client reporting an expired lease got %v", l.Capacity)
	}
	// A liar reporting more than is left gets only what is left.
	if l := get(t, tb, "liar", "r", 0, 1000, Lease{Capacity: 1000, Expiry: exp}); l.Capacity > 100-60-30 {
		t.Fatalf("a liar got %v: the learned sum exceeds the capacity", l.Capacity)
	}
	if s := tb.Stats(); len(s) != 1 || !s[0].Learning {
		t.Fatalf("stats %+v: want learning", s)
	}
	clk.Advance(91 * time.Second) // all leases of the old master have expired
	if s := tb.Stats(); len(s) == 1 && s[0].Learning {
		t.Fatalf("stats %+v: still learning", s)
	}
	if l := get(t, tb, "new", "r", 0, 100, Lease{}); l.Capacity == 0 {
		t.Fatalf("after learning, a newcomer still gets 0")
	}
}

// SetParent: an intermediate's capacity is its parent's grant, and no
// lease outlives the parent's.
func TestTableSetParent(t *testing.T) {
	tb, clk := newTable(t, oneResource(FairShare, 1000, ""), Options{Intermediate: true})
	if l := get(t, tb, "a", "r", 0, 50, Lease{}); l.Capacity != 0 {
		t.Fatalf("before the parent answered: %v, want 0", l.Capacity)
	}
	pexp := clk.Now().Add(20 * time.Second)
	tb.SetParent("r", Lease{Capacity: 30, Expiry: pexp})
	l := get(t, tb, "b", "r", 0, 50, Lease{})
	if l.Capacity != 15 || !l.Expiry.Equal(pexp) { // a and b share the parent's 30
		t.Fatalf("lease %+v: want 15 until the parent's expiry %v", l, pexp)
	}
	clk.Advance(21 * time.Second) // the parent's lease expired
	if l := get(t, tb, "b", "r", 0, 50, l); l.Capacity != 0 {
		t.Fatalf("after the parent's lease expired: %v", l.Capacity)
	}
	d := tb.Demand()
	if len(d) != 1 || d[0].Resource != "r" || d[0].Has.Capacity != 30 {
		t.Fatalf("demand %+v", d)
	}
}

// Demand aggregates the wants by band, highest first, counting clients
// (an intermediate's bands weigh their clients).
func TestTableDemand(t *testing.T) {
	tb, _ := newTable(t, oneResource(FairShare, 1000, ""), Options{})
	get(t, tb, "a", "r", 5, 10, Lease{})
	get(t, tb, "b", "r", 5, 20, Lease{})
	get(t, tb, "c", "r", 1, 40, Lease{})
	if _, err := tb.GetServer("s", []Demand{{Resource: "r", Bands: []Band{{Priority: 5, Clients: 3, Wants: 30}, {Priority: 7, Clients: 2, Wants: 1}}}}, nil); err != nil {
		t.Fatal(err)
	}
	d := tb.Demand()
	want := []Band{{7, 2, 1}, {5, 5, 60}, {1, 1, 40}}
	if len(d) != 1 || fmt.Sprint(d[0].Bands) != fmt.Sprint(want) {
		t.Fatalf("demand %+v, want bands %v", d, want)
	}
}

// GetServer: a server's band weighs as many clients as it counts, so fair
// share treats its clients like direct ones.
func TestTableGetServerWeights(t *testing.T) {
	tb, clk := newTable(t, oneResource(FairShare, 400, ""), Options{})
	var s, c Lease
	for i := 0; i < 3; i++ {
		out, err := tb.GetServer("region", []Demand{{Resource: "r", Has: s, Bands: []Band{{Priority: 0, Clients: 3, Wants: 900}}}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		s = out[0]
		c = get(t, tb, "direct", "r", 0, 900, c)
		clk.Advance(5 * time.Second)
	}
	if s.Capacity != 300 || c.Capacity != 100 {
		t.Fatalf("server %v direct %v, want 300 100 (4 clients of 100)", s.Capacity, c.Capacity)
	}
}

// MaxClients bounds the table: a new client beyond it gets a clear error
// and changes nothing; clients whose leases expired are forgotten, making
// room again.
func TestTableMaxClients(t *testing.T) {
	tb, clk := newTable(t, oneResource(FairShare, 100, ""), Options{MaxClients: 3})
	for i := 0; i < 3; i++ {
		get(t, tb, fmt.Sprint("c", i), "r", 0, 10, Lease{})
	}
	_, err := tb.Get("c3", []Request{{Resource: "r", Wants: 10}}, nil)
	if !errors.Is(err, ErrTooManyClients) || !strings.Contains(err.Error(), "at most 3") {
		t.Fatalf("got %v", err)
	}
	// A batch with one new client fails whole: the known one is not served either.
	before := tb.Outstanding("r")
	if _, err := tb.Get("c0", []Request{{Resource: "r", Wants: 10}, {Resource: "other", Wants: 5}}, nil); !errors.Is(err, ErrTooManyClients) {
		t.Fatalf("got %v", err)
	}
	if tb.Outstanding("r") != before || len(tb.Stats()) != 1 {
		t.Fatal("a refused batch changed the table")
	}
	clk.Advance(61 * time.Second)
	get(t, tb, "c3", "r", 0, 10, Lease{})
	if n := tb.Stats()[0].Clients; n != 1 {
		t.Fatalf("%d clients after expiry, want 1 (the expired ones forgotten)", n)
	}
}

// Memory stays bounded under a flood of distinct clients and resources.
func TestTableFloodBounded(t *testing.T) {
	tb, clk := newTable(t, oneResource(FairShare, 100, ""), Options{MaxClients: 1000})
	refused := 0
	for i := 0; i < 20000; i++ {
		_, err := tb.Get(fmt.Sprint("c", i), []Request{{Resource: fmt.Sprint("res/", i), Wants: 1}}, nil)
		if err != nil {
			refused++
		}
		if i%1000 == 999 {
			clk.Advance(7 * time.Second)
		}
	}
	if tb.n > 1000 || len(tb.res) > 1000 || len(tb.heap) > 1000 {
		t.Fatalf("entries %d resources %d heap %d: beyond the bound", tb.n, len(tb.res), len(tb.heap))
	}
	if refused == 0 {
		t.Fatal("nothing refused")
	}
}

// Bad requests fail with a clear error and change nothing.
func TestTableBadRequests(t *testing.T) {
	tb, _ := newTable(t, oneResource(FairShare, 100, ""), Options{})
	for _, c := range []struct {
		client string
		req    Request
		want   string
	}{
		{"", Request{Resource: "r", Wants: 1}, "empty client id"},
		{"a", Request{Resource: "", Wants: 1}, "empty resource id"},
		{"a", Request{Resource: strings.Repeat("x", 300), Wants: 1}, "at most 256"},
		{"a", Request{Resource: "r", Wants: -1}, "wants -1"},
		{"a", Request{Resource: "r", Wants: math.NaN()}, "wants NaN"},
		{"a", Request{Resource: "r", Wants: math.Inf(1)}, "wants +Inf"},
		{"a", Request{Resource: "r", Wants: 1, Has: Lease{Capacity: math.NaN()}}, "has capacity NaN"},
	} {
		if _, err := tb.Get(c.client, []Request{{Resource: "r", Wants: 5}, c.req}, nil); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: got %v, want %q", c.req, err, c.want)
		}
	}
	if len(tb.Stats()) != 0 {
		t.Fatal("a refused batch changed the table")
	}
	if _, err := tb.GetServer("s", []Demand{{Resource: "r", Bands: []Band{{Wants: -2}}}}, nil); err == nil {
		t.Fatal("a negative band accepted")
	}
	// A configuration without the "*" default: an unknown resource is an error.
	tb = New(&Config{Resources: []Resource{{ID: "r", Capacity: 1}}}, Options{Clock: clock.NewManual(t0)})
	if _, err := tb.Get("a", []Request{{Resource: "x", Wants: 1}}, nil); err == nil || !strings.Contains(err.Error(), `no resource matches "x"`) {
		t.Fatalf("got %v", err)
	}
}

// Reload: new grants follow the new configuration at once; leases granted
// stand until they expire.
func TestTableReload(t *testing.T) {
	tb, _ := newTable(t, oneResource(None, 100, ""), Options{})
	get(t, tb, "a", "r", 0, 80, Lease{})
	tb.Reload(mustConfig(t, oneResource(None, 50, "")))
	if l := get(t, tb, "b", "r", 0, 80, Lease{}); l.Capacity != 0 {
		t.Fatalf("b got %v: a holds 80 of the new 50", l.Capacity)
	}
	if s := tb.Stats(); s[0].Capacity != 50 {
		t.Fatalf("capacity %v after reload, want 50", s[0].Capacity)
	}
	tb.Reload(mustConfig(t, oneResource(None, 200, "")))
	if l := get(t, tb, "b", "r", 0, 80, Lease{}); l.Capacity != 80 {
		t.Fatalf("b got %v after growing to 200, want 80", l.Capacity)
	}
}

// Concurrent Get, GetServer, Release, Reload, SetParent, Stats and Demand
// (run with -race): the invariant holds throughout.
func TestTableConcurrent(t *testing.T) {
	tb, clk := newTable(t, oneResource(FairShare, 100, ""), Options{MaxClients: 500})
	cfgs := []*Config{mustConfig(t, oneResource(FairShare, 100, "")), mustConfig(t, oneResource(ProportionalShare, 100, ""))}
	var wg sync.WaitGroup
	var bad sync.Once
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			var out []Lease
			has := map[string]Lease{}
			for i := 0; i < 2000; i++ {
				c := fmt.Sprintf("g%d-c%d", g, i%20)
				var err error
				switch i % 10 {
				case 7:
					tb.Release(c, []string{"r"})
					delete(has, c)
				case 8:
					if g == 0 {
						tb.Reload(cfgs[i%2])
					} else {
						tb.Stats()
						tb.Demand()
					}
				case 9:
					out, err = tb.GetServer("s"+c, []Demand{{Resource: "r", Bands: []Band{{Priority: int64(i % 3), Clients: 2, Wants: float64(i % 50)}}}}, out)
				default:
					out, err = tb.Get(c, []Request{{Resource: "r", Priority: int64(i % 3), Wants: float64(i % 40), Has: has[c]}}, out)
					if err == nil {
						has[c] = out[0]
					}
				}
				if err != nil {
					t.Error(err)
					return
				}
				if o := tb.Outstanding("r"); o > 100 {
					bad.Do(func() { t.Errorf("outstanding %v > 100", o) })
				}
				if g == 1 && i%100 == 0 {
					clk.Advance(time.Second)
				}
			}
		}(g)
	}
	wg.Wait()
}

// Fast refresh: a lease in transition (shrinking unconfirmed, short of its
// target, or unsatisfied while demand shifts) carries a quarter of the
// refresh interval; in a steady state every lease carries the configured
// one (no extra load); NoFastRefresh keeps it always.
func TestTableFastRefresh(t *testing.T) {
	for _, steady := range []bool{false, true} {
		tb, clk := newTable(t, oneResource(FairShare, 100, ""), Options{NoFastRefresh: steady})
		fast := 5 * time.Second / FastRefreshDivisor
		if steady {
			fast = 5 * time.Second
		}
		a := get(t, tb, "a", "r", 0, 80, Lease{})
		b := get(t, tb, "b", "r", 0, 20, Lease{})
		clk.Advance(5 * time.Second)
		a = get(t, tb, "a", "r", 0, 10, a)  // shrinks: the table still counts 80
		b = get(t, tb, "b", "r", 0, 200, b) // short of its target 90
		if a.Refresh != fast || b.Refresh != fast {
			t.Fatalf("steady=%v: in transition, refresh %v %v, want %v", steady, a.Refresh, b.Refresh, fast)
		}
		for i := 0; i < 12; i++ {
			clk.Advance(a.Refresh)
			a = get(t, tb, "a", "r", 0, 10, a)
			b = get(t, tb, "b", "r", 0, 200, b)
		}
		if a.Capacity != 10 || b.Capacity != 90 || a.Refresh != 5*time.Second || b.Refresh != 5*time.Second {
			t.Fatalf("steady=%v: steady state a %+v b %+v: want 10 and 90, refresh 5s", steady, a, b)
		}
	}
}

// ReloadFile is whole or nothing: a bad file changes nothing; a good one
// applies at once, the algorithm included.
func TestTableReloadFile(t *testing.T) {
	tb, clk := newTable(t, oneResource(FairShare, 120, ""), Options{})
	dir := t.TempDir()
	path := dir + "/r.yaml"
	os.WriteFile(path, []byte(oneResource(ProportionalShare, 120, "")+"  - id: x\n    capacity: -1\n"), 0o600)
	if err := tb.ReloadFile(path); err == nil || !strings.Contains(err.Error(), "r.yaml:") {
		t.Fatalf("got %v", err)
	}
	has := make([]Lease, 3)
	wants := []float64{1000, 50, 10}
	round := func() {
		for i := range wants {
			has[i] = get(t, tb, fmt.Sprint("c", i), "r", 0, wants[i], has[i])
		}
		clk.Advance(5 * time.Second)
	}
	for i := 0; i < 3; i++ {
		round()
	}
	if has[0].Capacity != 60 {
		t.Fatalf("after a bad file: %v, want fair share's 60", has[0].Capacity)
	}
	os.WriteFile(path, []byte(oneResource(ProportionalShare, 120, "")), 0o600)
	if err := tb.ReloadFile(path); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		round()
	}
	if !near(has[0].Capacity, 69.69) {
		t.Fatalf("after reloading proportional share: %v, want 69.69", has[0].Capacity)
	}
}

// A client that never reports the lease it holds (every answer might have
// been lost) is counted at the largest of its unexpired leases, and only
// until each expires: the capacity it gave up comes back one lease length
// later, not never.
func TestTableNeverConfirmingClient(t *testing.T) {
	tb, clk := newTable(t, oneResource(None, 100, ""), Options{})
	get(t, tb, "mute", "r", 0, 100, Lease{})
	for i := 0; i < 30; i++ { // it shrinks to 10 and keeps refreshing, never reporting
		clk.Advance(2 * time.Second)
		get(t, tb, "mute", "r", 0, 10, Lease{})
		if i < 29 && tb.Outstanding("r") != 100 {
			t.Fatalf("after %d s: outstanding %v while its first lease of 100 may still be held", 2*(i+1), tb.Outstanding("r"))
		}
	}
	clk.Advance(time.Second) // 61 s: the lease of 100 has expired
	if o := tb.Outstanding("r"); o != 10 {
		t.Fatalf("outstanding %v after the lease of 100 expired, want 10", o)
	}
	if l := get(t, tb, "other", "r", 0, 90, Lease{}); l.Capacity != 90 {
		t.Fatalf("another client got %v, want 90", l.Capacity)
	}
}

// addOld keeps what matters for the largest live lease at every later
// instant, bounded, and never less than the truth: checked against the
// brute-force maximum over every lease added.
func TestAddOldMatchesBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	for trial := 0; trial < 500; trial++ {
		e := &entry{}
		var all []grant
		now := int64(0)
		adds := 60
		if trial%2 == 0 {
			adds = maxOlds // no merge can happen: the answer is exact
		}
		for i := 0; i < adds; i++ {
			now += rng.Int64N(3)
			g := grant{units: rng.Int64N(10), exp: now + 1 + rng.Int64N(40)}
			e.addOld(g, now)
			all = append(all, g)
			if len(e.olds) > maxOlds {
				t.Fatalf("%d olds kept", len(e.olds))
			}
			for at := now; at < now+45; at += 3 {
				var want int64
				for _, a := range all {
					if a.live(at) {
						want = max(want, a.units)
					}
				}
				if got := e.mayHold(at); got < want || adds == maxOlds && got != want {
					t.Fatalf("trial %d: at %d may hold %d; the largest live lease is %d", trial, at, got, want)
				}
			}
		}
	}
}

// A late response: the client gets an answer only after its next request
// went out (reporting the older lease), and then its next answer is lost,
// so it uses the late one. The table must count the late lease (it does
// not know the client never got it) until the client shows otherwise.
func TestTableLateResponseCounted(t *testing.T) {
	tb, clk := newTable(t, oneResource(None, 100, ""), Options{})
	a := get(t, tb, "a", "r", 0, 10, Lease{}) // A = 10
	clk.Advance(time.Second)
	late := get(t, tb, "a", "r", 0, 100, a) // B = 100, on its way
	if late.Capacity != 100 {
		t.Fatalf("B = %v", late.Capacity)
	}
	clk.Advance(time.Second)
	get(t, tb, "a", "r", 0, 10, a) // sent reporting A; its answer (C = 10) is lost; B arrives
	if l := get(t, tb, "b", "r", 0, 100, Lease{}); l.Capacity != 0 {
		t.Fatalf("b got %v while a may hold its late lease of 100", l.Capacity)
	}
	clk.Advance(time.Second)
	get(t, tb, "a", "r", 0, 10, late) // a reports B: B is still counted until it shows a newer lease
	if l := get(t, tb, "b", "r", 0, 100, Lease{}); l.Capacity != 0 {
		t.Fatalf("b got %v while a still uses its lease of 100", l.Capacity)
	}
}

// Under none, a higher band is served first too: a lower-band client that
// took everything is cut to what the higher band leaves, and the higher
// band gets the room once it has shrunk.
func TestTableNoneBands(t *testing.T) {
	tb, clk := newTable(t, oneResource(None, 100, ""), Options{})
	var lo, hi Lease
	lo = get(t, tb, "lo", "r", 1, 100, lo)
	for i := 0; i < 4; i++ {
		hi = get(t, tb, "hi", "r", 9, 80, hi)
		lo = get(t, tb, "lo", "r", 1, 100, lo)
		clk.Advance(5 * time.Second)
	}
	if hi.Capacity != 80 || lo.Capacity != 20 {
		t.Fatalf("hi %v lo %v, want 80 20", hi.Capacity, lo.Capacity)
	}
}

// TestTableStatsAfterReload: Stats reports the new capacity as soon as
// Reload returns, before the resource's next request.
func TestTableStatsAfterReload(t *testing.T) {
	tb, _ := newTable(t, oneResource(FairShare, 100, ""), Options{})
	get(t, tb, "a", "r", 0, 10, Lease{})
	if st := tb.Stats(); st[0].Capacity != 100 {
		t.Fatalf("capacity %v", st[0].Capacity)
	}
	tb.Reload(mustConfig(t, oneResource(FairShare, 250, "")))
	if st := tb.Stats(); st[0].Capacity != 250 {
		t.Fatalf("capacity %v right after Reload, want 250", st[0].Capacity)
	}
}

// TestTableUnchangedWantsKeepPlan: a refresh with unchanged wants (and
// priority) does not mark the plans dirty, so steady refreshes never
// recompute them (a recomputation sorts every client's wants); a change
// of wants does.
func TestTableUnchangedWantsKeepPlan(t *testing.T) {
	tb, clk := newTable(t, oneResource(FairShare, 1000, ""), Options{})
	const n = 1000
	has := make([]Lease, n)
	for round := range 3 {
		for i := range n {
			has[i] = get(t, tb, fmt.Sprint("c", i), "r", 0, float64(1+i%7), has[i])
		}
		clk.Advance(time.Second)
		if round == 0 {
			tb.replan(tb.res["r"]) // the joins are planned
			continue
		}
		rs := tb.res["r"]
		if rs.dirty || rs.since != 0 {
			t.Fatalf("round %d of unchanged wants: plans dirty %v, %d changes counted", round, rs.dirty, rs.since)
		}
	}
	get(t, tb, "c0", "r", 0, 3, has[0])
	if rs := tb.res["r"]; !rs.dirty || rs.since != 1 {
		t.Fatalf("a change of wants: dirty %v, %d changes", rs.dirty, rs.since)
	}
	// The others' unchanged refreshes still bring the replan of that
	// change (within 1/32 of the clients' requests).
	for i := 1; i <= n/16; i++ {
		has[i] = get(t, tb, fmt.Sprint("c", i), "r", 0, float64(1+i%7), has[i])
	}
	if rs := tb.res["r"]; rs.dirty {
		t.Fatalf("a change of wants not replanned after %d refreshes of others", n/16)
	}
	// GetServer too: unchanged bands keep the plans.
	d := []Demand{{Resource: "r", Bands: []Band{{Priority: 0, Clients: 3, Wants: 5}}}}
	tb.GetServer("s", d, nil)
	tb.res["r"].dirty, tb.res["r"].since = false, 0
	tb.GetServer("s", d, nil)
	if rs := tb.res["r"]; rs.dirty {
		t.Fatal("unchanged server bands dirtied the plans")
	}
}

package refmodel

import (
	"context"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/memstore"
	"github.com/floodgate/floodgate/storekit"
)

var (
	flagTraces  = flag.Int("refmodel.traces", 0, "random traces per property test (0: the CI default)")
	flagSeed    = flag.Uint64("refmodel.seed", 0, "first seed (traces use seed, seed+1, ...)")
	flagSteps   = flag.Int("refmodel.steps", 0, "steps per trace (0: the CI default)")
	flagVerbose = flag.Bool("refmodel.verbose", false, "log every step's decision and state words")
)

// infinite is the MaxDelay of a Reserve whose context has no deadline.
var infinite = time.Duration(math.MaxInt64)

type opKind int

const (
	opAllow opKind = iota
	opPeek
	opCharge
	opRefund
	opReset
	opReserve // Limiter.Reserve: no deadline
	opReserveWithin
	opCancel // cancel the key's last reservation
	opBatch  // AllowBatch over several keys
)

var opNames = [...]string{"allow", "peek", "charge", "refund", "reset", "reserve", "reserve-within", "cancel", "batch"}

type item struct {
	key  int
	cost int64
}

type step struct {
	now      int64
	key      int
	op       opKind
	cost     int64
	maxDelay time.Duration // opReserveWithin
	spare    uint64
	batch    []item
}

func (s step) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "t=%d key=%d %s cost=%d", s.now, s.key, opNames[s.op], s.cost)
	if s.op == opReserveWithin {
		fmt.Fprintf(&b, " within=%dus", s.maxDelay.Microseconds())
	}
	if s.spare != 0 {
		fmt.Fprintf(&b, " spare=%b", s.spare)
	}
	for _, it := range s.batch {
		fmt.Fprintf(&b, " [key=%d cost=%d]", it.key, it.cost)
	}
	return b.String()
}

// harness runs one trace through the model, storekit.Apply on state slices,
// and (unless the clock goes back) a memstore behind a Limiter, in lockstep.
type harness struct {
	t      *testing.T
	seed   uint64
	specs  []Spec
	pol    *floodgate.Policy
	models []*Key
	states [][]int64
	trace  []string

	lim   *floodgate.Limiter
	store *memstore.Store
	clk   *clock.Manual
	spare uint64                   // the elastic signals the Limiter's rules read
	res   []*floodgate.Reservation // last reservation per key
	resN  []int64
	ctx   context.Context
}

func newHarness(t *testing.T, seed uint64, specs []Spec, keys int, withStore bool) *harness {
	h := &harness{t: t, seed: seed, specs: specs, ctx: context.Background()}
	rules := make([]floodgate.Rule, len(specs))
	for i, s := range specs {
		bit := uint64(1) << i
		rules[i] = toRule(i, s, func() bool { return h.spare&bit != 0 })
	}
	pol, err := floodgate.NewPolicy("", rules...)
	if err != nil {
		t.Fatalf("seed %d: policy %v: %v", seed, specs, err)
	}
	h.pol = pol
	for range keys {
		h.models = append(h.models, NewKey(specs))
		h.states = append(h.states, make([]int64, storekit.Width(pol)))
	}
	if withStore {
		h.clk = clock.NewManual(time.Unix(0, 0))
		h.store = memstore.MustNew(memstore.Options{Shards: 1, SweepInterval: -1, Clock: h.clk})
		t.Cleanup(func() { h.store.Close() })
		h.lim = floodgate.NewLimiter(pol, h.store, floodgate.WithClock(h.clk))
		h.res = make([]*floodgate.Reservation, keys)
		h.resN = make([]int64, keys)
	}
	return h
}

func keyName(k int) string { return fmt.Sprintf("key-%d", k) }

func (h *harness) fail(format string, args ...any) {
	h.t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d (rerun: go test ./internal/refmodel -run '%s$' -refmodel.seed=%d -refmodel.traces=1)\n", h.seed, h.t.Name(), h.seed)
	for i, s := range h.specs {
		fmt.Fprintf(&b, "  rule r%d: %v\n", i, s)
	}
	fmt.Fprintf(&b, "  trace up to the failing step:\n")
	for i := range h.trace {
		fmt.Fprintf(&b, "  %4d %s\n", i, h.trace[i])
	}
	fmt.Fprintf(&b, format, args...)
	h.t.Fatal(b.String())
}

func (h *harness) check(where string, want Decision, got floodgate.Decision) {
	h.t.Helper()
	if w := toDecision(want); w != got {
		h.fail("%s:\n  model: %+v\n  got:   %+v", where, w, got)
	}
}

var modelOps = map[opKind]Op{opAllow: Allow, opPeek: Peek, opCharge: Charge, opRefund: Refund, opReset: Reset, opReserve: Reserve, opReserveWithin: Reserve}
var engineOps = map[Op]floodgate.OpKind{Allow: floodgate.OpAllow, Peek: floodgate.OpPeek, Charge: floodgate.OpCharge, Refund: floodgate.OpRefund, Reset: floodgate.OpReset, Reserve: floodgate.OpReserve}

// apply performs one operation on the model and on the state slice and
// compares the decisions.
func (h *harness) apply(now int64, key int, op Op, cost int64, maxDelay time.Duration, spare uint64) Decision {
	h.t.Helper()
	want := h.models[key].Do(now, op, cost, maxDelay.Microseconds(), spare)
	got := storekit.Apply(h.pol, h.states[key], now, floodgate.Op{Kind: engineOps[op], Cost: cost, MaxDelay: maxDelay, Spare: spare})
	if *flagVerbose {
		h.t.Logf("    %v key=%d t=%d cost=%d: %v state=%v", op, key, now, cost, want, h.states[key])
	}
	h.check("storekit.Apply", want, got)
	if !storekit.Valid(h.pol, h.states[key]) {
		// a snapshot holding it could not be restored (memstore refuses
		// a state storekit.Valid rejects as a damaged file)
		h.fail("state %v after %v is not storekit.Valid", h.states[key], op)
	}
	return want
}

// run performs a step and returns the model's decision, if the step makes
// one.
func (h *harness) run(s step) (Decision, bool) {
	h.t.Helper()
	h.trace = append(h.trace, s.String())
	if h.lim != nil {
		h.clk.SetMicro(s.now)
		h.spare = s.spare
	}
	k, name := s.key, keyName(s.key)
	switch s.op {
	case opCancel:
		if h.lim == nil {
			return Decision{}, false
		}
		r := h.res[k]
		if r == nil || !r.OK() {
			return Decision{}, false
		}
		if h.resN[k] > 0 {
			h.apply(s.now, k, Refund, h.resN[k], 0, s.spare)
		}
		if err := r.Cancel(h.ctx); err != nil {
			h.fail("Cancel: %v", err)
		}
		return Decision{}, false
	case opBatch:
		want := make([]Decision, len(s.batch))
		for i, it := range s.batch {
			op := Allow
			if it.cost == 0 {
				op = Peek
			}
			want[i] = h.apply(s.now, it.key, op, it.cost, 0, s.spare)
		}
		if h.lim == nil {
			return want[len(want)-1], true
		}
		items := make([]floodgate.Item, len(s.batch))
		for i, it := range s.batch {
			items[i] = floodgate.Item{Limiter: h.lim, Key: keyName(it.key), Cost: it.cost}
		}
		out := make([]floodgate.Decision, len(items))
		if err := floodgate.AllowBatch(h.ctx, items, out); err != nil {
			h.fail("AllowBatch: %v", err)
		}
		for i := range out {
			h.check(fmt.Sprintf("AllowBatch item %d", i), want[i], out[i])
		}
		return want[len(want)-1], true
	}

	op, maxDelay := modelOps[s.op], time.Duration(0)
	switch s.op {
	case opReserve:
		maxDelay = infinite
	case opReserveWithin:
		maxDelay = s.maxDelay
	}
	if op == Allow && s.cost == 0 && h.lim != nil {
		op = Peek // AllowN(0) peeks
	}
	want := h.apply(s.now, k, op, s.cost, maxDelay, s.spare)
	if h.lim == nil {
		return want, true
	}
	var (
		got floodgate.Decision
		err error
	)
	switch s.op {
	case opAllow:
		if s.cost == 1 {
			got, err = h.lim.Allow(h.ctx, name)
		} else {
			got, err = h.lim.AllowN(h.ctx, name, s.cost)
		}
	case opPeek:
		got, err = h.lim.PeekN(h.ctx, name, s.cost)
	case opCharge:
		got, err = h.lim.Charge(h.ctx, name, s.cost)
	case opRefund:
		got, err = h.lim.Refund(h.ctx, name, s.cost)
	case opReset:
		if err := h.lim.Reset(h.ctx, name); err != nil {
			h.fail("Reset: %v", err)
		}
		return want, true
	case opReserve:
		var r *floodgate.Reservation
		r, err = h.lim.Reserve(h.ctx, name, s.cost)
		if err == nil {
			got, h.res[k], h.resN[k] = r.Decision, r, s.cost
		}
	case opReserveWithin:
		// A deadline would be read off the wall clock: go to the store.
		got, err = h.store.Do(h.ctx, s.now, floodgate.Op{Policy: h.pol, Key: name, Kind: floodgate.OpReserve,
			Cost: s.cost, MaxDelay: s.maxDelay, Spare: h.elasticSpare(s.spare)})
	}
	if err != nil {
		h.fail("limiter: %v", err)
	}
	h.check("memstore via Limiter", want, got)
	return want, true
}

// elasticSpare keeps the signals of the elastic rules only, as a Limiter
// does.
func (h *harness) elasticSpare(spare uint64) uint64 {
	var m uint64
	for i, s := range h.specs {
		if s.Elastic() {
			m |= spare & (1 << i)
		}
	}
	return m
}

// traceGen draws the steps of a trace.
type traceGen struct {
	r     *rand.Rand
	specs []Spec
	unit  int64
	now   int64
	keys  int
	back  bool // the clock may go back
	spare uint64
	minB  int64
	maxC  int64
	hints []int64 // instants worth visiting exactly: reported retry and reset times
}

func newTraceGen(r *rand.Rand, specs []Spec, unit, start int64, keys int, back bool) *traceGen {
	g := &traceGen{r: r, specs: specs, unit: unit, now: start, keys: keys, back: back, minB: math.MaxInt64}
	for _, s := range specs {
		g.minB = min(g.minB, s.B())
		g.maxC = max(g.maxC, s.MaxCeiling())
	}
	return g
}

// period returns a random rule's period (a day for calendar windows).
func (g *traceGen) period() int64 {
	s := g.specs[g.r.IntN(len(g.specs))]
	if s.Cal != CalNone {
		return []int64{24, 7 * 24, 31 * 24}[s.Cal-1] * hour
	}
	return s.Period
}

func (g *traceGen) advance() {
	r := g.r
	switch x := r.IntN(100); {
	case x < 15: // same instant
	case x < 40:
		g.now += 1 + r.Int64N(g.unit)
	case x < 65:
		g.now += 1 + r.Int64N(g.period())
	case x < 75:
		g.now += r.Int64N(3 * g.period())
	case x < 78:
		g.now += g.period() * (2 + r.Int64N(5))
	case x < 80 && g.back:
		g.now -= 1 + r.Int64N(2*g.period())
	default:
		if len(g.hints) > 0 {
			h := g.hints[r.IntN(len(g.hints))]
			h += []int64{-1, 0, 0, 0, 1}[r.IntN(5)]
			if h >= g.now || g.back {
				g.now = h
			}
		}
	}
	g.hints = g.hints[:0]
}

func (g *traceGen) cost() int64 {
	r := g.r
	switch x := r.IntN(100); {
	case x < 8:
		return 0
	case x < 50:
		return 1
	case x < 75:
		return 1 + r.Int64N(g.minB)
	case x < 92:
		return 1 + r.Int64N(g.maxC)
	default:
		return g.maxC + 1 + r.Int64N(3)
	}
}

func (g *traceGen) next(store bool) step {
	r := g.r
	g.advance()
	if r.IntN(5) == 0 {
		g.spare ^= 1 << r.IntN(len(g.specs))
	}
	s := step{now: g.now, key: r.IntN(g.keys), spare: g.spare, cost: g.cost()}
	switch x := r.IntN(100); {
	case x < 40:
		s.op = opAllow
	case x < 50:
		s.op = opPeek
	case x < 57:
		s.op = opCharge
	case x < 65:
		s.op = opRefund
	case x < 68:
		s.op = opReset
	case x < 76:
		s.op = opReserveWithin
		s.maxDelay = time.Duration([]int64{0, 1, r.Int64N(g.period() + 1), r.Int64N(5*g.period() + 1)}[r.IntN(4)]) * time.Microsecond
	case x < 84:
		s.op = opReserve
	case x < 90 && store:
		s.op = opCancel
	case x < 95:
		s.op = opBatch
		for range 1 + r.IntN(4) {
			s.batch = append(s.batch, item{key: r.IntN(g.keys), cost: g.cost()})
		}
	default:
		s.op = opAllow
	}
	return s
}

// hint records a decision's retry and reset instants for later steps to
// visit.
func (g *traceGen) hint(now int64, d Decision) {
	g.hints = append(g.hints, now+d.RetryAfter, now+d.ResetAfter, now+d.Delay)
}

func traces(def int) (uint64, int) {
	n := def
	if *flagTraces > 0 {
		n = *flagTraces
	}
	return *flagSeed, n
}

func runTraces(t *testing.T, name string, def, steps int, back bool) {
	first, n := traces(def)
	if *flagSteps > 0 {
		steps = *flagSteps
	}
	var cov coverage
	if n == def && first == 0 { // the default run must exercise everything
		t.Cleanup(func() { cov.check(t) })
	}
	for i := range n {
		seed := first + uint64(i)
		t.Run(fmt.Sprintf("%s/seed=%d", name, seed), func(t *testing.T) {
			t.Parallel()
			r := rand.New(rand.NewPCG(seed, 0x5eed))
			specs, unit, start := genPolicy(r)
			keys := 1 + r.IntN(3)
			if r.IntN(6) == 0 {
				keys = 9 // enough to make the store's shard grow and sweep
			}
			h := newHarness(t, seed, specs, keys, !back)
			g := newTraceGen(r, specs, unit, start, keys, back)
			for range steps {
				s := g.next(!back)
				if d, ok := h.run(s); ok {
					g.hint(s.now, d)
					if s.op != opBatch {
						cov.record(specs, modelOps[s.op], d)
					}
				}
			}
		})
	}
}

// TestModelMatchesEngine runs random traces, the clock moving forward (or
// standing still), through the model, storekit.Apply and a memstore behind a
// Limiter, and requires identical decisions.
func TestModelMatchesEngine(t *testing.T) {
	runTraces(t, "forward", 300, 120, false)
}

// TestModelMatchesEngineClockBack lets the clock go back now and then; each
// rule clamps time to what its state has seen. Only storekit.Apply is
// compared: a store may forget a fresh key, and with it what time it saw.
func TestModelMatchesEngineClockBack(t *testing.T) {
	runTraces(t, "back", 120, 120, true)
}

package lease

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/clock"
)

// ErrTooManyClients is Get's error when a new client (a new client and
// resource pair) would take the Table beyond Options.MaxClients.
var ErrTooManyClients = errors.New("lease: too many clients")

// unitsPer is the accounting's fixed point: capacity is counted in
// millionths, in int64, so that sums are exact and a grant, rounded down,
// can never push the sum past the capacity by a rounding error.
const unitsPer = 1e6

// MaxCapacity is the largest capacity (and wants) a Table accounts for.
const MaxCapacity = 1e12

// MaxResourceLen is the longest resource id a request may name.
const MaxResourceLen = 256

func toUnits(f float64) int64 {
	switch {
	case !(f > 0):
		return 0
	case f >= MaxCapacity:
		return MaxCapacity * unitsPer
	}
	return int64(math.Floor(f * unitsPer))
}

func fromUnits(u int64) float64 { return float64(u) / unitsPer }

// resState is one resource's state.
type resState struct {
	id        string
	conf      Resource
	gen       int
	clients   map[string]*entry
	list      []*entry // the same entries, for iteration in memory order
	held      int64    // sum of the entries' counted
	weight    int64    // sum of the entries' weights
	parent    grant    // the parent's lease (SetParent)
	hasParent bool
	learnTo   int64 // learning mode until then
	plans     []bandPlan
	parts     []part // scratch for plan
	dirty     bool
	since     int     // requests since the plans went dirty (a change of wants, a join, a leave)
	churn     float64 // the sum of the wants' changes since then
	fluxTo    int64   // demand is shifting until then (fast refresh for the unsatisfied)
}

// A Table is a capacity server's grant table: per resource, its clients,
// their wants and priorities, and the leases granted to them. It is safe
// for concurrent use (one mutex: every call is short).
type Table struct {
	mu           sync.Mutex
	clock        floodgate.Clock
	max          int
	intermediate bool
	steady       bool
	cfg          *Config
	gen          int
	res          map[string]*resState
	n            int // entries
	heap         expHeap
	learnAt      int64
	learnEnd     int64 // StartLearningUntil's end, 0 for StartLearning's
	learning     bool
	maxLease     int64                 // the longest lease length configured, in microseconds
	wmark        int64                 // the persisted watermark: no lease granted ends after it
	wsave        func(time.Time) error // SetWatermark's, nil: no watermark
}

// New returns a Table serving the resources of cfg (a Config from
// ParseConfig or LoadConfig).
func New(cfg *Config, opts Options) *Table {
	t := &Table{clock: opts.Clock, max: opts.MaxClients, intermediate: opts.Intermediate, steady: opts.NoFastRefresh,
		cfg: normalize(cfg), res: map[string]*resState{}}
	if t.clock == nil {
		t.clock = clock.Coarse
	}
	if t.max <= 0 {
		t.max = DefaultMaxClients
	}
	t.maxLease = longestLease(t.cfg)
	return t
}

// longestLease is the longest lease length of a normalized cfg, in
// microseconds.
func longestLease(c *Config) int64 {
	m := DefaultLeaseLength.Microseconds()
	for _, r := range c.Resources {
		m = max(m, r.LeaseLength.Microseconds())
	}
	return m
}

// normalize returns a copy of cfg with the defaults filled in.
func normalize(cfg *Config) *Config {
	c := &Config{}
	if cfg != nil {
		c.Resources = append([]Resource(nil), cfg.Resources...)
	}
	for i := range c.Resources {
		r := &c.Resources[i]
		if r.Algorithm == "" {
			r.Algorithm = FairShare
		}
		if r.LeaseLength <= 0 {
			r.LeaseLength = DefaultLeaseLength
		}
		if r.RefreshInterval <= 0 {
			r.RefreshInterval = min(DefaultRefreshInterval, r.LeaseLength/2)
		}
		if r.LearningMode <= 0 {
			r.LearningMode = r.LeaseLength
		}
	}
	return c
}

// Get grants client one lease per request, appended to out[:0] in the
// requests' order. A client's target comes from the resource's algorithm
// over all its clients' current wants (the highest priority band served
// first); its grant is min(target, Capacity − what every other client may
// still hold now), so the capacity in unexpired leases never exceeds the
// resource's capacity. Bad requests, an unknown resource or too many
// clients fail the whole call, changing nothing.
//
// A lease's Refresh is the resource's refresh interval, or a quarter of it
// (FastRefreshDivisor, at least 100ms) while the lease is in transition:
// the client shrinks (its older lease is counted until it shows it holds
// the new one); or under fair or proportional share it gets less than its
// target (room is coming), or less than its wants while demand shifts.
// Options.NoFastRefresh turns this off.
func (t *Table) Get(client string, reqs []Request, out []Lease) ([]Lease, error) {
	out = out[:0]
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.clock.NowMicro()
	t.expire(now)
	newN := 0
	for i := range reqs {
		r := &reqs[i]
		if err := t.check(client, r.Resource, r.Has); err != nil {
			return out, err
		}
		if !validAmount(r.Wants) {
			return out, fmt.Errorf("lease: resource %q: wants %v: want a finite number >= 0", r.Resource, r.Wants)
		}
		if t.isNew(client, r.Resource) {
			newN++
		}
	}
	if err := t.room(newN); err != nil {
		return out, err
	}
	for i := range reqs {
		r := &reqs[i]
		e := t.entry(client, r.Resource, now)
		if p := (part{prio: r.Priority, wants: min(r.Wants, MaxCapacity), weight: 1}); len(e.parts) != 1 || !e.parts[0].same(p) {
			e.setParts(append(e.parts[:0], p))
		} else if e.rs.dirty {
			e.rs.since++ // unchanged: not dirtying, but counting towards the replan of others' changes
		}
		out = append(out, t.grant(e, r.Has, now))
	}
	return out, nil
}

// GetServer grants an intermediate server one lease per demand, appended
// to out[:0] in order: the server is one client of each resource whose
// wants are its own clients' (Demand.Bands, as its Table.Demand reports
// them), each band weighing as many clients as it counts, so that fair and
// proportional share treat the server's clients like direct ones. Demand.Has
// is the lease the server holds now. Errors as Get's.
func (t *Table) GetServer(server string, reqs []Demand, out []Lease) ([]Lease, error) {
	out = out[:0]
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.clock.NowMicro()
	t.expire(now)
	newN := 0
	for i := range reqs {
		d := &reqs[i]
		if err := t.check(server, d.Resource, d.Has); err != nil {
			return out, err
		}
		if len(d.Bands) > maxBands {
			return out, fmt.Errorf("lease: resource %q: %d priority bands; at most %d", d.Resource, len(d.Bands), maxBands)
		}
		for _, b := range d.Bands {
			if !validAmount(b.Wants) || b.Clients < 0 {
				return out, fmt.Errorf("lease: resource %q: band %d: wants %v, clients %d: want finite numbers >= 0", d.Resource, b.Priority, b.Wants, b.Clients)
			}
		}
		if t.isNew(server, d.Resource) {
			newN++
		}
	}
	if err := t.room(newN); err != nil {
		return out, err
	}
	for i := range reqs {
		d := &reqs[i]
		e := t.entry(server, d.Resource, now)
		if !sameBands(e.parts, d.Bands) {
			ps := e.parts[:0]
			for _, b := range d.Bands {
				ps = append(ps, part{prio: b.Priority, wants: min(b.Wants, MaxCapacity), weight: float64(max(1, b.Clients))})
			}
			e.setParts(ps)
		} else if e.rs.dirty {
			e.rs.since++
		}
		out = append(out, t.grant(e, d.Has, now))
	}
	return out, nil
}

// sameBands reports whether ps are the parts bands make (unchanged
// demand: the plans stand).
func sameBands(ps []part, bands []Band) bool {
	if len(ps) != len(bands) || len(ps) == 0 {
		return false
	}
	for i, b := range bands {
		if !ps[i].same(part{prio: b.Priority, wants: min(b.Wants, MaxCapacity), weight: float64(max(1, b.Clients))}) {
			return false
		}
	}
	return true
}

// same reports whether p and q are the same demand.
func (p part) same(q part) bool {
	return p.prio == q.prio && p.wants == q.wants && p.weight == q.weight
}

// maxBands bounds the priority bands of one server demand.
const maxBands = 64

func validAmount(f float64) bool { return f >= 0 && !math.IsInf(f, 0) }

// check validates one request's client, resource and lease held.
func (t *Table) check(client, resource string, has Lease) error {
	switch {
	case client == "":
		return errors.New("lease: empty client id")
	case len(client) > MaxResourceLen:
		return fmt.Errorf("lease: client id is %d bytes long; at most %d", len(client), MaxResourceLen)
	case resource == "":
		return errors.New("lease: empty resource id")
	case len(resource) > MaxResourceLen:
		return fmt.Errorf("lease: resource id is %d bytes long; at most %d", len(resource), MaxResourceLen)
	case !validAmount(has.Capacity):
		return fmt.Errorf("lease: resource %q: has capacity %v: want a finite number >= 0", resource, has.Capacity)
	}
	if t.res[resource] == nil && t.cfg.Find(resource) == nil {
		return fmt.Errorf("lease: no resource matches %q (the resources file has no \"*\" default)", resource)
	}
	return nil
}

func (t *Table) isNew(client, resource string) bool {
	rs := t.res[resource]
	return rs == nil || rs.clients[client] == nil
}

// room checks that n new entries fit.
func (t *Table) room(n int) error {
	if t.n+n > t.max {
		return fmt.Errorf("%w: %d tracked, %d new, at most %d (Options.MaxClients)", ErrTooManyClients, t.n, n, t.max)
	}
	return nil
}

// state returns resource's state, created if need be, its configuration
// current.
func (t *Table) state(resource string) *resState {
	rs := t.res[resource]
	if rs == nil {
		rs = &resState{id: resource, clients: map[string]*entry{}, gen: -1}
		if t.learning {
			rs.learnTo = t.learnAt // set below with the configuration
		}
		t.res[resource] = rs
	}
	if rs.gen != t.gen {
		if r := t.cfg.Find(resource); r != nil {
			rs.conf = *r
		}
		rs.gen = t.gen
		rs.dirty = true
		rs.plans = rs.plans[:0] // replanned at the next target: the algorithm may have changed
		if t.learning {
			rs.learnTo = t.learnAt + rs.conf.LearningMode.Microseconds()
			if t.learnEnd != 0 {
				rs.learnTo = t.learnEnd
			}
		}
	}
	return rs
}

// entry returns client's entry of resource, created if need be.
func (t *Table) entry(client, resource string, now int64) *entry {
	rs := t.state(resource)
	e := rs.clients[client]
	if e == nil {
		e = &entry{rs: rs, client: client, hidx: -1, lidx: len(rs.list)}
		e.parts = e.inline[:0]
		rs.clients[client] = e
		rs.list = append(rs.list, e)
		t.n++
	}
	return e
}

// capUnits is the resource's capacity for new grants now.
func (t *Table) capUnits(rs *resState, now int64) int64 {
	if rs.hasParent || t.intermediate {
		if !rs.parent.live(now) {
			return 0
		}
		return rs.parent.units
	}
	return toUnits(rs.conf.Capacity)
}

// grant applies the grant rule to e, which reports holding has.
func (t *Table) grant(e *entry, has Lease, now int64) Lease {
	rs := e.rs
	t.recount(e, now)
	capU := t.capUnits(rs, now)
	room := max(0, capU-(rs.held-e.counted))
	learning := now < rs.learnTo
	var want int64
	h := grant{units: min(toUnits(has.Capacity), capU), exp: has.Expiry.UnixMicro()}
	if has.Expiry.IsZero() {
		h.exp = 0
	}
	if learning {
		if h.live(now) {
			want = min(h.units, toUnits(e.wants))
		}
	} else {
		want = toUnits(t.target(e))
	}
	g := grant{units: min(want, room), exp: now + rs.conf.LeaseLength.Microseconds()}
	if (rs.hasParent || t.intermediate) && rs.parent.exp < g.exp {
		g.exp = rs.parent.exp
	}
	if g.exp <= now {
		g = grant{0, now + rs.conf.LeaseLength.Microseconds()}
	}
	if g.exp > t.wmark && t.wsave != nil && !t.raiseWatermark(now, g.exp) {
		g.units = 0 // not durably covered: a restart could not know of it
	}
	switch {
	case has.Capacity == fromUnits(e.cur.units) && abs(h.exp-e.cur.exp) < 1000:
		e.olds = e.olds[:0] // it holds the newest lease: older ones are superseded
		e.addOld(e.cur, now)
	case learning:
		// Trusted in learning mode only: what it says it holds (from the
		// old master) counts until it holds the new lease.
		h.exp = min(h.exp, now+rs.conf.LeaseLength.Microseconds())
		e.addOld(e.cur, now)
		e.addOld(h, now)
	default:
		e.addOld(e.cur, now) // the newest may have been lost
	}
	refresh := t.refresh(rs, e, want, g.units, learning, now)
	e.cur = g
	t.recount(e, now)
	return Lease{Capacity: fromUnits(g.units), Expiry: time.UnixMicro(g.exp), Refresh: refresh, Safe: t.safe(rs, capU)}
}

// FastRefreshDivisor divides a resource's refresh interval for a lease in
// transition (see Table.Get).
const FastRefreshDivisor = 4

// refresh is the refresh interval of a new lease: the resource's, or a
// quarter of it while the lease is in transition, so that the leases
// converge soon after a demand shift: when the client shrinks (the table
// still counts its older, larger lease until it shows it holds the new
// one); or under fair or proportional share, when it gets less than its
// target (the room is coming as other clients confirm their shrinking), or
// less than its wants while demand is shifting (its target may rise as the
// other clients report their new wants: the wants changed by more than 5%
// of the capacity within the last refresh interval).
func (t *Table) refresh(rs *resState, e *entry, want, got int64, learning bool, now int64) time.Duration {
	r := rs.conf.RefreshInterval
	if t.steady {
		return r
	}
	shrinking := e.counted > got
	sharing := !learning && (rs.conf.Algorithm == FairShare || rs.conf.Algorithm == ProportionalShare)
	short := sharing && want-got > max(want/100, 1)
	wants := toUnits(e.wants)
	shifting := sharing && now < rs.fluxTo && wants-got > max(wants/100, 1)
	if shrinking || short || shifting {
		return max(r/FastRefreshDivisor, min(r, 100*time.Millisecond))
	}
	return r
}

func abs(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}

// safe is the per-client safe-mode capacity of rs.
func (t *Table) safe(rs *resState, capU int64) float64 {
	if rs.conf.SafeCapacity > 0 {
		return rs.conf.SafeCapacity
	}
	return fromUnits(capU) / float64(max(1, rs.weight))
}

// target is e's share under the resource's algorithm, the plans
// recomputed when the wants have changed (amortized: at most once per
// 1/32 of the clients' changes, so that a Get costs O(log n)).
func (t *Table) target(e *entry) float64 {
	rs := e.rs
	alg, static := rs.conf.Algorithm, rs.conf.StaticCapacity
	if alg == None && len(rs.plans) == 1 && t.planned(e) {
		return e.wants // one band: no plan needed
	}
	if rs.dirty && (rs.since > len(rs.clients)/32 || !t.planned(e)) {
		t.replan(rs)
	}
	var sum float64
	for _, p := range e.parts {
		if bp := findBand(rs.plans, p.prio); bp != nil {
			sum += bp.target(alg, static, p)
		}
	}
	return sum
}

// planned reports whether the plans have every band of e.
func (t *Table) planned(e *entry) bool {
	for _, p := range e.parts {
		if findBand(e.rs.plans, p.prio) == nil {
			return false
		}
	}
	return true
}

func (t *Table) replan(rs *resState) {
	ps := rs.parts[:0]
	for _, e := range rs.list {
		if len(e.parts) == 1 {
			ps = append(ps, e.parts[0])
		} else {
			ps = append(ps, e.parts...)
		}
	}
	now := t.clock.NowMicro()
	capa := fromUnits(t.capUnits(rs, now))
	if rs.churn > capa/20 {
		rs.fluxTo = now + rs.conf.RefreshInterval.Microseconds()
	}
	rs.churn = 0
	rs.plans = plan(rs.conf.Algorithm, rs.conf.StaticCapacity, capa, ps, rs.plans)
	rs.parts = ps[:0]
	rs.dirty, rs.since = false, 0
}

// recount brings e's counted (and rs.held) to now and reschedules its
// next expiry; an entry with no live lease left is forgotten.
func (t *Table) recount(e *entry, now int64) {
	u := e.mayHold(now)
	e.rs.held += u - e.counted
	e.counted = u
	e.next = e.nextExpiry(now)
	switch {
	case e.next == 0 && e.hidx >= 0:
		t.heap.remove(e)
	case e.next != 0 && e.hidx < 0:
		t.heap.push(e)
	case e.next != 0:
		t.heap.fix(e)
	}
}

// expire processes every lease expiry up to now, forgetting the clients
// whose leases have all expired.
func (t *Table) expire(now int64) {
	for len(t.heap) > 0 && t.heap[0].next <= now {
		e := t.heap[0]
		t.recount(e, now)
		if e.next == 0 {
			t.drop(e)
		}
	}
}

// drop forgets e.
func (t *Table) drop(e *entry) {
	rs := e.rs
	if e.hidx >= 0 {
		t.heap.remove(e)
	}
	rs.held -= e.counted
	rs.weight -= e.weight
	e.counted = 0
	delete(rs.clients, e.client)
	last := len(rs.list) - 1
	rs.list[e.lidx] = rs.list[last]
	rs.list[e.lidx].lidx = e.lidx
	rs.list[last] = nil
	rs.list = rs.list[:last]
	t.n--
	rs.dirty = true
	rs.since++
	if len(rs.clients) == 0 && !rs.hasParent {
		delete(t.res, rs.id)
	}
}

// Release drops client's leases of resources: the client has stopped
// using them, and their capacity is free for others at once.
func (t *Table) Release(client string, resources []string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, r := range resources {
		if rs := t.res[r]; rs != nil {
			if e := rs.clients[client]; e != nil {
				t.drop(e)
			}
		}
	}
}

// Reload replaces the resources configuration, whole or nothing: leases
// already granted stand until they expire; new grants follow cfg.
func (t *Table) Reload(cfg *Config) {
	c := normalize(cfg)
	t.mu.Lock()
	t.cfg = c
	t.gen++
	t.maxLease = longestLease(c)
	t.mu.Unlock()
}

// ReloadFile parses the resources file at path and, only if it has no
// error, hands it to Reload: a bad file changes nothing.
func (t *Table) ReloadFile(path string) error {
	cfg, err := LoadConfig(path)
	if err != nil {
		return err
	}
	t.Reload(cfg)
	return nil
}

// SetParent makes the Table an intermediate server's for resource: its
// capacity for resource is l.Capacity, and no lease it grants ends after
// l.Expiry.
func (t *Table) SetParent(resource string, l Lease) {
	if resource == "" || len(resource) > MaxResourceLen || !validAmount(l.Capacity) {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	rs := t.state(resource)
	rs.hasParent = true
	if u := toUnits(l.Capacity); u != rs.parent.units {
		rs.plans = rs.plans[:0] // replanned for the new capacity at the next target
	}
	rs.parent = grant{units: toUnits(l.Capacity), exp: l.Expiry.UnixMicro()}
	rs.dirty = true
}

// Package recorder keeps the recent history of a server's decisions for
// the dashboard: per rule, how many were allowed, refused, over the limit
// but admitted (shadow or quota mode), degraded and warned, each second
// of the last Window seconds, and the decision latency of each second.
//
// Recording costs an atomic add on the rule's cumulative counters: the
// hot path neither locks nor allocates once a rule's counters are found
// (Recorder.For, a sync.Map lookup by the caller's key, a limit's
// pointer). Once a second Sample moves what the counters gained into the
// ring, under a lock no decision takes. Memory is bounded: MaxRules rules
// of Window seconds each (some 12 KB a rule); the decisions of rules
// beyond them are counted under the rule OtherRule.
//
// Tracks (Track) are server- and store-level counters, not a rule's,
// sampled with the rules and kept for the same Window seconds.
package recorder

import (
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Outcome is what a decision was, as the dashboard charts it.
type Outcome int

// The outcomes. Degraded and Warned are counted beside the others: a
// degraded decision is also allowed or refused, a warned one allowed.
const (
	Allowed       Outcome = iota // admitted
	Refused                      // refused
	ShadowRefused                // over the limit, admitted: shadow or quota mode
	Degraded                     // made by a failure mode: the store did not answer
	Warned                       // admitted past a soft limit (Decision.Excess)
	NumOutcomes
)

// OutcomeNames name the outcomes in the order of a Point's counts.
var OutcomeNames = [NumOutcomes]string{"allowed", "refused", "shadow_refused", "degraded", "warned"}

const (
	// Window is how many seconds of history are kept.
	Window = 600
	// MaxRules bounds the rules recorded; later ones count under OtherRule.
	MaxRules = 256
	// OtherRule is the rule the decisions of rules beyond MaxRules count under.
	OtherRule = "_other"
	// maxKeys bounds the cached keys of For (a reload brings new limits,
	// each a new key): beyond, the cache starts afresh.
	maxKeys = 1 << 14
)

// Counters are a rule's cumulative decision counts, by outcome.
type Counters struct {
	n       [NumOutcomes]atomic.Uint64
	dropped atomic.Bool // the recorder forgot the rule (idle): find it again
}

// Dropped reports whether the recorder has forgotten these counters' rule
// (idle for a whole window, to make room): a caller that keeps counters
// finds them again with For.
func (c *Counters) Dropped() bool { return c.dropped.Load() }

// Record counts one decision: allowed or not, whether an over-limit one
// was only shadowed (shadow or quota mode), made by a failure mode
// (degraded), or admitted past a soft limit (warned).
func (c *Counters) Record(allowed, shadow, degraded, warned bool) {
	switch {
	case allowed:
		c.n[Allowed].Add(1)
		if warned {
			c.n[Warned].Add(1)
		}
	case shadow:
		c.n[ShadowRefused].Add(1)
	default:
		c.n[Refused].Add(1)
	}
	if degraded {
		c.n[Degraded].Add(1)
	}
}

// ID names a rule: its domain and its name (as GET /v1/rules shows it).
type ID struct{ Domain, Rule string }

type rule struct {
	id   ID
	c    *Counters
	prev [NumOutcomes]uint64
	ring [Window][NumOutcomes]uint32 // by second % Window
	seen int64                       // the last second with a decision
}

// latencyBuckets are powers of two of microseconds: bucket i holds
// latencies below 2^i µs (the last, everything longer).
const latencyBuckets = 24

// A Recorder keeps the decisions of the last Window seconds. Safe for
// concurrent use.
type Recorder struct {
	keys  sync.Map // caller's key → *Counters
	nkeys atomic.Int64

	lat [latencyBuckets]atomic.Uint64 // cumulative, by bucket

	mu      sync.Mutex
	rules   map[ID]*rule
	last    int64 // the last second sampled (0: none yet)
	first   int64 // the first second sampled
	latPrev [latencyBuckets]uint64
	latRing [Window][2]uint32 // p50, p99 in µs, by second % Window
	tracks  []*track          // server- and store-level series (track.go)
}

// New returns an empty recorder.
func New() *Recorder { return &Recorder{rules: map[ID]*rule{}} }

// For returns the counters of the rule named id, looked up by key (a
// limit's pointer: the caller's handle on the rule, cheap to hash), which
// must name one rule only.
func (r *Recorder) For(key any, id ID) *Counters {
	if c, ok := r.keys.Load(key); ok && !c.(*Counters).Dropped() {
		return c.(*Counters)
	}
	c := r.counters(id)
	if r.nkeys.Add(1) > maxKeys {
		r.keys.Clear()
		r.nkeys.Store(1)
	}
	r.keys.Store(key, c)
	return c
}

// counters returns id's counters, making them (or, beyond MaxRules,
// OtherRule's).
func (r *Recorder) counters(id ID) *Counters {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ru := r.rules[id]; ru != nil {
		return ru.c
	}
	// MaxRules-1 rules, and OtherRule for the rest
	if len(r.rules) >= MaxRules-1 {
		r.dropIdle()
	}
	if len(r.rules) >= MaxRules-1 {
		id = ID{Rule: OtherRule}
		if ru := r.rules[id]; ru != nil {
			return ru.c
		}
	}
	ru := &rule{id: id, c: new(Counters)}
	r.rules[id] = ru
	return ru.c
}

// dropIdle forgets the rules without a decision in the window (a reload's
// departed rules); r.mu is held.
func (r *Recorder) dropIdle() {
	for id, ru := range r.rules {
		if ru.seen <= r.last-Window && ru.prev == ru.load() {
			ru.c.dropped.Store(true)
			delete(r.rules, id)
		}
	}
	r.keys.Clear() // a dropped rule's counters may be cached
	r.nkeys.Store(0)
}

func (ru *rule) load() (cur [NumOutcomes]uint64) {
	for i := range cur {
		cur[i] = ru.c.n[i].Load()
	}
	return cur
}

// ObserveLatency counts one decision's latency.
func (r *Recorder) ObserveLatency(d time.Duration) {
	us := uint64(max(d.Microseconds(), 0))
	b := min(bits.Len64(us), latencyBuckets-1)
	r.lat[b].Add(1)
}

// Sample moves what the counters gained since the last sample into second
// now (unix seconds). Seconds skipped since the last sample are recorded
// as empty; a now at or before the last sample's adds to that second.
func (r *Recorder) Sample(now int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.last == 0 {
		r.first = now
	} else if now < r.last {
		now = r.last // a clock stepped back: count into the latest second
	}
	for _, ru := range r.rules {
		cur := ru.load()
		var d [NumOutcomes]uint32
		any := false
		for i := range cur {
			d[i] = uint32(min(cur[i]-ru.prev[i], 1<<32-1))
			any = any || d[i] != 0
		}
		ru.prev = cur
		if now != r.last {
			r.clear(&ru.ring, now)
			ru.ring[now%Window] = d
		} else {
			for i := range d {
				ru.ring[now%Window][i] += d[i]
			}
		}
		if any {
			ru.seen = now
		}
	}
	var lat [latencyBuckets]uint64
	for i := range lat {
		c := r.lat[i].Load()
		lat[i], r.latPrev[i] = c-r.latPrev[i], c
	}
	if now != r.last {
		for s := max(r.last+1, now-Window+1); r.last != 0 && s < now; s++ {
			r.latRing[s%Window] = [2]uint32{}
		}
		r.latRing[now%Window] = [2]uint32{quantile(&lat, 0.5), quantile(&lat, 0.99)}
	}
	r.sampleTracks(now)
	r.last = now
}

// clear empties the seconds of ring after the last sample and before now.
func (r *Recorder) clear(ring *[Window][NumOutcomes]uint32, now int64) {
	if r.last == 0 {
		return
	}
	for s := max(r.last+1, now-Window+1); s < now; s++ {
		ring[s%Window] = [NumOutcomes]uint32{}
	}
}

// quantile is the upper bound, in µs, of the bucket holding quantile q of
// counts (0 when empty).
func quantile(counts *[latencyBuckets]uint64, q float64) uint32 {
	var total uint64
	for _, c := range counts {
		total += c
	}
	if total == 0 {
		return 0
	}
	want := uint64(q*float64(total-1)) + 1
	var acc uint64
	for i, c := range counts {
		acc += c
		if acc >= want {
			return uint32(1) << i
		}
	}
	return uint32(1) << (latencyBuckets - 1)
}

// Series are a rule's decisions, one count per outcome (OutcomeNames) a
// second from Start.
type Series struct {
	Domain string                `json:"domain"`
	Rule   string                `json:"rule"`
	Start  int64                 `json:"start"` // unix seconds of Counts[0]
	Counts [][NumOutcomes]uint32 `json:"counts"`
	Total  [NumOutcomes]uint64   `json:"total"` // every decision since the rule's first
}

// Latency is the decision latency of each second from Start: the upper
// bounds, in microseconds, of the power-of-two buckets holding the median
// and the 99th percentile (0 for a second without decisions).
type Latency struct {
	Start int64    `json:"start"`
	P50   []uint32 `json:"p50_us"`
	P99   []uint32 `json:"p99_us"`
}

// Since returns the seconds after since up to the last sample, at most
// Window of them, for every rule with a decision in them (by domain and
// rule), and the last second sampled (0: none yet).
func (r *Recorder) Since(since int64) (series []Series, lat Latency, last int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.last == 0 {
		return nil, Latency{}, 0
	}
	start := max(since+1, r.last-Window+1, r.first)
	n := int(max(r.last-start+1, 0))
	lat = Latency{Start: start, P50: make([]uint32, n), P99: make([]uint32, n)}
	for i := range n {
		v := r.latRing[(start+int64(i))%Window]
		lat.P50[i], lat.P99[i] = v[0], v[1]
	}
	for _, ru := range r.rules {
		if ru.seen < start {
			continue
		}
		s := Series{Domain: ru.id.Domain, Rule: ru.id.Rule, Start: start, Counts: make([][NumOutcomes]uint32, n)}
		for i := range n {
			s.Counts[i] = ru.ring[(start+int64(i))%Window]
		}
		s.Total = ru.prev
		series = append(series, s)
	}
	slices.SortFunc(series, func(a, b Series) int {
		if a.Domain != b.Domain {
			if a.Domain < b.Domain {
				return -1
			}
			return 1
		}
		if a.Rule < b.Rule {
			return -1
		}
		if a.Rule > b.Rule {
			return 1
		}
		return 0
	})
	return series, lat, r.last
}

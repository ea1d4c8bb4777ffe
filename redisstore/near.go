package redisstore

import (
	"hash/maphash"
	"sync/atomic"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/algo"
	"github.com/floodgate/floodgate/storekit"
)

// The near cache: once Redis refuses a request of cost 1 on a key until T,
// the store refuses the key's requests of cost 1 here until T without
// asking Redis, with the decision Redis would give. A refused request
// consumes nothing, so this admits nothing exact mode would not;
// docs/REDIS.md ("The near cache") has the argument and where it stays off.

// nearSlots is the size of the near cache's table: fixed, never grown.
const nearSlots = 1 << 16

// nearEntry is one refusal Redis made: a request of cost 1 on key under the
// policy of version is refused until until (the near clock), as d says.
// Entries are immutable; a slot's entry is replaced whole.
type nearEntry struct {
	version   uint64
	key       string
	at, until int64 // the near clock, µs: the call's start and at + d.RetryAfter
	d         floodgate.Decision
}

// nearCache is a direct-mapped table of refusals: a key's slot is its
// hash's, and a new refusal takes the slot of whatever was there (losing
// an entry only costs a call to Redis). Lookups and stores are one atomic
// load or store of the slot, so a hot key's readers share no lock.
type nearCache struct {
	seed  maphash.Seed
	slots []atomic.Pointer[nearEntry]
	hits  atomic.Int64
}

func newNearCache() *nearCache {
	return &nearCache{seed: maphash.MakeSeed(), slots: make([]atomic.Pointer[nearEntry], nearSlots)}
}

// slot returns key's slot under the policy of version.
func (c *nearCache) slot(version uint64, key string) *atomic.Pointer[nearEntry] {
	h := maphash.String(c.seed, key) ^ version*0x9e3779b97f4a7c15
	return &c.slots[(h^h>>32)&(nearSlots-1)]
}

// lookup answers op at now (the near clock) when a refusal Redis made still
// covers it, into *d: the decision Redis would make.
func (c *nearCache) lookup(now int64, op *floodgate.Op, d *floodgate.Decision) bool {
	if op.Cost != 1 {
		return false
	}
	v := storekit.Version(op.Policy)
	e := c.slot(v, op.Key).Load()
	if e == nil || e.version != v || now < e.at || now >= e.until || e.key != op.Key {
		return false
	}
	*d = e.d
	d.RetryAfter = time.Duration(e.until-now) * time.Microsecond
	d.ResetAfter = max(d.RetryAfter, e.d.ResetAfter-time.Duration(now-e.at)*time.Microsecond)
	c.hits.Add(1)
	return true
}

// learn records what Redis answered to op, asked at at (the near clock):
// a refusal of cost 1 that waiting ends is kept; an admission, a
// reservation, a charge, a refund or a reset drops the key's entry (the
// key's state moved otherwise than by time).
func (c *nearCache) learn(at int64, op *floodgate.Op, d *floodgate.Decision) {
	switch {
	case op.Kind == floodgate.OpPeek:
		return
	case op.Kind != floodgate.OpAllow || d.Allowed:
		c.forget(op.Policy, op.Key)
		return
	}
	if op.Cost != 1 || d.Degraded || d.Reason != floodgate.ReasonLimited || d.RetryAfter <= 0 || !nearSafe(op.Policy) {
		return
	}
	v := storekit.Version(op.Policy)
	c.slot(v, op.Key).Store(&nearEntry{version: v, key: op.Key, at: at, until: at + d.RetryAfter.Microseconds(), d: *d})
}

// forget drops key's entry under p, if it has one.
func (c *nearCache) forget(p *floodgate.Policy, key string) {
	v := storekit.Version(p)
	s := c.slot(v, key)
	if e := s.Load(); e != nil && e.version == v && e.key == key {
		s.CompareAndSwap(e, nil)
	}
}

// nearSafe reports whether the near cache may answer for p: no rule counts
// its refusals (a sliding log with CountRejected: a refusal answered here
// would not be recorded), none is elastic (its capacity moves with the
// spare signal, so a refusal says nothing of the next request), and none
// is a shaper (it refuses while its queue drains, and what it says
// remains changes meanwhile).
func nearSafe(p *floodgate.Policy) bool {
	for i := range compiledOf(p).Params {
		r := &compiledOf(p).Params[i]
		if r.CountRejected || r.Elastic > 0 || r.Kind == algo.LeakyShaper {
			return false
		}
	}
	return true
}

// nearNow is the clock the near cache keeps time on, in µs: the caller's
// now when it decides (Options.ClientTime); else this process's monotonic
// clock, which runs at the rate of Redis's, whose TIME decides.
func (s *Store) nearNow(now int64) int64 {
	if s.opts.ClientTime || s.near == nil {
		return now
	}
	return time.Since(s.nearBase).Microseconds()
}

// nearFirst returns the near clock at now, and answers op into *d when the
// near cache knows it refused.
func (s *Store) nearFirst(now int64, op *floodgate.Op, d *floodgate.Decision) (at int64, known bool) {
	if s.near == nil {
		return 0, false
	}
	at = s.nearNow(now)
	return at, op.Kind == floodgate.OpAllow && s.near.lookup(at, op, d)
}

// nearLearn records Redis's answer d to op, asked at at (the near clock).
func (s *Store) nearLearn(at int64, op *floodgate.Op, d *floodgate.Decision) {
	if s.near != nil {
		s.near.learn(at, op, d)
	}
}

// nearLen returns how many slots of the near cache hold an entry (live or
// expired): at most its fixed size.
func (s *Store) nearLen() int {
	if s.near == nil {
		return 0
	}
	n := 0
	for i := range s.near.slots {
		if s.near.slots[i].Load() != nil {
			n++
		}
	}
	return n
}

// nearLearnIn is nearLearn for ops[i] of a batch whose all-or-nothing
// group is group (nil: none): a member's refusal is not kept (it may be
// refused for another member's sake).
func (s *Store) nearLearnIn(at int64, ops []floodgate.Op, out []floodgate.Decision, group []bool, i int) {
	if group == nil || !group[i] || ops[i].Kind != floodgate.OpAllow || out[i].Allowed {
		s.nearLearn(at, &ops[i], &out[i])
	}
}

// nearHits returns the near cache's answers so far.
func (s *Store) nearHits() int64 {
	if s.near == nil {
		return 0
	}
	return s.near.hits.Load()
}

package memstore

import (
	"math/bits"
	"sync"
	"sync/atomic"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/storekit"
)

// A table holds the keys of one policy (by name), in shards chosen by the
// top bits of the key's hash. Each shard is an open-addressing table with
// linear probing: slot i is words[i*w : (i+1)*w], word 0 the key's hash (0
// for an empty slot) and the rest the policy's state words.
type table struct {
	store  *Store
	policy atomic.Pointer[floodgate.Policy] // swapped only with every shard locked
	shards []shard
	shift  uint // a key's shard is its hash >> shift
	// restored: the table was made at start from a snapshot, under the
	// snapshot's copy of its policy; the first live version of the policy
	// takes it over whatever its version number (made before the store,
	// say, as serve loads its rules first)
	restored bool
	// dropped: Sweep found the table empty and let it go (s.mu and every
	// shard held); a policy that still has it binds again (Store.rebind).
	// Read under any of its shard locks.
	dropped bool
}

// isDropped reads dropped under a shard lock.
func (t *table) isDropped() bool {
	sh := &t.shards[0]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return t.dropped
}

// lockAll locks every shard, in index order (migrate's order too).
func (t *table) lockAll() {
	for i := range t.shards {
		t.shards[i].mu.Lock()
	}
}

func (t *table) unlockAll() {
	for i := range t.shards {
		t.shards[i].mu.Unlock()
	}
}

type shard struct {
	mu      sync.Mutex
	words   []int64
	w       int // words per slot
	mask    int // slots-1
	n       int // keys held
	rng     uint64
	scratch []int64 // a fresh state for operations on absent keys
	swept   int64   // when evict last swept the whole shard (microseconds)
	_       [16]byte
}

const minSlots = 8

// wideSlotBytes bounds a new shard's table for wide states: a sliding log
// of 10,000 keeps 80 KB a key, and 64 shards of 8 slots each would take
// 41 MB a policy before the memory cap has a say.
const wideSlotBytes = 64 << 10

// initialSlots is how many slots a shard starts with for states of w
// words: minSlots, fewer (down to 2) when they would pass wideSlotBytes.
func initialSlots(w int) int {
	slots := minSlots
	for slots > 2 && slots*w*8 > wideSlotBytes {
		slots /= 2
	}
	return slots
}

// wideTableBytes bounds what a new table's shards take at their first key
// each: a table of wide states (a sliding log) has fewer shards, so that a
// few such policies cannot pass the memory cap with a handful of keys.
const wideTableBytes = 1 << 20

func (s *Store) newTable(p *floodgate.Policy) *table {
	w := 1 + storekit.Width(p)
	n := s.shards
	for n > 1 && n*initialSlots(w)*w*8 > wideTableBytes {
		n /= 2
	}
	t := &table{store: s, shards: make([]shard, n), shift: uint(64 - bits.Len(uint(n-1)))}
	t.policy.Store(p)
	for i := range t.shards {
		sh := &t.shards[i]
		sh.w = 1 + storekit.Width(p)
		sh.rng = s.k0 ^ uint64(i+1)*0x9e3779b97f4a7c15
	}
	return t
}

// find returns the slot holding h, or -1.
func (sh *shard) find(h uint64) int {
	if sh.words == nil {
		return -1
	}
	for i := int(h) & sh.mask; ; i = (i + 1) & sh.mask {
		switch uint64(sh.words[i*sh.w]) {
		case h:
			return i
		case 0:
			return -1
		}
	}
}

func (sh *shard) state(i int) []int64 { return sh.words[i*sh.w+1 : (i+1)*sh.w] }

// do performs op on key hash h, writing the decision to d. The shard is
// locked.
func (sh *shard) do(t *table, h uint64, now int64, op *floodgate.Op, d *floodgate.Decision) {
	p := t.policy.Load()
	i := sh.find(h)
	if i < 0 {
		switch op.Kind {
		case floodgate.OpPeek, floodgate.OpRefund, floodgate.OpReset:
			// Nothing to keep: answer from a fresh state.
			sh.fresh(p, now, op, d)
			return
		}
		if i = sh.tryInsert(t, p, h, now); i < 0 {
			// No room, and every key the shard could drop still
			// constrains. A decision that keeps nothing (a cost too large)
			// needs no room; any other is the rules' failure modes'.
			if sh.fresh(p, now, op, d); storekit.Consumption(p, sh.scratch, now) > 0 {
				t.store.refuse(p, d)
			}
			return
		}
		storekit.ApplyTo(p, sh.state(i), now, op, d)
		// A new key that was denied may hold nothing worth keeping.
		if !d.Allowed && storekit.Consumption(p, sh.state(i), now) == 0 {
			sh.deleteAt(t, i)
		}
		return
	}
	storekit.ApplyTo(p, sh.state(i), now, op, d)
	if op.Kind == floodgate.OpReset {
		sh.deleteAt(t, i)
	}
}

// fresh performs op on a fresh state in the shard's scratch words, which
// hold the resulting state after.
func (sh *shard) fresh(p *floodgate.Policy, now int64, op *floodgate.Op, d *floodgate.Decision) {
	if len(sh.scratch) != storekit.Width(p) {
		sh.scratch = make([]int64, storekit.Width(p))
	}
	clear(sh.scratch)
	storekit.ApplyTo(p, sh.scratch, now, op, d)
}

// insert places a key with a fresh state and returns its slot, whatever
// the caps: at a cap it makes room by dropping a key that no longer
// constrains where it finds one, and passes the cap where it does not.
// Keys the store already held go in this way (a snapshot's, on restore;
// a key moved to another policy, which leaves its old table): refusing
// one would forgive what it had consumed.
func (sh *shard) insert(t *table, p *floodgate.Policy, h uint64, now int64) int {
	sh.makeRoom(t, p, now, true)
	return sh.place(t, h)
}

// tryInsert places a new key as insert does, except that at a cap where
// no key that no longer constrains can be dropped it places nothing and
// returns -1: the caller refuses the key.
func (sh *shard) tryInsert(t *table, p *floodgate.Policy, h uint64, now int64) int {
	if !sh.makeRoom(t, p, now, false) {
		return -1
	}
	return sh.place(t, h)
}

// makeRoom readies the shard for one more key. Below the caps it drops
// fresh keys or grows the table, as a table fills. At the key cap, or at
// the memory cap where the table would have to grow, it drops a key that
// no longer constrains (evict); where there is none it reports false, or
// with force lets the key pass the cap.
func (sh *shard) makeRoom(t *table, p *floodgate.Policy, now int64, force bool) bool {
	s := t.store
	if s.keys.Load() >= int64(s.opts.MaxKeys) && sh.n >= evictSample && !sh.evict(t, p, now) && !force {
		return false
	}
	if sh.words == nil || (sh.n+1)*8 <= (sh.mask+1)*7 {
		return true // room without growing (place makes a first table)
	}
	growth := int64(len(sh.words)) * 8
	if s.bytes.Load()+growth > s.opts.MaxMemory && sh.n > 0 {
		// Growing would pass the memory cap: make room instead, in a
		// shard of few keys too (wide states fill the cap with few keys
		// a shard).
		if sh.evict(t, p, now) {
			return true
		}
		if !force {
			return false
		}
	}
	// Full enough to grow: first drop fresh keys; grow unless that freed
	// a good share.
	if freed := sh.sweep(t, now); sh.words != nil && (freed*4 < sh.n || (sh.n+1)*8 > (sh.mask+1)*7) {
		sh.resize(t, 2*(sh.mask+1))
	}
	return true
}

// place puts hash h in a free slot with a fresh state and returns the
// slot. makeRoom has made room.
func (sh *shard) place(t *table, h uint64) int {
	if sh.words == nil {
		sh.resize(t, initialSlots(sh.w))
	}
	i := int(h) & sh.mask
	for sh.words[i*sh.w] != 0 {
		i = (i + 1) & sh.mask
	}
	slot := sh.words[i*sh.w : (i+1)*sh.w]
	clear(slot)
	slot[0] = int64(h)
	sh.n++
	t.store.keys.Add(1)
	return i
}

// resize rehashes the shard into slots slots.
func (sh *shard) resize(t *table, slots int) {
	old, w := sh.words, sh.w
	sh.words = make([]int64, slots*w)
	sh.mask = slots - 1
	t.store.bytes.Add(int64(len(sh.words)-len(old)) * 8)
	for j := 0; j+w <= len(old); j += w {
		h := uint64(old[j])
		if h == 0 {
			continue
		}
		i := int(h) & sh.mask
		for sh.words[i*w] != 0 {
			i = (i + 1) & sh.mask
		}
		copy(sh.words[i*w:(i+1)*w], old[j:j+w])
	}
}

// deleteAt empties slot i, shifting later members of its probe run back so
// that lookups need no tombstones.
func (sh *shard) deleteAt(t *table, i int) {
	w, mask := sh.w, sh.mask
	for j := i; ; {
		j = (j + 1) & mask
		hj := sh.words[j*w]
		if hj == 0 {
			break
		}
		home := int(hj) & mask
		// Slot j may move back to i unless its home lies cyclically in (i, j].
		if (i <= j && (home <= i || home > j)) || (i > j && home <= i && home > j) {
			copy(sh.words[i*w:(i+1)*w], sh.words[j*w:(j+1)*w])
			i = j
		}
	}
	clear(sh.words[i*w : (i+1)*w])
	sh.n--
	t.store.keys.Add(-1)
}

// sweep drops the keys whose state is fresh at now and returns how many.
func (sh *shard) sweep(t *table, now int64) int {
	p := t.policy.Load()
	freed := 0
	for i := 0; i <= sh.mask && sh.n > 0; {
		if sh.words[i*sh.w] != 0 && storekit.Consumption(p, sh.state(i), now) == 0 {
			sh.deleteAt(t, i) // another key may have moved into i: look again
			freed++
			continue
		}
		i++
	}
	if freed > 0 {
		t.store.expired.Add(int64(freed))
	}
	if sh.n == 0 && sh.mask+1 > minSlots {
		t.store.bytes.Add(-int64(len(sh.words)) * 8)
		sh.words, sh.mask = nil, 0
	}
	return freed
}

const evictSample = 8

// sweepAtCapEvery is how often, at most, evict sweeps a shard in which it
// sampled no key that no longer constrains (microseconds): a flood at the
// cap pays a pass over each shard every 10 s, not at each new key. A pass
// costs about 30 ns a key, so at the default cap of 4M keys a sustained
// flood costs 12 ms of CPU a second, and a shard's lock is held about 2 ms
// (64 shards).
const sweepAtCapEvery = 10_000_000

// evict makes room at a cap by dropping a key that no longer constrains,
// and reports whether it found one. A key constrains while any of its
// rules counts something against it (storekit.Consumption > 0): with u of a
// capacity B counted, a request of cost B-u+1, which a fresh key would
// admit, is refused, so dropping the key could let a request past its
// limit. A key with nothing counted decides as a key never seen: dropping
// it changes no decision. evict looks at up to evictSample keys from a
// random slot on and drops the first that no longer constrains; if none
// is, it sweeps the whole shard, unless it did in the last 10 s. It
// never drops a key that constrains: the caller refuses the new key
// instead (a flood of keys spending a quota whole must not hand a used-up
// key its quota back).
func (sh *shard) evict(t *table, p *floodgate.Policy, now int64) bool {
	sh.rng ^= sh.rng << 13
	sh.rng ^= sh.rng >> 7
	sh.rng ^= sh.rng << 17
	start := int(sh.rng) & sh.mask
	for k, seen := 0, 0; k <= sh.mask && seen < evictSample; k++ {
		i := (start + k) & sh.mask
		if sh.words[i*sh.w] == 0 {
			continue
		}
		seen++
		if storekit.Consumption(p, sh.state(i), now) == 0 {
			sh.deleteAt(t, i)
			t.store.evictions.Add(1)
			return true
		}
	}
	if since := now - sh.swept; since >= 0 && since < sweepAtCapEvery {
		return false
	}
	sh.swept = now
	return sh.sweep(t, now) > 0
}

// migrate converts every key of the table to policy p (a newer version of
// the table's policy), rule by rule matched by name.
func (t *table) migrate(p *floodgate.Policy, now int64) {
	t.lockAll()
	defer t.unlockAll()
	old := t.policy.Load()
	if storekit.SameLayout(old, p) {
		t.policy.Store(p)
		return
	}
	w := 1 + storekit.Width(p)
	for i := range t.shards {
		sh := &t.shards[i]
		prev, ow := sh.words, sh.w
		t.store.bytes.Add(-int64(len(prev)) * 8)
		sh.words, sh.w, sh.n, sh.mask, sh.scratch = nil, w, 0, 0, nil
		count := 0
		for j := 0; j+ow <= len(prev); j += ow {
			if prev[j] != 0 {
				count++
			}
		}
		slots := minSlots
		for slots*7 < count*8 {
			slots *= 2
		}
		if count > 0 {
			sh.words, sh.mask = make([]int64, slots*w), slots-1
			t.store.bytes.Add(int64(len(sh.words)) * 8)
		}
		for j := 0; j+ow <= len(prev); j += ow {
			h := uint64(prev[j])
			if h == 0 {
				continue
			}
			k := int(h) & sh.mask
			for sh.words[k*w] != 0 {
				k = (k + 1) & sh.mask
			}
			slot := sh.words[k*w : (k+1)*w]
			storekit.Migrate(p, old, prev[j+1:j+ow], slot[1:], now)
			if storekit.Consumption(p, slot[1:], now) == 0 {
				clear(slot)
				t.store.keys.Add(-1)
				continue
			}
			slot[0] = int64(h)
			sh.n++
		}
	}
	t.policy.Store(p)
}

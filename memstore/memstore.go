// Package memstore is Floodgate's embedded in-memory store: one process,
// no setup.
//
// Keys are kept per policy in sharded open-addressing tables, so parallel
// callers on different keys rarely meet on one lock, and a decision on an
// existing key allocates nothing. A key is stored as a 64-bit keyed hash
// (SipHash-2-4 under a random 128-bit key) beside its state words, not as a
// string: at 1M keys a token-bucket key costs about 50 bytes in all. Two
// distinct keys share a state only if their hashes collide: with n keys the
// odds are about n²/2^65 (3 in 100 million at a million keys), and since the
// hash key is secret and SipHash is a keyed pseudorandom function, a caller
// cannot craft colliding keys on purpose.
//
// Idle keys expire on their own: a key whose state is back at fresh is
// dropped by a periodic sweep and whenever a shard would otherwise grow.
// The number of keys and the bytes of the tables are capped. At a cap a new
// key takes the room of a key that no longer constrains (one whose state
// has decayed to fresh), found in a sample of its shard or by sweeping it.
// A key that constrains is never dropped for room, whatever a flood of new
// keys has consumed: where there is no room the new key is refused, and
// decided as by a store that cannot answer, by its rules' failure modes
// (Rule.OnStoreFailure; Decision.Degraded). Refusals are counted (Stats)
// and logged.
//
// Optionally the store writes a snapshot of every key to a file at an
// interval and on Close, and reads it back in New, so that a restart does
// not hand out a fresh daily quota; and a journal of every change since
// the last snapshot, so that a crash does not either.
package memstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/dchest/siphash"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/storekit"
)

// Options configure a Store. The zero value is a good default.
type Options struct {
	// MaxKeys caps the number of keys over all policies (default 4,194,304).
	// At the cap a new key takes the room of a key of its shard that no
	// longer constrains (its state has decayed to fresh), or, where every
	// key does, is refused: its rules' failure modes decide it
	// (Rule.OnStoreFailure: closed denies; open, and local, whose local
	// memory is this store, admit), and the decision is marked Degraded.
	// A key that constrains is never dropped to make room. A shard holding
	// fewer than 8 keys still grows, so the cap can be passed by at most 8
	// keys per shard; a restored snapshot passes it rather than drop a key
	// it holds (after the cap was lowered).
	MaxKeys int
	// MaxMemory caps the bytes of the key tables (default 1 GiB): where a
	// table would grow past it, a new key takes the room of one that no
	// longer constrains, or is refused, as at MaxKeys. Wide states (a
	// sliding log of limit 10,000 is 80 KB a key) reach this cap long
	// before MaxKeys.
	MaxMemory int64
	// Shards per policy, rounded up to a power of two (default 64, or 8 per
	// CPU if more).
	Shards int
	// SweepInterval is how often idle keys are dropped (default 1 minute;
	// negative disables the background sweep).
	SweepInterval time.Duration
	// SnapshotPath, when set, is a file the store restores from in New and
	// writes every SnapshotInterval (default 1 minute) and on Close.
	SnapshotPath     string
	SnapshotInterval time.Duration // how often the snapshot is written (default 1 minute)
	// JournalPath, when set (SnapshotPath must be too), keeps a journal of
	// every state change since the last snapshot in files JournalPath.<n>,
	// replayed over the snapshot in New, so that a crash loses at most the
	// changes of about one JournalSync (see journal.go and SyncJournal).
	JournalPath string
	// JournalSync is how often the journal is written and fsynced
	// (default 10 ms; negative: only at JournalSyncRecords, SyncJournal,
	// a snapshot and Close).
	JournalSync time.Duration
	// JournalSyncRecords writes and fsyncs the journal as soon as this
	// many records wait, before JournalSync is up (default 1000).
	JournalSyncRecords int
	// JournalWriteThrough makes each change return only once its record
	// is written to the journal's file (write(2), with the records of the
	// changes made meanwhile: a group commit), not at the next JournalSync:
	// a kill -9 then loses no decision that was returned; a power loss
	// still loses those since the last fsync.
	JournalWriteThrough bool
	journalTick         <-chan time.Time // tests: the flusher's tick in place of JournalSync's
	// Clock times background sweeps and snapshots (default clock.Coarse).
	Clock floodgate.Clock
	// Logger receives snapshot errors and a warning for a policy decided
	// under another of its name (default slog.Default()).
	Logger *slog.Logger
}

// Store is the in-memory store. It is safe for concurrent use.
type Store struct {
	k0, k1 uint64
	opts   Options
	shards int // a table's shards at most (fewer for wide states: newTable)

	last   atomic.Pointer[binding] // the last policy looked up, most often the next
	mu     sync.Mutex              // guards byName and reg's writes
	byName map[string]*table

	keys      atomic.Int64
	bytes     atomic.Int64 // of key tables
	evictions atomic.Int64
	evicted   atomic.Int64 // evictions of constraining keys: none are made
	expired   atomic.Int64
	refused   atomic.Int64
	refusedAt atomic.Int64 // when a refusal was last logged (seconds)

	jr *journal // nil: no journal

	stop      chan struct{}
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

// New returns a store. When opts.SnapshotPath names an existing snapshot,
// its keys are restored; a snapshot that cannot be read is an error, as is
// a directory where none can be written.
func New(opts Options) (*Store, error) {
	opts = opts.withDefaults()
	s := &Store{
		opts:   opts,
		byName: map[string]*table{},
		stop:   make(chan struct{}),
	}
	b := bits.Len(uint(opts.Shards - 1))
	s.shards = 1 << b
	var seed [16]byte
	if err := randRead(seed[:]); err != nil {
		return nil, err
	}
	s.k0, s.k1 = le64(seed[:8]), le64(seed[8:])
	if opts.JournalPath != "" && opts.SnapshotPath == "" {
		return nil, errors.New("memstore: a journal needs a snapshot (JournalPath without SnapshotPath)")
	}
	if opts.SnapshotPath != "" {
		if err := s.openFiles(); err != nil {
			return nil, err
		}
	}
	if opts.SweepInterval > 0 || opts.SnapshotPath != "" {
		s.wg.Add(1)
		go s.background()
	}
	s.startJournal()
	return s, nil
}

// withDefaults returns o with its defaults set.
func (o Options) withDefaults() Options {
	if o.MaxKeys <= 0 {
		o.MaxKeys = 1 << 22
	}
	if o.MaxMemory <= 0 {
		o.MaxMemory = 1 << 30
	}
	if o.Shards <= 0 {
		o.Shards = max(64, 8*runtime.GOMAXPROCS(0))
	}
	if o.SweepInterval == 0 {
		o.SweepInterval = time.Minute
	}
	if o.SnapshotInterval <= 0 {
		o.SnapshotInterval = time.Minute
	}
	if o.Clock == nil {
		o.Clock = clock.Coarse
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// openFiles restores the store's snapshot and replays its journal, and makes
// sure a snapshot can be written beside it: a snapshot that cannot be
// written is said now, not at Close, when the state it was to keep is
// already lost.
func (s *Store) openFiles() error {
	// The tables are filled now (readSnapshot), not at each policy's
	// first decision: that held the store's lock (every policy's first
	// decision) for seconds after a restart with millions of keys, and
	// callers with a deadline (Envoy's 20 ms) failed meanwhile.
	keyed, from, err := s.restore(s.opts.SnapshotPath)
	if err != nil {
		return err
	}
	if s.opts.JournalPath != "" {
		if s.jr, err = s.openJournal(s.opts.JournalPath, keyed, from); err != nil {
			return err
		}
	}
	f, err := os.CreateTemp(filepath.Dir(s.opts.SnapshotPath), ".floodgate-snapshot-*")
	if err != nil {
		if s.jr != nil {
			s.jr.close()
		}
		return fmt.Errorf("memstore: snapshots cannot be written beside %s: %w", s.opts.SnapshotPath, err)
	}
	f.Close()
	os.Remove(f.Name())
	return nil
}

// MustNew is New for options known to be good, with no snapshot to read.
func MustNew(opts Options) *Store {
	s, err := New(opts)
	if err != nil {
		panic(err)
	}
	return s
}

// Stats are a store's counters.
type Stats struct {
	Keys  int64 // keys held now
	Bytes int64 // bytes of the key tables
	// Evictions counts keys dropped at a cap (MaxKeys or MaxMemory) to make
	// room for a new key. Only a key that no longer constrains is dropped
	// (its state had decayed to fresh): an eviction forgives nothing.
	Evictions int64
	// Evicted counts evictions of keys that still constrained, which would
	// have forgiven what they had consumed. The store makes none (it
	// refuses the new key instead: Refused), so this stays 0; it is kept
	// to be watched.
	Evicted int64
	// Expired counts keys dropped by sweeps because their state was fresh
	// again.
	Expired int64
	// Refused counts decisions on new keys the store had no room for: at a
	// cap, every key it could drop still constrained. The rules' failure
	// modes made them (Decision.Degraded).
	Refused int64
}

// Stats returns the store's counters.
func (s *Store) Stats() Stats {
	return Stats{Keys: s.keys.Load(), Bytes: s.bytes.Load(), Evictions: s.evictions.Load(), Evicted: s.evicted.Load(),
		Expired: s.expired.Load(), Refused: s.refused.Load()}
}

// refuseLogEvery is how often, at most, refusals are logged (seconds).
const refuseLogEvery = 10

// refuse decides into d an operation on a new key the store has no room
// for, as a store that cannot answer: by its rules' failure modes.
func (s *Store) refuse(p *floodgate.Policy, d *floodgate.Decision) {
	s.refused.Add(1)
	*d = *storekit.Attached(p, refusalKey{}, func() any { return refusal(p) }).(*floodgate.Decision)
}

type refusalKey struct{}

// refusal is policy p's decision on a key the store has no room for: the
// first rule failing closed denies it; else it is admitted (a rule failing
// to a local limit fails open: its local memory is this store, full).
func refusal(p *floodgate.Policy) *floodgate.Decision {
	rules := p.Rules()
	for _, r := range rules {
		if r.OnStoreFailure == floodgate.FailClosed {
			return &floodgate.Decision{Limit: r.Limit, Rule: r.Name, Reason: floodgate.ReasonStoreUnavailable, RetryAfter: time.Second, Degraded: true}
		}
	}
	return &floodgate.Decision{Allowed: true, Limit: rules[0].Limit, Remaining: rules[0].Limit, Rule: rules[0].Name, Degraded: true}
}

// logRefused logs that new keys are being refused, at most every
// refuseLogEvery seconds of now (microseconds), with the count so far.
// Callers have released the shard's lock.
func (s *Store) logRefused(now int64) {
	sec, last := now/1_000_000, s.refusedAt.Load()
	if sec-last < refuseLogEvery && sec >= last || !s.refusedAt.CompareAndSwap(last, sec) {
		return
	}
	s.opts.Logger.Warn("memstore: no room for new keys: every key that could make room still constrains, so the rules' failure modes decide new keys until keys decay (raise the caps to hold more)",
		"refused", s.refused.Load(), "keys", s.keys.Load(), "max_keys", s.opts.MaxKeys, "bytes", s.bytes.Load(), "max_memory", s.opts.MaxMemory)
}

// Close stops the background work and writes a last snapshot if one is
// configured. The store still answers after Close.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		close(s.stop)
		s.wg.Wait()
		if s.opts.SnapshotPath != "" {
			s.closeErr = s.Snapshot(s.opts.SnapshotPath)
		}
		if s.jr != nil {
			s.closeErr = errors.Join(s.closeErr, s.jr.close())
		}
	})
	return s.closeErr
}

func (s *Store) background() {
	defer s.wg.Done()
	var sweep, snap <-chan time.Time
	if s.opts.SweepInterval > 0 {
		t := time.NewTicker(s.opts.SweepInterval)
		defer t.Stop()
		sweep = t.C
	}
	if s.opts.SnapshotPath != "" {
		t := time.NewTicker(s.opts.SnapshotInterval)
		defer t.Stop()
		snap = t.C
	}
	for {
		select {
		case <-s.stop:
			return
		case <-sweep:
			s.Sweep(s.opts.Clock.NowMicro())
		case <-snap:
			if err := s.Snapshot(s.opts.SnapshotPath); err != nil {
				s.opts.Logger.Error("memstore: snapshot failed", "path", s.opts.SnapshotPath, "err", err)
			}
		}
	}
}

// Sweep drops every key whose state is fresh at now (microseconds).
func (s *Store) Sweep(now int64) {
	var empty []*table
	for _, t := range s.tables() {
		n := 0
		for i := range t.shards {
			sh := &t.shards[i]
			sh.mu.Lock()
			sh.sweep(t, now)
			n += sh.n
			sh.mu.Unlock()
		}
		if n == 0 {
			empty = append(empty, t)
		}
	}
	// An empty table goes, whatever its policy: kept, it stayed for good,
	// and a service with per-key overrides makes a policy (so a table of
	// about 9 KB) for every set of numbers it meets. A table restored from
	// a snapshot whose rule is gone was written into every snapshot too.
	// A policy still in use finds its table dropped (under the shard lock
	// it takes) and binds again (rebind): a new table, empty as this one.
	s.mu.Lock()
	for _, t := range empty {
		if name := t.policy.Load().Name(); s.byName[name] == t {
			t.lockAll()
			n := 0
			for i := range t.shards {
				n += t.shards[i].n
			}
			if n == 0 {
				t.dropped = true
				delete(s.byName, name)
				s.last.Store(nil)
				for i := range t.shards {
					sh := &t.shards[i]
					s.bytes.Add(-int64(len(sh.words)) * 8)
					sh.words, sh.mask = nil, 0
				}
			}
			t.unlockAll()
		}
	}
	s.mu.Unlock()
}

func (s *Store) tables() []*table {
	s.mu.Lock()
	defer s.mu.Unlock()
	ts := make([]*table, 0, len(s.byName))
	for _, t := range s.byName {
		ts = append(ts, t)
	}
	return ts
}

func (s *Store) hash(key string) uint64 {
	h := siphash.Hash(s.k0, s.k1, unsafe.Slice(unsafe.StringData(key), len(key)))
	if h == 0 {
		h = 1 // 0 marks an empty slot
	}
	return h
}

// table returns the table of p, creating or migrating it on first sight
// of the policy object. The table is kept with the policy
// (storekit.Attached, through a tableRef): looking it up takes no lock, and
// a policy object no one uses any more takes its entry with it (a map of
// policies here had to be copied whole at each new one, which made loading
// many policies quadratic). The table may have been dropped since (Sweep):
// the caller checks t.dropped under a shard lock and calls rebind.
func (s *Store) table(p *floodgate.Policy, now int64) *table {
	if b := s.last.Load(); b != nil && b.p == p {
		return b.t
	}
	t := s.ref(p, now).t.Load()
	s.last.Store(&binding{p, t})
	return t
}

// A tableRef is what the store keeps with a policy: its table, replaced
// when Sweep drops the table and the policy is used again.
type tableRef struct{ t atomic.Pointer[table] }

func (s *Store) ref(p *floodgate.Policy, now int64) *tableRef {
	return storekit.Attached(p, s, func() any {
		r := &tableRef{}
		r.t.Store(s.bind(p, now))
		return r
	}).(*tableRef)
}

// rebind gives p a live table in place of one Sweep dropped.
func (s *Store) rebind(p *floodgate.Policy, now int64) {
	r := s.ref(p, now)
	if r.t.Load().isDropped() {
		r.t.Store(s.bind(p, now))
	}
	s.last.Store(nil)
}

// bind finds p's table by name, creating it, or migrating it to p when p
// is a newer version or the table was restored from a snapshot.
func (s *Store) bind(p *floodgate.Policy, now int64) *table {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.byName[p.Name()]
	switch {
	case t == nil:
		t = s.newTable(p)
		s.byName[p.Name()] = t
	case t.restored || storekit.Version(p) > storekit.Version(t.policy.Load()):
		t.migrate(p, now)
		t.restored = false
	case p != t.policy.Load() && !storekit.SameLayout(p, t.policy.Load()):
		// An older version first used after a newer one: two different
		// live policies of one name (floodgate.Policy), or a limiter still
		// on the version before a change. Its callers are decided under
		// the newer one; say so, once for each such policy.
		s.opts.Logger.Warn("memstore: a policy is decided under a newer one of its name; two different live policies must not share a name",
			"policy", p.Name(), "rules", p.Rules(), "deciding", t.policy.Load().Rules())
	}
	return t
}

type binding struct {
	p *floodgate.Policy
	t *table
}

// Do performs op.
func (s *Store) Do(ctx context.Context, now int64, op floodgate.Op) (d floodgate.Decision, err error) {
	if op.Policy == nil {
		return d, errNoPolicy
	}
	h := s.hash(op.Key)
	for {
		t := s.table(op.Policy, now)
		sh := &t.shards[h>>t.shift]
		sh.mu.Lock()
		if t.dropped {
			sh.mu.Unlock()
			s.rebind(op.Policy, now)
			continue
		}
		sh.do(t, h, now, &op, &d)
		var rec uint64
		if s.jr != nil && op.Kind != floodgate.OpPeek {
			rec = s.jr.key(t, sh, h)
		}
		sh.mu.Unlock()
		if d.Degraded {
			s.logRefused(now)
		}
		if rec != 0 {
			s.jr.wait(rec)
		}
		return d, nil
	}
}

var errNoPolicy = errors.New("memstore: op without a policy")

// Move carries key's state from policy from to policy to
// (floodgate.Mover), holding both keys' shards.
func (s *Store) Move(ctx context.Context, now int64, from, to *floodgate.Policy, key string) error {
	if from == nil || to == nil {
		return errNoPolicy
	}
	if from.Name() == to.Name() {
		return nil // one table: the newer version converts it
	}
	h := s.hash(key)
	var rec uint64
	for {
		ft, tt := s.table(from, now), s.table(to, now)
		fsh, tsh := &ft.shards[h>>ft.shift], &tt.shards[h>>tt.shift]
		first, second := fsh, tsh
		if uintptr(unsafe.Pointer(second)) < uintptr(unsafe.Pointer(first)) {
			first, second = second, first
		}
		first.mu.Lock()
		second.mu.Lock()
		if ft.dropped || tt.dropped {
			second.mu.Unlock()
			first.mu.Unlock()
			if ft.dropped {
				s.rebind(from, now)
			}
			if tt.dropped {
				s.rebind(to, now)
			}
			continue
		}
		if i := fsh.find(h); i >= 0 {
			fp, tp := ft.policy.Load(), tt.policy.Load()
			j := tsh.find(h)
			if j < 0 {
				j = tsh.insert(tt, tp, h, now)
			}
			storekit.MigrateOnto(tp, fp, fsh.state(i), tsh.state(j), now)
			if storekit.Consumption(tp, tsh.state(j), now) == 0 {
				tsh.deleteAt(tt, j)
			}
			fsh.deleteAt(ft, i) // another shard's insert left this one alone
			if s.jr != nil {
				s.jr.key(tt, tsh, h)
				rec = s.jr.key(ft, fsh, h)
			}
		}
		second.mu.Unlock()
		first.mu.Unlock()
		if rec != 0 {
			s.jr.wait(rec)
		}
		return nil
	}
}

// DoBatch performs every op; each key is atomic on its own.
func (s *Store) DoBatch(ctx context.Context, now int64, ops []floodgate.Op, out []floodgate.Decision) error {
	if len(out) < len(ops) {
		return errors.New("memstore: out is shorter than ops")
	}
	for i := range ops {
		d, err := s.Do(ctx, now, ops[i])
		if err != nil {
			return err
		}
		out[i] = d
	}
	return nil
}

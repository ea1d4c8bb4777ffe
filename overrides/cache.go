package overrides

import (
	"context"
	"errors"
	"hash/maphash"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Cache is a Store that remembers Get results of the store under it, in
// memory, so the hot path (an override lookup for every request
// descriptor) rarely leaves the process. It caches absences as well as
// overrides: most keys have none.
//
// It holds at most size entries, in shards of a segmented LRU: a new
// entry starts on probation (a fifth of the room) and is promoted to the
// protected segment by a second hit; a flood of distinct keys, each seen
// once, only churns the probation segment and cannot evict the keys that
// are used again and again.
//
// Staleness: Put, PutMany and Delete through the cache drop the entry
// they change (after the store has written it: a Get in flight meanwhile
// is not cached). Entries also expire ttl after they were loaded (0: never,
// right when every writer goes through this cache, as with Bolt).
// When the store is a Watcher (Redis), the cache watches it: changes made
// by other instances drop the entries they touch within a round trip, and
// every (re)subscription drops everything, since changes may have been
// missed meanwhile; the TTL is then only a backstop against a lost
// message, and 10–60 s suits it.
//
// Why not rueidis client-side caching: each hit still builds a command
// and goes through the client, its bound is bytes per connection rather
// than entries, it cannot tell a flood of one-off keys
// from the keys that matter, and the service's Redis client runs with it
// disabled; pub/sub is one connection per instance and one message per
// change, and this cache works the same over any Store.
type Cache struct {
	s      Store
	known  domainKnower // s, when it knows its domains exactly
	shards []cacheShard
	mask   uint64
	seed   maphash.Seed
	ttl    int64 // ns; 0: none
	negTTL int64
	clock  func() time.Time
	base   time.Time

	resets    atomic.Uint64
	stop      func()
	watching  bool
	closeOnce sync.Once
}

// domainKnower is a store that knows, in memory, which domains have no
// overrides: Bolt exactly (its file is this process's alone), Redis as of
// a check under a second old with no change heard of since. A lookup in
// a domain without any is answered without the cache's lock or the store.
type domainKnower interface {
	MayHave(domain string) bool
}

// A CacheOption configures a Cache.
type CacheOption func(*cacheConfig)

type cacheConfig struct {
	clock   func() time.Time
	negTTL  *time.Duration
	noWatch bool
}

// WithClock makes the cache read time from now (tests: expiry without
// sleeping). Default time.Now.
func WithClock(now func() time.Time) CacheOption {
	return func(c *cacheConfig) { c.clock = now }
}

// WithNegativeTTL sets how long an absence is cached (default: the ttl).
// 0 means until evicted or invalidated.
func WithNegativeTTL(d time.Duration) CacheOption {
	return func(c *cacheConfig) { c.negTTL = &d }
}

// WithoutWatch keeps the cache from watching a Watcher store: other
// instances' changes then show only when entries expire.
func WithoutWatch() CacheOption {
	return func(c *cacheConfig) { c.noWatch = true }
}

// CacheStats counts a Cache's work since it was made.
type CacheStats struct {
	Hits          uint64 // Gets answered with a cached override
	NegativeHits  uint64 // Gets answered with a cached absence
	Misses        uint64 // Gets that asked the store (or joined a Get that did)
	Loads         uint64 // store Gets made for misses
	LoadErrors    uint64 // store Gets that failed
	Evictions     uint64 // entries dropped for room
	Expirations   uint64 // entries found expired
	Invalidations uint64 // entries dropped by changes (here or, watched, elsewhere)
	Resets        uint64 // times everything was dropped
	Entries       int    // entries held now
	Capacity      int    // the most entries held
	Watching      bool   // the cache watches the store for other instances' changes
}

type ckey struct{ domain, key string }

type centry struct {
	k          ckey
	o          Override
	found      bool
	protected  bool
	exp        int64 // ns since base; 0: never
	prev, next *centry
}

// A cacheCall is a store Get in flight, which concurrent misses of the
// same key wait for.
type cacheCall struct {
	done  chan struct{}
	o     Override
	found bool
	err   error
	stale bool // the key changed while loading: do not cache the result
}

type cacheShard struct {
	mu        sync.Mutex
	m         map[ckey]*centry
	prob      centry // sentinels of circular lists, most recent first
	prot      centry
	nProb     int
	nProt     int
	capProb   int
	capProt   int
	inflight  map[ckey]*cacheCall
	free      *centry // one evicted entry kept for reuse
	hits, neg uint64
	misses    uint64
	loads     uint64
	loadErrs  uint64
	evicts    uint64
	expires   uint64
	invals    uint64
	_         [64]byte // keep shards' locks on separate cache lines
}

// NewCache returns a cache of at most size entries (at least 1) over s,
// each kept at most ttl (0: until evicted or invalidated).
func NewCache(s Store, size int, ttl time.Duration, opts ...CacheOption) *Cache {
	var cfg cacheConfig
	for _, o := range opts {
		o(&cfg)
	}
	size = max(size, 1)
	n := 1
	for n < 64 && size/(2*n) >= 64 {
		n *= 2
	}
	c := &Cache{
		s: s, shards: make([]cacheShard, n), mask: uint64(n - 1), seed: maphash.MakeSeed(),
		ttl: max(int64(ttl), 0), clock: cfg.clock,
	}
	c.negTTL = c.ttl
	if cfg.negTTL != nil {
		c.negTTL = max(int64(*cfg.negTTL), 0)
	}
	if c.clock != nil {
		c.base = c.clock()
	} else {
		c.base = time.Now()
	}
	for i := range c.shards {
		sh := &c.shards[i]
		room := size / n
		if i < size%n {
			room++
		}
		sh.capProb = max(room/5, 1)
		sh.capProt = room - sh.capProb
		if room == 1 {
			sh.capProb, sh.capProt = 1, 0
		}
		sh.m = make(map[ckey]*centry)
		sh.inflight = make(map[ckey]*cacheCall)
		sh.prob.prev, sh.prob.next = &sh.prob, &sh.prob
		sh.prot.prev, sh.prot.next = &sh.prot, &sh.prot
	}
	c.known, _ = s.(domainKnower)
	if w, ok := s.(Watcher); ok && !cfg.noWatch {
		c.watching = true
		c.stop = w.Watch(c.onChange, c.Reset)
	}
	return c
}

func (c *Cache) now() int64 {
	if c.clock != nil {
		return int64(c.clock().Sub(c.base))
	}
	return int64(time.Since(c.base))
}

func (c *Cache) shard(domain, key string) *cacheShard {
	h := maphash.String(c.seed, key)
	if domain != "" {
		h ^= maphash.String(c.seed, domain) * 0x9e3779b97f4a7c15
	}
	return &c.shards[(h^h>>32)&c.mask]
}

// MayHave reports whether domain may have overrides: false when the store
// below knows it has none (Bolt exactly; Redis from a recent check).
func (c *Cache) MayHave(domain string) bool {
	return c.known == nil || c.known.MayHave(domain)
}

// Get returns the override of key in domain, from memory when it can.
func (c *Cache) Get(ctx context.Context, domain, key string) (Override, bool, error) {
	if c.known != nil && !c.known.MayHave(domain) {
		return Override{}, false, nil
	}
	k := ckey{domain, key}
	sh := c.shard(domain, key)
	for {
		sh.mu.Lock()
		if e := sh.m[k]; e != nil {
			if e.exp == 0 || c.now() < e.exp {
				if e.found {
					sh.hits++
				} else {
					sh.neg++
				}
				sh.touch(e)
				o, found := e.o, e.found
				sh.mu.Unlock()
				return o, found, nil
			}
			sh.expires++
			sh.remove(e)
		}
		sh.misses++
		if call := sh.inflight[k]; call != nil {
			sh.mu.Unlock()
			select {
			case <-call.done:
			case <-ctx.Done():
				return Override{}, false, ctx.Err()
			}
			if call.err != nil && ctx.Err() == nil && isContextErr(call.err) {
				sh.mu.Lock()
				sh.misses-- // counted again on the retry
				sh.mu.Unlock()
				continue // the loader's context ended, not ours: load again
			}
			return call.o, call.found, call.err
		}
		call := &cacheCall{done: make(chan struct{})}
		sh.inflight[k] = call
		sh.loads++
		sh.mu.Unlock()
		c.load(ctx, sh, k, call)
		return call.o, call.found, call.err
	}
}

var errLoadPanicked = errors.New("overrides: the store panicked in Get")

// load asks the store for k and caches the answer unless k changed
// meanwhile; it ends the call even if the store panics.
func (c *Cache) load(ctx context.Context, sh *cacheShard, k ckey, call *cacheCall) {
	call.err = errLoadPanicked
	defer func() {
		sh.mu.Lock()
		delete(sh.inflight, k)
		if call.err != nil {
			sh.loadErrs++
		} else if !call.stale {
			// Own the strings: the caller's may pin a larger buffer.
			k := ckey{strings.Clone(k.domain), strings.Clone(k.key)}
			o := call.o
			if call.found {
				o.Domain, o.Key = k.domain, k.key
			}
			exp := c.ttl
			if !call.found {
				exp = c.negTTL
			}
			if exp > 0 {
				exp += c.now()
			}
			sh.insert(k, o, call.found, exp)
		}
		sh.mu.Unlock()
		close(call.done)
	}()
	call.o, call.found, call.err = c.s.Get(ctx, k.domain, k.key)
}

func isContextErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// touch records a hit: to the front of its segment, or promoted from
// probation to protected (demoting protected's least recent to probation).
func (sh *cacheShard) touch(e *centry) {
	if e.protected {
		if sh.prot.next != e {
			unlink(e)
			pushFront(&sh.prot, e)
		}
		return
	}
	if sh.capProt == 0 {
		unlink(e)
		pushFront(&sh.prob, e)
		return
	}
	unlink(e)
	sh.nProb--
	e.protected = true
	pushFront(&sh.prot, e)
	sh.nProt++
	if sh.nProt > sh.capProt {
		d := sh.prot.prev
		unlink(d)
		sh.nProt--
		d.protected = false
		pushFront(&sh.prob, d)
		sh.nProb++
		sh.trimProbation()
	}
}

func (sh *cacheShard) insert(k ckey, o Override, found bool, exp int64) {
	if e := sh.m[k]; e != nil { // a concurrent load got here first
		e.o, e.found, e.exp = o, found, exp
		return
	}
	e := sh.free
	if e != nil {
		sh.free = nil
		*e = centry{}
	} else {
		e = new(centry)
	}
	e.k, e.o, e.found, e.exp = k, o, found, exp
	sh.m[k] = e
	pushFront(&sh.prob, e)
	sh.nProb++
	sh.trimProbation()
}

// trimProbation evicts probation's least recent entries over its room.
// Probation may borrow protected's unused room.
func (sh *cacheShard) trimProbation() {
	for sh.nProb > 0 && sh.nProb+sh.nProt > sh.capProb+sh.capProt {
		d := sh.prob.prev
		sh.remove(d)
		sh.evicts++
		sh.free = d
	}
}

func (sh *cacheShard) remove(e *centry) {
	unlink(e)
	if e.protected {
		sh.nProt--
	} else {
		sh.nProb--
	}
	delete(sh.m, e.k)
}

func unlink(e *centry) {
	e.prev.next, e.next.prev = e.next, e.prev
	e.prev, e.next = nil, nil
}

func pushFront(head, e *centry) {
	e.prev, e.next = head, head.next
	head.next.prev = e
	head.next = e
}

// Invalidate drops the cached entry of key in domain, and keeps a load of
// it in flight from being cached. An empty key drops the whole domain.
func (c *Cache) Invalidate(domain, key string) {
	if key == "" {
		for i := range c.shards {
			sh := &c.shards[i]
			sh.mu.Lock()
			for k, e := range sh.m {
				if k.domain == domain {
					sh.remove(e)
					sh.invals++
				}
			}
			for k, call := range sh.inflight {
				if k.domain == domain {
					call.stale = true
				}
			}
			sh.mu.Unlock()
		}
		return
	}
	k := ckey{domain, key}
	sh := c.shard(domain, key)
	sh.mu.Lock()
	if e := sh.m[k]; e != nil {
		sh.remove(e)
		sh.invals++
	}
	if call := sh.inflight[k]; call != nil {
		call.stale = true
	}
	sh.mu.Unlock()
}

func (c *Cache) onChange(domain, key string) { c.Invalidate(domain, key) }

// Reset drops every entry, and keeps the loads in flight from being
// cached.
func (c *Cache) Reset() {
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		clear(sh.m)
		sh.prob.prev, sh.prob.next = &sh.prob, &sh.prob
		sh.prot.prev, sh.prot.next = &sh.prot, &sh.prot
		sh.nProb, sh.nProt, sh.free = 0, 0, nil
		for _, call := range sh.inflight {
			call.stale = true
		}
		sh.mu.Unlock()
	}
	c.resets.Add(1)
}

// Put writes o to the store and drops its cached entry.
func (c *Cache) Put(ctx context.Context, o Override) error {
	err := c.s.Put(ctx, o)
	c.Invalidate(o.Domain, o.Key)
	return err
}

// PutMany writes batch to the store (see BatchStore) and drops their cached
// entries (everything, when batch is large against the cache).
func (c *Cache) PutMany(ctx context.Context, batch []Override) error {
	err := PutMany(ctx, c.s, batch)
	if len(batch) > c.Stats().Capacity/4 {
		c.Reset()
	} else {
		for _, o := range batch {
			c.Invalidate(o.Domain, o.Key)
		}
	}
	return err
}

// Delete removes the override from the store and drops its cached entry.
func (c *Cache) Delete(ctx context.Context, domain, key string) (bool, error) {
	found, err := c.s.Delete(ctx, domain, key)
	c.Invalidate(domain, key)
	return found, err
}

// List lists from the store, uncached.
func (c *Cache) List(ctx context.Context, domain, after string, limit int) ([]Override, error) {
	return c.s.List(ctx, domain, after, limit)
}

// Store returns the store under the cache.
func (c *Cache) Store() Store { return c.s }

// Close stops watching the store and closes it.
func (c *Cache) Close() error {
	var err error
	c.closeOnce.Do(func() {
		if c.stop != nil {
			c.stop()
		}
		err = c.s.Close()
	})
	return err
}

// Stats returns the cache's counters.
func (c *Cache) Stats() CacheStats {
	st := CacheStats{Resets: c.resets.Load(), Watching: c.watching}
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		st.Hits += sh.hits
		st.NegativeHits += sh.neg
		st.Misses += sh.misses
		st.Loads += sh.loads
		st.LoadErrors += sh.loadErrs
		st.Evictions += sh.evicts
		st.Expirations += sh.expires
		st.Invalidations += sh.invals
		st.Entries += len(sh.m)
		st.Capacity += sh.capProb + sh.capProt
		sh.mu.Unlock()
	}
	return st
}

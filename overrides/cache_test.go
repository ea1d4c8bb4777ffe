package overrides

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// countingStore counts the Gets that reach the store under a cache, and
// can hold them until released.
type countingStore struct {
	Store
	gets    atomic.Int64
	mu      sync.Mutex
	hold    chan struct{} // non-nil: Gets wait for it to close
	entered chan struct{} // receives once per held Get
}

func (s *countingStore) Get(ctx context.Context, domain, key string) (Override, bool, error) {
	s.gets.Add(1)
	s.mu.Lock()
	hold, entered := s.hold, s.entered
	s.mu.Unlock()
	if hold != nil {
		entered <- struct{}{}
		<-hold
	}
	return s.Store.Get(ctx, domain, key)
}

func (s *countingStore) holdGets() (release func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hold, s.entered = make(chan struct{}), make(chan struct{}, 100)
	h := s.hold
	return func() {
		s.mu.Lock()
		s.hold = nil
		s.mu.Unlock()
		close(h)
	}
}

// fakeClock is an injected clock that moves only when told.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func newCounting(t testing.TB) *countingStore { return &countingStore{Store: openBolt(t)} }

func TestCacheStoreContract(t *testing.T) {
	testStore(t, NewCache(openBolt(t), 100, time.Minute))
}

func TestCacheHitsAndMisses(t *testing.T) {
	ctx := context.Background()
	s := newCounting(t)
	c := NewCache(s, 1000, 0)
	if err := c.Put(ctx, valid()); err != nil {
		t.Fatal(err)
	}
	for range 10 {
		o, ok, err := c.Get(ctx, "api", "user=241531")
		if err != nil || !ok || o.Limit != 5 {
			t.Fatalf("get: %+v %v %v", o, ok, err)
		}
		if _, ok, err := c.Get(ctx, "api", "user=1"); ok || err != nil {
			t.Fatalf("absent key: %v %v", ok, err)
		}
	}
	if n := s.gets.Load(); n != 2 {
		t.Fatalf("%d store gets, want 2 (absences are cached too)", n)
	}
	st := c.Stats()
	if st.Hits != 9 || st.NegativeHits != 9 || st.Misses != 2 || st.Loads != 2 || st.Entries != 2 || st.Capacity != 1000 {
		t.Fatalf("stats: %+v", st)
	}
	if st.Watching {
		t.Fatal("watching a Bolt store")
	}
}

func TestCacheInvalidatesOnWrites(t *testing.T) {
	ctx := context.Background()
	s := newCounting(t)
	c := NewCache(s, 1000, 0)
	o := valid()
	// A cached absence is dropped by a Put.
	if _, ok, _ := c.Get(ctx, o.Domain, o.Key); ok {
		t.Fatal("found before put")
	}
	c.Put(ctx, o)
	if got, ok, _ := c.Get(ctx, o.Domain, o.Key); !ok || got.Limit != 5 {
		t.Fatalf("after put: %+v %v", got, ok)
	}
	o.Limit = 7
	c.Put(ctx, o)
	if got, _, _ := c.Get(ctx, o.Domain, o.Key); got.Limit != 7 {
		t.Fatalf("after second put: %+v", got)
	}
	if found, _ := c.Delete(ctx, o.Domain, o.Key); !found {
		t.Fatal("delete")
	}
	if _, ok, _ := c.Get(ctx, o.Domain, o.Key); ok {
		t.Fatal("found after delete")
	}
	c.PutMany(ctx, []Override{o})
	if got, ok, _ := c.Get(ctx, o.Domain, o.Key); !ok || got.Limit != 7 {
		t.Fatal("after PutMany")
	}
	// A big PutMany drops everything.
	var many []Override
	for i := range 300 {
		many = append(many, Override{Domain: "api", Key: fmt.Sprint(i), Limit: 1, Period: time.Second})
	}
	c.PutMany(ctx, many)
	if st := c.Stats(); st.Entries != 0 || st.Resets != 1 {
		t.Fatalf("after a big PutMany: %+v", st)
	}
	// Invalidate with no key drops a whole domain.
	c.Get(ctx, "api", "1")
	c.Get(ctx, "web", "1")
	c.Invalidate("api", "")
	if st := c.Stats(); st.Entries != 1 {
		t.Fatalf("after dropping a domain: %+v", st)
	}
}

func TestCacheTTL(t *testing.T) {
	ctx := context.Background()
	s := newCounting(t)
	clk := &fakeClock{t: time.Unix(1000, 0)}
	c := NewCache(s, 100, 10*time.Second, WithClock(clk.Now), WithNegativeTTL(2*time.Second))
	// Write behind the cache's back, as another instance would.
	s.Put(ctx, valid())
	c.Get(ctx, "api", "user=241531")
	c.Get(ctx, "api", "none")
	s.Put(ctx, Override{Domain: "api", Key: "user=241531", Limit: 99, Period: time.Second})
	s.Put(ctx, Override{Domain: "api", Key: "none", Limit: 1, Period: time.Second})

	clk.Advance(1999 * time.Millisecond)
	if o, _, _ := c.Get(ctx, "api", "user=241531"); o.Limit != 5 {
		t.Fatalf("expired early: %+v", o)
	}
	if _, ok, _ := c.Get(ctx, "api", "none"); ok {
		t.Fatal("absence expired early")
	}
	clk.Advance(time.Millisecond)
	if _, ok, _ := c.Get(ctx, "api", "none"); !ok {
		t.Fatal("absence not expired after the negative TTL")
	}
	clk.Advance(8 * time.Second)
	if o, _, _ := c.Get(ctx, "api", "user=241531"); o.Limit != 99 {
		t.Fatalf("not expired after the TTL: %+v", o)
	}
	if st := c.Stats(); st.Expirations != 2 || s.gets.Load() != 4 {
		t.Fatalf("stats %+v, %d gets", st, s.gets.Load())
	}
}

func TestCacheBoundedUnderFlood(t *testing.T) {
	ctx := context.Background()
	s := newCounting(t)
	const size = 1000
	c := NewCache(s, size, 0)
	// 50 keys in use, some with overrides, some without.
	hot := make([]string, 50)
	for i := range hot {
		hot[i] = fmt.Sprintf("hot=%d", i)
		if i%2 == 0 {
			s.Put(ctx, Override{Domain: "api", Key: hot[i], Limit: int64(i + 1), Period: time.Second})
		}
	}
	for range 2 {
		for _, k := range hot {
			c.Get(ctx, "api", k)
		}
	}
	before := s.gets.Load()
	// A flood of 100,000 distinct keys, each seen once, with the hot keys
	// still used now and then.
	for i := range 100_000 {
		c.Get(ctx, "api", fmt.Sprintf("flood=%d", i))
		if i%1000 == 0 {
			for _, k := range hot {
				c.Get(ctx, "api", k)
			}
		}
		if i%10_000 == 0 {
			if st := c.Stats(); st.Entries > size {
				t.Fatalf("%d entries, capacity %d", st.Entries, size)
			}
		}
	}
	st := c.Stats()
	if st.Entries > size || st.Capacity != size {
		t.Fatalf("stats: %+v", st)
	}
	if st.Evictions < 100_000-size {
		t.Fatalf("evictions %d", st.Evictions)
	}
	if hotLoads := s.gets.Load() - before - 100_000; hotLoads != 0 {
		t.Fatalf("the flood evicted hot keys: %d reloads", hotLoads)
	}
	for i, k := range hot {
		o, ok, _ := c.Get(ctx, "api", k)
		if ok != (i%2 == 0) || (ok && o.Limit != int64(i+1)) {
			t.Fatalf("%s: %+v %v", k, o, ok)
		}
	}
}

func TestCacheSizeOne(t *testing.T) {
	ctx := context.Background()
	s := newCounting(t)
	c := NewCache(s, 0, 0)
	for i := range 10 {
		c.Get(ctx, "api", fmt.Sprint(i))
		c.Get(ctx, "api", fmt.Sprint(i))
	}
	if st := c.Stats(); st.Entries != 1 || st.Capacity != 1 || s.gets.Load() != 10 {
		t.Fatalf("stats %+v, %d gets", st, s.gets.Load())
	}
}

func TestCacheCoalescesMisses(t *testing.T) {
	ctx := context.Background()
	s := newCounting(t)
	s.Put(ctx, valid())
	c := NewCache(s, 100, 0)
	release := s.holdGets()
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if o, ok, err := c.Get(ctx, "api", "user=241531"); !ok || err != nil || o.Limit != 5 {
				t.Errorf("get: %+v %v %v", o, ok, err)
			}
		}()
	}
	<-s.entered
	// Wait until every goroutine waits for the load in flight.
	for c.Stats().Misses < 20 {
		time.Sleep(time.Millisecond)
	}
	release()
	wg.Wait()
	if n := s.gets.Load(); n != 1 {
		t.Fatalf("%d store gets for 20 concurrent misses", n)
	}
}

// A write that lands while a Get is loading the old value must not leave
// the old value cached.
func TestCacheWriteDuringLoad(t *testing.T) {
	ctx := context.Background()
	s := newCounting(t)
	o := valid()
	s.Put(ctx, o)
	c := NewCache(s, 100, 0)
	release := s.holdGets()
	done := make(chan Override)
	go func() {
		o, _, _ := c.Get(ctx, o.Domain, o.Key)
		done <- o
	}()
	<-s.entered
	// The store is slow: the write lands before the load reads.
	o.Limit = 42
	if err := c.Put(ctx, o); err != nil {
		t.Fatal(err)
	}
	release()
	<-done
	if got, _, _ := c.Get(ctx, o.Domain, o.Key); got.Limit != 42 {
		t.Fatalf("stale value cached: %+v", got)
	}
}

func TestCacheLoaderCanceled(t *testing.T) {
	ctx := context.Background()
	s := newCounting(t)
	s.Put(ctx, valid())
	c := NewCache(s, 100, 0)
	release := s.holdGets()
	cctx, cancel := context.WithCancel(ctx)
	first := make(chan error)
	go func() {
		_, _, err := c.Get(cctx, "api", "user=241531")
		first <- err
	}()
	<-s.entered
	second := make(chan error)
	go func() {
		_, ok, err := c.Get(ctx, "api", "user=241531")
		if err == nil && !ok {
			err = errors.New("not found")
		}
		second <- err
	}()
	for c.Stats().Misses < 2 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	release()
	if err := <-first; !errors.Is(err, context.Canceled) {
		t.Fatalf("first: %v", err)
	}
	if err := <-second; err != nil {
		t.Fatalf("a waiter got its loader's cancellation: %v", err)
	}
}

func TestCacheConcurrent(t *testing.T) {
	ctx := context.Background()
	c := NewCache(openBolt(t), 500, time.Minute)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				key := fmt.Sprintf("k%d", i%700)
				switch {
				case w == 0 && i%50 == 0:
					c.Put(ctx, Override{Domain: "api", Key: key, Limit: int64(i + 1), Period: time.Second})
				case w == 1 && i%70 == 0:
					c.Delete(ctx, "api", key)
				case i%333 == 0:
					c.Reset()
				default:
					if _, _, err := c.Get(ctx, "api", key); err != nil {
						t.Error(err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	if st := c.Stats(); st.Entries > 500 {
		t.Fatalf("stats: %+v", st)
	}
	// Every cached answer agrees with the store.
	for i := range 700 {
		key := fmt.Sprintf("k%d", i)
		a, aok, _ := c.Get(ctx, "api", key)
		b, bok, _ := c.Store().Get(ctx, "api", key)
		if aok != bok || a != b {
			t.Fatalf("%s: cache %+v %v, store %+v %v", key, a, aok, b, bok)
		}
	}
}

type panickyStore struct {
	Store
	panics atomic.Bool
}

func (s *panickyStore) Get(ctx context.Context, domain, key string) (Override, bool, error) {
	if s.panics.Load() {
		panic("store bug")
	}
	return s.Store.Get(ctx, domain, key)
}

// A store that panics in Get leaves no load in flight for later Gets to
// wait on forever.
func TestCacheStorePanics(t *testing.T) {
	s := &panickyStore{Store: openBolt(t)}
	c := NewCache(s, 10, 0)
	s.panics.Store(true)
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("no panic")
			}
		}()
		c.Get(context.Background(), "api", "k")
	}()
	s.panics.Store(false)
	if _, ok, err := c.Get(context.Background(), "api", "k"); ok || err != nil {
		t.Fatalf("after the panic: %v %v", ok, err)
	}
}

// Cache.MayHave passes on what the store below knows of its domains, so a
// caller can skip a lookup (and what it sets up for one) in a domain with
// no overrides.
func TestCacheMayHave(t *testing.T) {
	b, err := OpenBolt(t.TempDir() + "/o.db")
	if err != nil {
		t.Fatal(err)
	}
	c := NewCache(b, 16, 0)
	t.Cleanup(func() { c.Close() })
	if err := c.Put(context.Background(), Override{Domain: "has", Key: "k", Limit: 1, Period: time.Second}); err != nil {
		t.Fatal(err)
	}
	if !c.MayHave("has") || c.MayHave("none") {
		t.Fatalf("MayHave: has %v, none %v; want true, false", c.MayHave("has"), c.MayHave("none"))
	}
}

package overrides

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/floodgate/floodgate/internal/redistest"
)

func redisClient(t testing.TB, addr string) rueidis.Client {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func TestRedis(t *testing.T) {
	srv := redistest.Standalone(t)
	testStore(t, NewRedis(redisClient(t, srv.Addr), "test"))
}

func TestRedisLayout(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Standalone(t)
	r := NewRedis(redisClient(t, srv.Addr), "fg")
	if err := r.Put(ctx, Override{Domain: "a{b}%", Key: "user=1", Limit: 5, Period: time.Second}); err != nil {
		t.Fatal(err)
	}
	keys, err := redistest.Cmd(srv.Addr, "KEYS", "*")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"fg:overrides:1:{a%7Bb%7D%25}:k", "fg:overrides:1:{a%7Bb%7D%25}:v"}
	for _, k := range want {
		if !strings.Contains(keys, k) {
			t.Fatalf("keys %q, want %q", keys, want)
		}
	}
	if typ, _ := redistest.Cmd(srv.Addr, "TYPE", want[1]); typ != "hash" {
		t.Fatalf("values: %s", typ)
	}
	if typ, _ := redistest.Cmd(srv.Addr, "TYPE", want[0]); typ != "zset" {
		t.Fatalf("index: %s", typ)
	}
	r.Delete(ctx, "a{b}%", "user=1")
	if keys, _ := redistest.Cmd(srv.Addr, "DBSIZE"); keys != "0" {
		t.Fatalf("%s keys left after deleting the last override", keys)
	}
}

// Two instances, each with its own client and cache, over one Redis: a
// change through either shows in the other's cache through pub/sub, with
// no TTL.
func TestRedisCacheAcrossInstances(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Standalone(t)
	a := NewCache(NewRedis(redisClient(t, srv.Addr), "fg"), 1000, 0)
	b := NewCache(NewRedis(redisClient(t, srv.Addr), "fg"), 1000, 0)
	defer a.Close()
	defer b.Close()
	waitFor(t, "both caches subscribed", func() bool { return a.Stats().Resets >= 1 && b.Stats().Resets >= 1 })
	if !a.Stats().Watching {
		t.Fatal("not watching")
	}

	// b caches the absence, a puts: b sees it.
	if _, ok, _ := b.Get(ctx, "api", "user=1"); ok {
		t.Fatal("found before put")
	}
	if err := a.Put(ctx, Override{Domain: "api", Key: "user=1", Limit: 5, Period: time.Second}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b to see a's put", func() bool {
		o, ok, _ := b.Get(ctx, "api", "user=1")
		return ok && o.Limit == 5
	})
	// b caches it, a changes it: b sees the change.
	a.Put(ctx, Override{Domain: "api", Key: "user=1", Limit: 6, Period: time.Second})
	waitFor(t, "b to see a's change", func() bool {
		o, _, _ := b.Get(ctx, "api", "user=1")
		return o.Limit == 6
	})
	// a deletes it.
	a.Delete(ctx, "api", "user=1")
	waitFor(t, "b to see a's delete", func() bool {
		_, ok, _ := b.Get(ctx, "api", "user=1")
		return !ok
	})
	// A bulk write drops the domain's entries in b.
	b.Get(ctx, "api", "bulk=7")
	b.Get(ctx, "web", "x")
	var many []Override
	for i := range 100 {
		many = append(many, Override{Domain: "api", Key: fmt.Sprintf("bulk=%d", i), Limit: int64(i + 1), Period: time.Second})
	}
	if err := a.PutMany(ctx, many); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b to see a's bulk write", func() bool {
		o, ok, _ := b.Get(ctx, "api", "bulk=7")
		return ok && o.Limit == 8
	})
	// The change and the delete each dropped an entry b held (b has no
	// TTL, so it saw them only that way). Whether b held entries to drop
	// for the first put and the bulk write depends on whether its check
	// that the domain is empty (MayHave) ran meanwhile: then it caches
	// nothing there.
	if st := b.Stats(); st.Invalidations < 2 {
		t.Fatalf("b's stats: %+v", st)
	}
}

// When Redis restarts, the subscription comes back and the cache drops
// everything, since changes may have been missed meanwhile.
func TestRedisCacheResubscribes(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Standalone(t)
	a := NewCache(NewRedis(redisClient(t, srv.Addr), "fg"), 1000, 0)
	defer a.Close()
	waitFor(t, "subscribed", func() bool { return a.Stats().Resets == 1 })
	a.Get(ctx, "api", "user=1")
	srv.Restart(t) // no persistence: Redis comes back empty
	waitFor(t, "resubscribed", func() bool { return a.Stats().Resets >= 2 })
	if st := a.Stats(); st.Entries != 0 {
		t.Fatalf("entries kept across a resubscription: %+v", st)
	}
	// And it still hears changes.
	a.Get(ctx, "api", "user=2")
	other := NewRedis(redisClient(t, srv.Addr), "fg")
	other.Put(ctx, Override{Domain: "api", Key: "user=2", Limit: 3, Period: time.Second})
	waitFor(t, "a change after resubscribing", func() bool {
		_, ok, _ := a.Get(ctx, "api", "user=2")
		return ok
	})
}

func TestRedisWatchStop(t *testing.T) {
	srv := redistest.Standalone(t)
	r := NewRedis(redisClient(t, srv.Addr), "fg")
	calls := make(chan string, 10)
	stop := r.Watch(func(d, k string) { calls <- d + "/" + k }, func() { calls <- "reset" })
	if got := <-calls; got != "reset" {
		t.Fatalf("first call %q, want reset", got)
	}
	r.Put(context.Background(), Override{Domain: "api", Key: "k", Limit: 1, Period: time.Second})
	if got := <-calls; got != "api/k" {
		t.Fatalf("got %q", got)
	}
	stop()
	r.Put(context.Background(), Override{Domain: "api", Key: "k2", Limit: 1, Period: time.Second})
	time.Sleep(50 * time.Millisecond) // nothing may come: give it the chance
	if len(calls) != 0 {
		t.Fatalf("called after stop: %q", <-calls)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// On a Cluster, every write is one script on the domain's slot, and a
// change published on that node reaches subscribers on the others.
func TestRedisCluster(t *testing.T) {
	ctx := context.Background()
	cl := redistest.Cluster(t, 3)
	client := func() rueidis.Client {
		c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: cl.Addrs(), DisableCache: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		return c
	}
	testStore(t, NewRedis(client(), "fg"))

	caches := make([]*Cache, 3)
	for i := range caches {
		caches[i] = NewCache(NewRedis(client(), "fg"), 1000, 0)
		defer caches[i].Close()
	}
	waitFor(t, "subscriptions", func() bool {
		for _, c := range caches {
			if c.Stats().Resets == 0 {
				return false
			}
		}
		return true
	})
	// Domains on different slots.
	for d := range 10 {
		dom := fmt.Sprintf("dom%d", d)
		for _, c := range caches {
			c.Get(ctx, dom, "k")
		}
		if err := caches[d%3].Put(ctx, Override{Domain: dom, Key: "k", Limit: int64(d + 1), Period: time.Second}); err != nil {
			t.Fatal(err)
		}
		for _, c := range caches {
			waitFor(t, "the change on "+dom, func() bool {
				o, ok, _ := c.Get(ctx, dom, "k")
				return ok && o.Limit == int64(d+1)
			})
		}
	}
}

// A domain without overrides is known as such after a check, and stops
// being so at any change heard of: a write here, an announced write
// elsewhere, a resubscription, or the check's age.
func TestRedisMayHave(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Standalone(t)
	var now atomic.Int64 // the background checks read the clock too
	now.Store(time.Unix(1_800_000_000, 0).UnixNano())
	r := NewRedis(redisClient(t, srv.Addr), "fg")
	r.now = func() time.Time { return time.Unix(0, now.Load()) }
	check := func(domain string) {
		t.Helper()
		r.MayHave(domain) // tracks it
		v, ok := r.domains.m.Load(domain)
		if !ok {
			t.Fatalf("%s not tracked", domain)
		}
		r.checkDomain(ctx, domain, v.(*redisDomain))
	}

	if !r.MayHave("api") {
		t.Fatal("an unchecked domain must be assumed to have overrides")
	}
	check("api")
	if r.MayHave("api") {
		t.Fatal("checked empty, yet may have")
	}
	// A write here: at once.
	if err := r.Put(ctx, Override{Domain: "api", Key: "user=1", Limit: 5, Period: time.Second}); err != nil {
		t.Fatal(err)
	}
	if !r.MayHave("api") {
		t.Fatal("written here, yet known empty")
	}
	check("api")
	if !r.MayHave("api") {
		t.Fatal("has an override, yet known empty")
	}

	// Another instance writes: heard of through the watch, or shown by
	// the next check once the last one is domainCheckEvery old.
	check("web")
	if r.MayHave("web") {
		t.Fatal("web checked empty, yet may have")
	}
	other := NewRedis(redisClient(t, srv.Addr), "fg")
	other.Put(ctx, Override{Domain: "web", Key: "ip=1", Limit: 1, Period: time.Second})
	if r.MayHave("web") {
		t.Fatal("no watch, no time passed: the check should still hold")
	}
	now.Add(int64(domainCheckEvery))
	if !r.MayHave("web") {
		t.Fatal("the check is domainCheckEvery old, yet holds")
	}

	// A check whose domain changed while it ran does not count.
	check("mobile")
	d, _ := r.domains.m.Load("mobile")
	m := d.(*redisDomain).none.Load()
	r.changed("mobile")
	d.(*redisDomain).none.Store(m) // as if the check had answered after the change
	if !r.MayHave("mobile") {
		t.Fatal("a check older than a change still holds")
	}
	// A resubscription forgets everything.
	check("mobile")
	r.changedAll()
	if !r.MayHave("mobile") {
		t.Fatal("a resubscription kept a check")
	}

	// Watched: another instance's write shows without waiting for time.
	c := NewCache(r, 100, 0)
	defer c.Close()
	waitFor(t, "subscribed", func() bool { return c.Stats().Resets >= 1 })
	check("batch")
	if r.MayHave("batch") {
		t.Fatal("batch checked empty, yet may have")
	}
	other.Put(ctx, Override{Domain: "batch", Key: "k", Limit: 2, Period: time.Second})
	waitFor(t, "the watch to report the write", func() bool { return r.MayHave("batch") })
	waitFor(t, "the cache to find the override", func() bool {
		o, ok, _ := c.Get(ctx, "batch", "k")
		return ok && o.Limit == 2
	})
}

// A lookup in a domain known to have no overrides never reaches the
// cache's map or Redis.
func TestRedisCacheSkipsEmptyDomain(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Standalone(t)
	r := NewRedis(redisClient(t, srv.Addr), "fg")
	c := NewCache(r, 100, 0, WithoutWatch())
	defer c.Close()
	r.MayHave("api")
	v, _ := r.domains.m.Load("api")
	r.checkDomain(ctx, "api", v.(*redisDomain))
	before := c.Stats()
	for i := range 100 {
		if _, ok, err := c.Get(ctx, "api", fmt.Sprint("user=", i)); ok || err != nil {
			t.Fatal(ok, err)
		}
	}
	if after := c.Stats(); after.Misses != before.Misses || after.NegativeHits != before.NegativeHits || after.Entries != 0 {
		t.Fatalf("lookups in an empty domain went through the cache: before %+v, after %+v", before, after)
	}
}

// A lookup against a paused Redis answers by its deadline, also while
// rueidis makes its connection again (after its write timeout), which a
// paused server accepts and never answers the handshake of: callers that
// found the connection being made waited for the making, hundreds of
// milliseconds past their deadline.
func TestRedisGetWithinDeadlineWhilePaused(t *testing.T) {
	srv := redistest.Standalone(t)
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr}, DisableCache: true,
		ConnWriteTimeout: 300 * time.Millisecond, Dialer: net.Dialer{Timeout: 200 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	r := NewRedis(c, "fg")
	if _, _, err := r.Get(context.Background(), "d", "k"); err != nil {
		t.Fatal(err)
	}
	srv.Pause()
	defer srv.Resume()
	// The deadline is the subject: lookups answer by it, give or take what
	// this machine makes any goroutine wait past a deadline right now
	// (measured beside them: on a loaded host a 30 ms lookup took 78 ms
	// with nothing wrong). The wait guarded against is for a connection
	// being made: the dialer's 200 ms or the write timeout's 300 ms.
	const deadline, margin = 30 * time.Millisecond, 40 * time.Millisecond
	worst, baseline := redistest.SlowestWithBaseline(4, 2500*time.Millisecond, deadline, func(ctx context.Context) {
		if _, _, err := r.Get(ctx, "d", fmt.Sprint("k", time.Now().UnixNano())); err == nil {
			t.Error("a lookup on a paused Redis succeeded")
		}
	})
	budget := redistest.DeadlineBudget(deadline, margin, baseline)
	t.Logf("the slowest lookup took %v; a bare wait for the deadline %v; budget %v", worst, baseline, budget)
	if worst > budget {
		t.Fatalf("a lookup with a %v deadline took %v (a bare wait for it %v, budget %v)", deadline, worst, baseline, budget)
	}
}

// Stopping a watch on a paused Redis returns promptly: it waited for the
// subscription's connection to be released, which a paused Redis holds
// (a service's shutdown took seconds).
func TestWatchStopsOnPausedRedis(t *testing.T) {
	srv := redistest.Standalone(t)
	r := NewRedis(redisClient(t, srv.Addr), "fg")
	changed := make(chan struct{}, 16)
	stop := r.Watch(func(string, string) { changed <- struct{}{} }, func() {})
	// subscribed once a change comes through
	deadline := time.After(10 * time.Second)
	for subscribed := false; !subscribed; {
		if err := r.Put(context.Background(), Override{Domain: "d", Key: "k", Limit: 1, Period: time.Second}); err != nil {
			t.Fatal(err)
		}
		select {
		case <-changed:
			subscribed = true
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			t.Fatal("the watch never saw a change")
		}
	}
	srv.Pause()
	defer srv.Resume()
	// the time is the subject: a second on an idle host, plus a multiple of
	// how late this one wakes goroutines
	starved := redistest.WatchStarvation(t)
	start := time.Now()
	stop()
	if el, want := time.Since(start), starved.Allow(time.Second, 3); el > want {
		t.Fatalf("stop took %v with Redis paused, more than %v", el, want)
	}
}

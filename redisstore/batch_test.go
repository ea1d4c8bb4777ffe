package redisstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/internal/redistest"
	"github.com/floodgate/floodgate/redisstore"
)

// Keys in different Cluster slots are decided in one pipelined call, and
// AllowAll refunds the admitted keys when another is denied. A flushed
// script cache (a restart, a failover) is reloaded on the way.
func TestClusterBatchAcrossSlots(t *testing.T) {
	c := redistest.Cluster(t, 3)
	s, err := redisstore.New("redis-cluster://"+strings.Join(c.Addrs(), ","), redisstore.Options{ClientTime: true, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if redisstore.Coalescing(s) {
		t.Fatal("a Cluster store coalesces: one call cannot span slots")
	}
	ctx := context.Background()
	clk := floodgate.WithClock(clock.NewManual(time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)))
	perIP := floodgate.NewLimiter(floodgate.MustPolicy("ip", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 100, Period: time.Minute}), s, clk)
	perUser := floodgate.NewLimiter(floodgate.MustPolicy("user", floodgate.Rule{Algorithm: floodgate.SlidingLog, Limit: 3, Period: time.Minute}), s, clk)

	// Keys whose slots land on different masters.
	slots := map[string]bool{}
	for _, k := range []string{"203.0.113.1", "user:1", "user:2", "user:3"} {
		slot, _ := redistest.Cmd(c.Addrs()[0], "CLUSTER", "KEYSLOT", s.Key("x", k))
		slots[slot] = true
	}
	if len(slots) < 2 {
		t.Fatalf("test keys share one slot: %v", slots)
	}
	// Lose the code on every node, as a restart without persistence would:
	// the store loads it again on the way.
	flush := func() {
		for _, n := range c.Nodes {
			redistest.Cmd(n.Addr, "FUNCTION", "FLUSH")
			redistest.Cmd(n.Addr, "SCRIPT", "FLUSH")
		}
	}
	items := []floodgate.Item{{Limiter: perIP, Key: "203.0.113.1", Cost: 1}, {Limiter: perUser, Key: "user:1", Cost: 1}}
	out := make([]floodgate.Decision, 2)
	for i := range 6 {
		if i == 1 || i == 4 {
			flush()
		}
		ok, err := floodgate.AllowAll(ctx, items, out)
		if err != nil {
			t.Fatal(err)
		}
		if want := i < 3; ok != want || out[1].Allowed != want {
			t.Fatalf("request %d: ok=%v decisions %+v", i, ok, out)
		}
	}
	flush()
	if d, _ := perIP.AllowN(ctx, "203.0.113.1", 0); d.Remaining != 97 {
		t.Fatalf("IP remaining %d, want 97: the three denied requests must be refunded", d.Remaining)
	}
	if st := s.Stats(); st.Errors != 0 || st.Degraded != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestKeysEscapeHashTags(t *testing.T) {
	srv := redistest.Standalone(t)
	s, err := redisstore.New("redis://"+srv.Addr, redisstore.Options{Prefix: "fg"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for key, want := range map[string]string{
		"user:1": "fg:1:{user:1}:p",
		"}{evil": "fg:1:{%7D%7Bevil}:p",
		"50%{x}": "fg:1:{50%25%7Bx%7D}:p",
		"%7B":    "fg:1:{%257B}:p",
		"":       "fg:1:{%}:p", // an empty {} is no hash tag
	} {
		if got := s.Key("p", key); got != want {
			t.Errorf("Key(%q) = %q, want %q", key, got, want)
		}
	}
	if _, err := redisstore.New("redis://"+srv.Addr, redisstore.Options{Prefix: "a{b}"}); err == nil {
		t.Error("a prefix with braces must be refused")
	}
}

// A key expires when its state would be fresh again, and one refunded or
// reset to fresh is deleted.
func TestTTLAndCleanup(t *testing.T) {
	srv := redistest.Standalone(t)
	// the store's timeout is not the subject: generous, so that a starved
	// CI host does not time the calls out and write nothing
	s, err := redisstore.New("redis://"+srv.Addr, redisstore.Options{Prefix: "ttl", Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	l := floodgate.NewLimiter(floodgate.MustPolicy("p",
		floodgate.Rule{Name: "tb", Limit: 10, Period: time.Minute},
		floodgate.Rule{Name: "log", Algorithm: floodgate.SlidingLog, Limit: 5, Period: 10 * time.Second}), s)
	onRedis := func(what string, d floodgate.Decision, err error) {
		t.Helper()
		if err != nil || d.Degraded {
			t.Fatalf("%s: %+v %v: not decided on Redis", what, d, err)
		}
	}
	before := time.Now()
	d, err := l.AllowN(ctx, "k", 2)
	onRedis("AllowN", d, err)
	key := s.Key("p", "k")
	// 2 tokens of 10/minute refill in 12 s; the log empties in 10 s. The
	// TTL has run down by at most the time since the call began (on a
	// loaded host, starting redis-cli alone may take a good part of a
	// second; 2 ms for rounding to the millisecond).
	ttl, _ := redistest.Cmd(srv.Addr, "PTTL", key)
	elapsed := time.Since(before)
	if ms, _ := time.ParseDuration(ttl + "ms"); ms < 12*time.Second-elapsed-2*time.Millisecond || ms > 12*time.Second+10*time.Millisecond {
		t.Fatalf("PTTL %s %v after the call began, want the 12 s until the state is fresh, less that", ttl, elapsed)
	}
	d, err = l.Refund(ctx, "k", 2)
	onRedis("Refund", d, err)
	if n, _ := redistest.Cmd(srv.Addr, "EXISTS", key); n != "0" {
		t.Fatal("a key refunded back to fresh must be deleted")
	}
	d, err = l.Allow(ctx, "k")
	onRedis("Allow", d, err)
	if n, _ := redistest.Cmd(srv.Addr, "EXISTS", key); n != "1" {
		t.Fatal("Allow wrote no key")
	}
	if err := l.Reset(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if n, _ := redistest.Cmd(srv.Addr, "EXISTS", key); n != "0" {
		t.Fatal("Reset must delete the key")
	}
}

func TestBadURLs(t *testing.T) {
	for _, u := range []string{
		"http://localhost:6379",
		"redis-sentinel://127.0.0.1:26379",
		"redis-cluster:///",
		"redis-cluster://127.0.0.1:1/3",
		"redis-sentinel://127.0.0.1:1/m?db=x",
		"::",
	} {
		if _, err := redisstore.New(u, redisstore.Options{}); err == nil {
			t.Errorf("New(%q): want an error", u)
		}
	}
	_, err := redisstore.ParseURL("redis://:secret@127.0.0.1:1/0")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := redisstore.New("redis-cluster://user:hunter2@127.0.0.1:1,bad", redisstore.Options{}); err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("errors must not print passwords: %v", err)
	}
}

// A redis:// or rediss:// URL must name its host: rueidis takes none as
// 127.0.0.1:6379, which on a shared machine is someone else's Redis.
func TestParseURLNeedsAHost(t *testing.T) {
	for _, u := range []string{"redis://", "rediss://", "redis://:6380", "redis://user:pw@", "redis:///0", "redis://?db=1"} {
		if _, err := redisstore.ParseURL(u); err == nil || !strings.Contains(err.Error(), "no host") {
			t.Errorf("%s: %v, want no host", u, err)
		}
	}
	for _, u := range []string{"redis://127.0.0.1:6380", "redis://u:p@h:1/2", "redis://[::1]:6380", "redis://h"} {
		if _, err := redisstore.ParseURL(u); err != nil {
			t.Errorf("%s: %v", u, err)
		}
	}
}

package inflightredis_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/floodgate/floodgate/inflight"
	"github.com/floodgate/floodgate/inflight/inflightredis"
	"github.com/floodgate/floodgate/inflight/inflighttest"
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

var prefixSeq atomic.Int64

func newRedisOn(t *testing.T, c rueidis.Client, o inflightredis.Options) *inflightredis.Redis {
	t.Helper()
	if o.Prefix == "" {
		o.Prefix = fmt.Sprintf("t%d:", prefixSeq.Add(1))
	}
	r, err := inflightredis.New(c, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}

func TestRedisConformance(t *testing.T) {
	srv := redistest.Standalone(t)
	c := redisClient(t, srv.Addr)
	inflighttest.Run(t, func(t *testing.T, limit int) inflight.Limiter {
		return newRedisOn(t, c, inflightredis.Options{Limit: limit})
	})
}

// Two limiters (two clients, as two processes would have) share the cap.
func TestRedisCapShared(t *testing.T) {
	srv := redistest.Standalone(t)
	a := newRedisOn(t, redisClient(t, srv.Addr), inflightredis.Options{Limit: 2, Prefix: "shared:"})
	b := newRedisOn(t, redisClient(t, srv.Addr), inflightredis.Options{Limit: 2, Prefix: "shared:"})
	ta := inflighttest.MustAcquire(t, a, "k")
	tb := inflighttest.MustAcquire(t, b, "k")
	inflighttest.MustRefuse(t, a, "k")
	inflighttest.MustRefuse(t, b, "k")
	ta.Release()
	inflighttest.MustAcquire(t, b, "k").Release()
	tb.Release()
}

// A holder that stops heartbeating (Close stands for its death) loses its
// slot after the TTL; one that heartbeats keeps it well past the TTL.
func TestRedisExpiryAndHeartbeat(t *testing.T) {
	srv := redistest.Standalone(t)
	c := redisClient(t, srv.Addr)
	const ttl = 1500 * time.Millisecond // heartbeats every 0.5s: a busy host may delay one by a few hundred ms
	live := newRedisOn(t, c, inflightredis.Options{Limit: 1, TTL: ttl, Prefix: "hb:"})
	dead, err := inflightredis.New(c, inflightredis.Options{Limit: 1, TTL: ttl, Prefix: "hb:"})
	if err != nil {
		t.Fatal(err)
	}
	kept := inflighttest.MustAcquire(t, live, "kept")
	inflighttest.MustAcquire(t, dead, "orphan") // never released
	dead.Close()
	start := time.Now()
	// the orphan comes back after its TTL, not before
	redistest.WaitFor(t, 10*time.Second, "the orphaned slot to expire", func() bool {
		tok, ok, _ := live.Acquire(context.Background(), "orphan")
		if ok {
			tok.Release()
		}
		return ok
	})
	if el := time.Since(start); el < ttl-100*time.Millisecond {
		t.Fatalf("orphaned slot came back after %v, before its TTL %v", el, ttl)
	}
	// three TTLs later the heartbeat still holds "kept"
	time.Sleep(3 * ttl)
	if live.Lost() != 0 {
		t.Fatalf("the heartbeat lost %d slots (late by more than the TTL %v on this host?)", live.Lost(), ttl)
	}
	inflighttest.MustRefuse(t, live, "kept")
	if live.Lost() != 0 || live.Held() != 1 {
		t.Fatalf("Lost() = %d, Held() = %d; want 0, 1", live.Lost(), live.Held())
	}
	kept.Release()
	inflighttest.MustAcquire(t, live, "kept").Release()
	if live.Held() != 0 {
		t.Fatalf("Held() = %d after release", live.Held())
	}
	// the slot set's own key expires too: no key is left behind in Redis
	redistest.WaitFor(t, 10*time.Second, "the orphan's key to expire", func() bool {
		out, err := redistest.Cmd(srv.Addr, "EXISTS", "hb:orphan")
		return err == nil && out == "0"
	})
}

func TestRedisErrors(t *testing.T) {
	srv := redistest.Standalone(t)
	c := redisClient(t, srv.Addr)
	for _, o := range []inflightredis.Options{{Limit: 0}, {Limit: 1, TTL: time.Millisecond}} {
		if _, err := inflightredis.New(c, o); err == nil {
			t.Errorf("NewRedis(%+v) accepted", o)
		}
	}
	r := newRedisOn(t, c, inflightredis.Options{Limit: 1})
	srv.Kill()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if tok, ok, err := r.Acquire(ctx, "k"); err == nil || ok || tok != nil {
		t.Fatalf("Acquire with Redis down = %v, %v, %v; want an error", tok, ok, err)
	}
}

// Package inflightredis is the Redis implementation of inflight.Limiter:
// the slots of a key are a Redis sorted set of holders scored by their
// expiry on Redis's clock, so a cap holds across every process sharing the
// Redis, and the slots of a process that died come back after the TTL.
package inflightredis

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/inflight"
)

// acquireScript takes a slot of KEYS[1] (a sorted set of holders scored by
// their expiry in Redis's milliseconds) if fewer than ARGV[1] unexpired
// holders are in it. ARGV[2] is the slot's time to live in milliseconds,
// ARGV[3] the holder's member name. The time is Redis's own (TIME), so
// every process of the fleet reads one clock.
const acquireScript = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then
  return 0
end
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now + ttl, ARGV[3])
if redis.call('PTTL', KEYS[1]) < ttl then
  redis.call('PEXPIRE', KEYS[1], ttl)
end
return 1
`

// renewScript pushes back the expiry of the holders ARGV[2..] of KEYS[1]
// that are still there and unexpired, by ARGV[1] milliseconds from now; it
// never adds a holder back. It returns how many it renewed.
const renewScript = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local ttl = tonumber(ARGV[1])
local n = 0
for i = 2, #ARGV do
  if redis.call('ZSCORE', KEYS[1], ARGV[i]) then
    redis.call('ZADD', KEYS[1], 'XX', now + ttl, ARGV[i])
    n = n + 1
  end
end
if n > 0 and redis.call('PTTL', KEYS[1]) < ttl then
  redis.call('PEXPIRE', KEYS[1], ttl)
end
return n
`

// Options configure a Redis limiter.
type Options struct {
	// Limit is the most slots a key may hold at once, fleet-wide (at
	// least 1).
	Limit int
	// TTL is how long a slot outlives its holder's last heartbeat: the
	// slots of a process that died come back after at most TTL. The
	// holder renews its slots every TTL/3. 0 means 10s; at least 100ms.
	TTL time.Duration
	// Prefix is put before every key in Redis. "" means
	// "floodgate:inflight:".
	Prefix string
	// Clock paces the heartbeat; nil means the system clock. Expiries
	// are read on Redis's clock, one for the fleet.
	Clock floodgate.Clock
	// OnError, if set, is called with an error of the heartbeat.
	OnError func(error)
}

// Redis is a Limiter whose slots live in Redis: the cap holds across
// every process sharing the Redis. It is safe for concurrent use; Close
// stops its heartbeat.
type Redis struct {
	c       rueidis.Client
	o       Options
	ttlArg  string
	limArg  string
	acquire *rueidis.Lua
	renew   *rueidis.Lua
	id      string
	seq     atomic.Uint64
	lost    atomic.Int64

	mu   sync.Mutex
	held map[string]string // member -> Redis key
	stop context.CancelFunc
	done chan struct{}
}

// NewRedis returns a Redis limiter on c, which the caller keeps and
// closes after Close, and starts its heartbeat.
func New(c rueidis.Client, o Options) (*Redis, error) {
	if o.Limit < 1 {
		return nil, fmt.Errorf("inflightredis: Limit %d: must be at least 1", o.Limit)
	}
	if o.TTL == 0 {
		o.TTL = 10 * time.Second
	}
	if o.TTL < 100*time.Millisecond {
		return nil, fmt.Errorf("inflightredis: TTL %v: must be at least 100ms", o.TTL)
	}
	if o.Prefix == "" {
		o.Prefix = "floodgate:inflight:"
	}
	if o.Clock == nil {
		o.Clock = clock.Precise
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	ctx, cancel := context.WithCancel(context.Background())
	r := &Redis{c: c, o: o, ttlArg: strconv.FormatInt(o.TTL.Milliseconds(), 10), limArg: strconv.Itoa(o.Limit),
		acquire: rueidis.NewLuaScript(acquireScript), renew: rueidis.NewLuaScript(renewScript),
		id: hex.EncodeToString(b[:]), held: make(map[string]string), stop: cancel, done: make(chan struct{})}
	go r.heartbeat(ctx)
	return r, nil
}

// Limit returns the most slots a key may hold at once.
func (r *Redis) Limit() int { return r.o.Limit }

// Lost returns how many of this process's slots expired before it
// released them (its heartbeat was late by more than the TTL): each is a
// moment the cap may have been exceeded.
func (r *Redis) Lost() int64 { return r.lost.Load() }

// Held returns how many slots this process holds.
func (r *Redis) Held() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.held)
}

// Acquire takes a slot of key on Redis, or refuses when key has Limit
// unexpired holders. err is Redis's or ctx's error.
func (r *Redis) Acquire(ctx context.Context, key string) (*inflight.Token, bool, error) {
	rkey := r.o.Prefix + key
	member := r.id + ":" + strconv.FormatUint(r.seq.Add(1), 36)
	n, err := r.acquire.Exec(ctx, r.c, []string{rkey}, []string{r.limArg, r.ttlArg, member}).AsInt64()
	if err != nil {
		// the script may have run: the slot, if taken, expires after the TTL
		return nil, false, fmt.Errorf("inflightredis: acquire %q: %w", key, err)
	}
	if n != 1 {
		return nil, false, nil
	}
	r.mu.Lock()
	r.held[member] = rkey // fresh for a whole TTL: the next heartbeat finds it in time
	r.mu.Unlock()
	return inflight.NewToken(func() { r.release(rkey, member) }), true, nil
}

func (r *Redis) forget(member string) {
	r.mu.Lock()
	delete(r.held, member)
	r.mu.Unlock()
}

// release removes the holder; if Redis cannot be reached the slot comes
// back at its expiry all the same.
func (r *Redis) release(rkey, member string) {
	r.forget(member)
	ctx, cancel := context.WithTimeout(context.Background(), r.o.TTL)
	defer cancel()
	if err := r.c.Do(ctx, r.c.B().Zrem().Key(rkey).Member(member).Build()).Error(); err != nil && r.o.OnError != nil {
		r.o.OnError(fmt.Errorf("inflightredis: release: %w", err))
	}
}

// Close stops the heartbeat. Slots still held expire after the TTL.
func (r *Redis) Close() {
	r.stop()
	<-r.done
}

func (r *Redis) heartbeat(ctx context.Context) {
	defer close(r.done)
	every := r.o.TTL / 3
	for r.o.Clock.Sleep(ctx, every) == nil {
		r.renewAll(ctx)
	}
}

// renewAll renews every held slot, one script call per key, pipelined.
func (r *Redis) renewAll(ctx context.Context) {
	byKey := map[string][]string{}
	r.mu.Lock()
	for m, k := range r.held {
		byKey[k] = append(byKey[k], m)
	}
	r.mu.Unlock()
	if len(byKey) == 0 {
		return
	}
	execs := make([]rueidis.LuaExec, 0, len(byKey))
	want := make([]int, 0, len(byKey))
	for k, ms := range byKey {
		execs = append(execs, rueidis.LuaExec{Keys: []string{k}, Args: append([]string{r.ttlArg}, ms...)})
		want = append(want, len(ms))
	}
	cctx, cancel := context.WithTimeout(ctx, r.o.TTL/2)
	defer cancel()
	for i, res := range r.renew.ExecMulti(cctx, r.c, execs...) {
		n, err := res.AsInt64()
		if err != nil {
			if r.o.OnError != nil {
				r.o.OnError(fmt.Errorf("inflightredis: heartbeat: %w", err))
			}
			continue
		}
		// a slot released meanwhile is not lost; count only what is still held
		r.countLost(execs[i].Args[1:], want[i]-int(n))
	}
}

func (r *Redis) countLost(members []string, missing int) {
	if missing <= 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	still := 0
	for _, m := range members {
		if _, ok := r.held[m]; ok {
			still++
		}
	}
	r.lost.Add(int64(min(missing, still)))
}

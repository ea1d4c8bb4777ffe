package overrides

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/floodgate/floodgate/internal/decide"
)

// Redis keeps overrides in Redis, so every instance of the service sees
// the same ones.
//
// Layout: one hash and one sorted set per domain,
//
//	<prefix>:overrides:1:{<domain>}:v   hash: key → the override's binary encoding
//	<prefix>:overrides:1:{<domain>}:k   sorted set: every key, score 0
//
// The hash answers Get in one HGET; the sorted set orders the keys (all
// scores 0, so byte order) for List's pagination (ZRANGEBYLEX, O(log N +
// page) however many keys the domain has); a hash alone cannot be paged
// in order. The domain is the hash tag ('{', '}' and '%' percent-escaped),
// so both keys of a domain share a Cluster slot and every write is one
// atomic script: domains spread over the Cluster, and one domain lives on
// one node (a million overrides take about 200 MB of Redis memory there,
// measured by BenchmarkRedisPutMany1M). "1" is the layout version.
//
// Every write publishes on the channel <prefix>:overrides:1:changes, in
// the same script (so no change goes unannounced): "k<domain>\x00<key>"
// for one key, "d<domain>" after a bulk write to a domain. Watch
// subscribes to it, so a Cache in every instance drops what changed.
type Redis struct {
	c      rueidis.Client
	prefix string
	now    func() time.Time

	put, del, list *rueidis.Lua

	domains redisDomains // which domains have no overrides (redis_domains.go)
}

// NewRedis returns a store on client c, which the caller keeps (Close
// does not close it). prefix starts every key (default "floodgate"); it
// must not contain '{' or '}' (they are dropped).
func NewRedis(c rueidis.Client, prefix string) *Redis {
	if prefix == "" {
		prefix = "floodgate"
	}
	prefix = strings.NewReplacer("{", "", "}", "").Replace(prefix)
	return &Redis{
		c: c, prefix: prefix + ":overrides:1:", now: time.Now,
		put:  rueidis.NewLuaScript(putScript),
		del:  rueidis.NewLuaScript(deleteScript),
		list: rueidis.NewLuaScriptReadOnly(listScript),
	}
}

// KEYS[1] values hash, KEYS[2] key index; ARGV[1] channel, ARGV[2] domain,
// ARGV[3] "k" (announce each key) or "d" (announce the domain), then key,
// value pairs.
const putScript = `
local ch, dom, each = ARGV[1], ARGV[2], ARGV[3] == 'k'
for i = 4, #ARGV, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i+1])
  redis.call('ZADD', KEYS[2], 0, ARGV[i])
  if each then redis.call('PUBLISH', ch, 'k' .. dom .. '\0' .. ARGV[i]) end
end
if not each then redis.call('PUBLISH', ch, 'd' .. dom) end
return 1
`

// KEYS as putScript; ARGV[1] channel, ARGV[2] domain, ARGV[3] key.
const deleteScript = `
if redis.call('HDEL', KEYS[1], ARGV[3]) == 0 then return 0 end
redis.call('ZREM', KEYS[2], ARGV[3])
redis.call('PUBLISH', ARGV[1], 'k' .. ARGV[2] .. '\0' .. ARGV[3])
return 1
`

// KEYS as putScript; ARGV[1] the lower bound ("-" or "(after"), ARGV[2]
// the page size. Returns key, value, key, value...
const listScript = `
local ks = redis.call('ZRANGEBYLEX', KEYS[2], ARGV[1], '+', 'LIMIT', 0, tonumber(ARGV[2]))
if #ks == 0 then return {} end
local vs = redis.call('HMGET', KEYS[1], unpack(ks))
local out = {}
for i = 1, #ks do
  if vs[i] then out[#out+1] = ks[i]; out[#out+1] = vs[i] end
end
return out
`

var tagEscaper = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D")

func (r *Redis) keys(domain string) []string {
	base := r.prefix + "{" + tagEscaper.Replace(domain) + "}:"
	return []string{base + "v", base + "k"}
}

func (r *Redis) channel() string { return r.prefix + "changes" }

// Close does nothing: the client is the caller's.
func (r *Redis) Close() error { return nil }

// Put writes o and announces it.
func (r *Redis) Put(ctx context.Context, o Override) error {
	one := []Override{o}
	if err := prepare(one, r.now()); err != nil {
		return err
	}
	o = one[0]
	args := []string{r.channel(), o.Domain, "k", o.Key, string(encodeValue(nil, o))}
	err := r.put.Exec(ctx, r.c, r.keys(o.Domain), args).Error()
	r.changed(o.Domain) // even on an error: the write may have landed
	if err != nil {
		return fmt.Errorf("overrides: redis put: %w", err)
	}
	return nil
}

// redisChunk bounds one script's work, so a bulk write never holds Redis
// for more than a few milliseconds at a time.
const redisChunk = 1000

// PutMany writes batch, domain by domain, redisChunk overrides per script
// call; none when one is invalid. Writes of up to 64 overrides to a
// domain announce each key; larger ones announce the whole domain.
// Each chunk is atomic, the whole batch is not.
func (r *Redis) PutMany(ctx context.Context, batch []Override) error {
	if len(batch) == 0 {
		return nil
	}
	batch = slices.Clone(batch)
	if err := prepare(batch, r.now()); err != nil {
		return err
	}
	slices.SortStableFunc(batch, func(x, y Override) int { return strings.Compare(x.Domain, y.Domain) })
	for start := 0; start < len(batch); {
		end := start
		for end < len(batch) && batch[end].Domain == batch[start].Domain {
			end++
		}
		dom := batch[start].Domain
		mode := "k"
		if end-start > 64 {
			mode = "d"
		}
		keys := r.keys(dom)
		for i := start; i < end; i += redisChunk {
			j := min(i+redisChunk, end)
			args := make([]string, 0, 3+2*(j-i))
			args = append(args, r.channel(), dom, mode)
			var buf []byte
			for _, o := range batch[i:j] {
				buf = encodeValue(buf[:0], o)
				args = append(args, o.Key, string(buf))
			}
			err := r.put.Exec(ctx, r.c, keys, args).Error()
			r.changed(dom)
			if err != nil {
				return fmt.Errorf("overrides: redis put: %w", err)
			}
		}
		start = end
	}
	return nil
}

// Get returns the override of key in domain: one HGET.
func (r *Redis) Get(ctx context.Context, domain, key string) (Override, bool, error) {
	if domain == "" || key == "" {
		return Override{}, false, nil
	}
	// In a goroutine of its own, bounded by ctx: a caller that finds the
	// connection being made again waits for the making, whatever its
	// deadline (a paused Redis accepts the connection and never answers
	// the handshake). Lookups reach here on a cache miss only.
	ch := make(chan rueidis.RedisResult, 1)
	cmd := r.c.B().Hget().Key(r.keys(domain)[0]).Field(key).Build()
	go func() { ch <- r.c.Do(ctx, cmd) }()
	var res rueidis.RedisResult
	select {
	case res = <-ch:
	case <-ctx.Done():
		return Override{}, false, fmt.Errorf("overrides: redis get: %w", ctx.Err())
	}
	v, err := res.AsBytes()
	if rueidis.IsRedisNil(err) {
		return Override{}, false, nil
	}
	if err != nil {
		return Override{}, false, fmt.Errorf("overrides: redis get: %w", err)
	}
	o, err := decodeValue(domain, key, v)
	if err != nil {
		return Override{}, false, err
	}
	return o, true, nil
}

// Delete removes the override of key in domain and announces it.
func (r *Redis) Delete(ctx context.Context, domain, key string) (bool, error) {
	if domain == "" || key == "" {
		return false, nil
	}
	n, err := r.del.Exec(ctx, r.c, r.keys(domain), []string{r.channel(), domain, key}).AsInt64()
	if err != nil {
		return false, fmt.Errorf("overrides: redis delete: %w", err)
	}
	return n == 1, nil
}

// List returns a page of domain's overrides in key order.
func (r *Redis) List(ctx context.Context, domain, after string, limit int) ([]Override, error) {
	limit = normLimit(limit)
	lo := "-"
	if after != "" {
		lo = "(" + after
	}
	kv, err := r.list.Exec(ctx, r.c, r.keys(domain), []string{lo, fmt.Sprint(limit)}).AsStrSlice()
	if err != nil {
		return nil, fmt.Errorf("overrides: redis list: %w", err)
	}
	out := make([]Override, 0, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		o, err := decodeValue(domain, kv[i], []byte(kv[i+1]))
		if err != nil {
			return nil, err
		}
		out = append(out, o)
	}
	return out, nil
}

// Watch subscribes to the change channel on a dedicated connection and
// reports changes (see Watcher). When the connection breaks it
// resubscribes, with backoff, and reports a reset once subscribed again:
// changes made while it was away are unknown.
func (r *Redis) Watch(onChange func(domain, key string), onReset func()) (stop func()) {
	change, reset := onChange, onReset
	onChange = func(domain, key string) { r.changed(domain); change(domain, key) }
	onReset = func() { r.changedAll(); reset() }
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex // serializes the callbacks with stop
	stopped := false
	guard := func(f func()) {
		mu.Lock()
		defer mu.Unlock()
		if !stopped {
			f()
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		backoff := 50 * time.Millisecond
		for ctx.Err() == nil {
			began := time.Now()
			r.watchOnce(ctx, r.channel(), onChange, onReset, guard)
			if time.Since(began) > 10*time.Second {
				backoff = 50 * time.Millisecond
			}
			select {
			case <-ctx.Done():
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 2*time.Second)
		}
	}()
	return func() {
		mu.Lock()
		stopped = true // no callback runs from now on
		mu.Unlock()
		cancel()
		// The watcher leaves at once on a Redis that answers; a frozen
		// one holds its connection's release (an UNSUBSCRIBE never
		// answered), which held a shutting-down service for seconds.
		select {
		case <-done:
		case <-time.After(watchStopWait):
		}
	}
}

// watchStopWait is how long stop waits for the watcher to leave.
const watchStopWait = 250 * time.Millisecond

// watchOnce subscribes once and returns when the connection breaks or ctx
// ends.
func (r *Redis) watchOnce(ctx context.Context, ch string, onChange func(domain, key string), onReset func(), guard func(func())) error {
	dc, release := r.c.Dedicate()
	defer release()
	errc := dc.SetPubSubHooks(rueidis.PubSubHooks{
		OnMessage: func(m rueidis.PubSubMessage) {
			if m.Channel != ch || m.Message == "" {
				return
			}
			msg := m.Message
			switch msg[0] {
			case 'k':
				dom, key, ok := decide.SplitStoreKey(msg[1:]) // the script writes the store key's form
				if ok {
					guard(func() { onChange(dom, key) })
				}
			case 'd':
				guard(func() { onChange(msg[1:], "") })
			default:
				guard(onReset)
			}
		},
		OnSubscription: func(s rueidis.PubSubSubscription) {
			if s.Kind == "subscribe" && s.Channel == ch {
				guard(onReset)
			}
		},
	})
	if err := dc.Do(ctx, dc.B().Subscribe().Channel(ch).Build()).Error(); err != nil {
		return err
	}
	select {
	case err := <-errc:
		if err == nil {
			err = errors.New("subscription ended")
		}
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

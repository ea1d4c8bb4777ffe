// Package redisstore keeps Floodgate's state in Redis, so that any number
// of processes enforce one exact limit together.
//
// Every decision is one call of Floodgate's Lua code, loaded as a Redis 7
// function library (FCALL; reloaded when Redis has lost it; EVALSHA on older
// servers): the whole policy of a key — several rules, mixed algorithms — is
// decided atomically in Redis, with the same integer math as the Go engine.
// The client is rueidis, whose auto-pipelining lets concurrent decisions
// from many goroutines share round trips; on one Redis (standalone or
// Sentinel) the store also sends concurrent callers' decisions together,
// many in one call (see coalesce.go and Options.NoCoalescing).
//
// Layout: one Redis string per (policy, key), named
//
//	<prefix>:1:{<escaped key>}:<policy name>
//
// holding (MessagePack) each rule's state with the parameters it was
// written under, so a changed limit converts the state on the key's next
// request. The key is the hash tag, so every rule of a key lives in one
// Cluster slot; '{', '}' and '%' in keys are percent-escaped, so no caller
// can choose its slot. "1" is the layout version. Every key carries a TTL
// no longer than its state can matter, and is deleted when its state is
// fresh again.
//
// When Redis is slow or down, each call gives up after the store's timeout
// (Options.Timeout, or adaptive up to Options.MaxTimeout: timeout.go) and
// the rules' failure modes decide (floodgate.Rule.OnStoreFailure); after a
// few failures in a row a breaker sends every call straight to the failure
// modes, probing Redis again every Options.BreakerCooldown. A timeout that
// this process's own starvation explains (a busy host) is not held against
// Redis (starve.go).
package redisstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/floodgate/floodgate/clock"
)

// Options configure a Store.
type Options struct {
	// Prefix starts every Redis key (default "floodgate"). It must not
	// contain '{' or '}'.
	Prefix string
	// Timeout bounds each call to Redis (default 50ms); with MaxTimeout
	// above it, it is the adaptive timeout's floor.
	Timeout time.Duration
	// MaxTimeout, when above Timeout, makes the timeout adaptive: each call
	// gets three times the 99th percentile of the last 5 s of calls'
	// latencies, at least Timeout and at most MaxTimeout, so that a busy
	// host's slow answers are not cut off (see timeout.go). 0 (or at most
	// Timeout): the timeout is Timeout. floodgate serve and proxy set 1s
	// (--store-timeout-max).
	MaxTimeout time.Duration
	// ClientTime makes decisions use the caller's clock (the limiter's)
	// instead of Redis's TIME. By default Redis's clock decides, so servers
	// with skewed clocks agree; tests inject time with ClientTime. Keys'
	// TTLs still run on Redis's own clock: a test whose clock moves slower
	// than real time may find a key expired that its clock says is live
	// (keep such a test within the keys' TTLs in real time, or move its
	// clock at least as fast).
	ClientTime bool
	// BreakerThreshold is how many failures in a row open the breaker
	// (default 3).
	BreakerThreshold int
	// BreakerCooldown is how long the breaker stays open before one call
	// probes Redis again (default 500ms).
	BreakerCooldown time.Duration
	// Logger receives store errors, at most one line a second (default
	// slog.Default()).
	Logger *slog.Logger
	// NoCoalescing sends every decision as a call of its own. By default,
	// on one Redis (standalone or Sentinel, not a Cluster) the decisions of
	// concurrent callers are sent together, up to MaxBatch in one call,
	// with at most Batches calls in flight (defaults 64 and 2): Redis and
	// the client then spend their time on decisions rather than on calls.
	// A lone caller still goes at once; see coalesce.go.
	NoCoalescing bool
	MaxBatch     int // the most decisions sent in one call (default 64)
	Batches      int // the most calls in flight (default 2)
	// NoFunctions runs the decision code as a script (EVALSHA) instead of a
	// function library (FCALL), as the store does by itself on servers
	// before Redis 7. Scripts are slower: their helpers are compiled on
	// every call.
	NoFunctions bool
	// LocalKeys bounds the keys whose last state seen on Redis the store
	// keeps for rules that fail to a local limit, to seed the local limiter
	// and charge back what it admitted (localsync.go; default 65536).
	LocalKeys int
	// WriteBackInterval is how often the hits of write-back keys
	// (floodgate.TierWriteBack) are synced with Redis (default 10ms); a
	// key also syncs once it has taken half its hit threshold
	// (writeback.go).
	WriteBackInterval time.Duration
	// WriteBackKeys bounds the keys write-back tracks (default 16384); a
	// key beyond it is decided exactly.
	WriteBackKeys int
	// ShareKeys bounds the keys holding a local share's slice at once
	// (floodgate.TierLocalShare; share.go; default 1024); the others are
	// decided exactly. ShareHotRate is how many decisions in one second
	// promote a key to a slice (default 10).
	ShareKeys    int
	ShareHotRate int
	// NoNearCache asks Redis for every decision. By default, once Redis
	// refuses a request of cost 1 on a key until T, the key's requests of
	// cost 1 are refused here until T with the decision Redis would give,
	// without a call (the near cache: near.go and docs/REDIS.md). It never
	// admits more than asking Redis would; it stays off for policies with
	// an elastic rule, a shaper, or a sliding log that counts refusals.
	NoNearCache bool
}

// Store is the Redis store. It is safe for concurrent use.
type Store struct {
	client rueidis.Client
	owned  bool
	opts   Options
	script *rueidis.Lua
	// batchScript is BatchFunction as a script, for servers without
	// functions.
	batchScript *rueidis.Lua
	// packedScript is PackedFunction as a script.
	packedScript *rueidis.Lua
	moveScript   *rueidis.Lua // MoveFunction as a script, likewise
	shareScript  *rueidis.Lua // ShareFunction as a script, likewise
	shares       *shares      // local share's slices (share.go)
	nodes        *nodeSet     // the heartbeats both tiers count nodes by (nodes.go)
	co           *coalescer   // nil: every decision is a call of its own
	follow       *follower    // Sentinel: the master the coalescer's connections must be on; nil otherwise
	batchAlways  bool         // tests: every decision, a lone one too, goes through BatchFunction

	libMu     sync.Mutex
	libLoaded atomic.Bool // the function library is loaded on every node
	// loadDenied is FUNCTION LOAD's NOPERM when the store's user may not
	// load the library (least-privilege ACL, library loaded by an admin):
	// the store then calls what Redis has, and says why if it lacks it.
	loadDenied atomic.Pointer[error]
	scriptMode atomic.Bool // the server has no functions: EVALSHA instead

	// brks: one breaker for a standalone Redis or a Sentinel's master;
	// in a Cluster one per clusterBreakerSlots hash slots (breakerFor), so
	// that a master that is down sends only its own keys to the failure
	// modes, not every key of the cluster.
	brks     []breaker
	fallback *fallback
	local    *localSync // failure_mode local's meeting with Redis
	wb       *writeBack // write-back keys (writeback.go)

	calls, errs, timeouts, degraded atomic.Int64
	starved                         atomic.Int64 // timeouts excused as this process's starvation
	lastLog                         atomic.Int64

	ex    *excuse   // the lag monitor and the last answer (starve.go)
	adapt *adaptive // nil: the timeout is fixed (timeout.go)

	deadline atomic.Pointer[sharedDeadline]
	early    atomic.Pointer[sharedDeadline] // storeContext's, by the millisecond it ends in

	near     *nearCache // nil: Options.NoNearCache
	nearBase time.Time  // the near clock's zero without ClientTime (monotonic)
}

// New connects to Redis at url:
//
//	redis://[user:password@]host:port[/db]          one server (or a Cluster node: detected)
//	rediss://...                                    the same over TLS
//	redis-sentinel://[user:password@]host:port[,host:port...]/master-name[?db=N]
//	redis-cluster://[user:password@]host:port[,host:port...]
//	unix:///path/to/redis.sock[?db=N]                 one server on this host, over its Unix socket
func New(rawURL string, opts Options) (*Store, error) {
	co, err := ParseURL(rawURL)
	if err != nil {
		return nil, err
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 50 * time.Millisecond
	}
	if co.Dialer.Timeout == 0 {
		co.Dialer.Timeout = max(opts.Timeout, 200*time.Millisecond)
	}
	co.ConnWriteTimeout = max(max(opts.Timeout, opts.MaxTimeout)*4, time.Second)
	co.DisableCache = true
	// Wait up to 20µs to gather more commands into one write: fewer system
	// calls per decision under load, for a few microseconds of latency.
	co.MaxFlushDelay = 20 * time.Microsecond
	c, err := rueidis.NewClient(co)
	if err != nil {
		hint := ""
		if co.TLSConfig != nil && errors.Is(err, context.DeadlineExceeded) {
			hint = " (a rediss:// URL speaks TLS: does the server?)"
		}
		return nil, fmt.Errorf("redisstore: connect %s: %w%s", redact(rawURL), err, hint)
	}
	s, err := NewWithClient(c, opts)
	if err != nil {
		c.Close()
		return nil, err
	}
	s.owned = true
	return s, nil
}

// NewWithClient returns a store on an existing rueidis client, which the
// caller keeps ownership of. On a Sentinel client the store follows the
// client's master, its own connections included (follow.go); set
// SentinelOption.TopologyRefreshInterval so that the client catches a
// +switch-master it missed (New sets a second).
func NewWithClient(c rueidis.Client, opts Options) (*Store, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Store{client: c, opts: opts, script: rueidis.NewLuaScript(Script()), batchScript: rueidis.NewLuaScript(BatchScript()),
		packedScript: rueidis.NewLuaScript(PackedScript()),
		moveScript:   rueidis.NewLuaScript(MoveScript()), shareScript: rueidis.NewLuaScript(ShareScript())}
	s.nodes = newNodeSet(s)
	s.shares = newShares(s)
	if opts.MaxTimeout > opts.Timeout {
		s.adapt = newAdaptive(opts.Timeout, opts.MaxTimeout)
	}
	if !opts.NoCoalescing && c.Mode() != rueidis.ClientModeCluster {
		s.co = &coalescer{s: s, slots: opts.Batches, maxOps: opts.MaxBatch}
	}
	s.scriptMode.Store(opts.NoFunctions)
	if !opts.NoNearCache {
		s.near, s.nearBase = newNearCache(), time.Now()
	}
	s.brks = newBreakers(c.Mode(), opts)
	if c.Mode() == rueidis.ClientModeSentinel {
		s.follow = newFollower(c, s.switched)
	}
	fb, err := newFallback()
	if err != nil {
		return nil, err
	}
	s.fallback = fb
	addrs := make([]string, 0, 1)
	for a := range c.Nodes() {
		addrs = append(addrs, a)
	}
	s.startMonitor(clock.Precise, onThisHost(addrs))
	s.local = newLocalSync(s, fb, opts.LocalKeys)
	fb.ls = s.local
	s.wb = newWriteBack(s, opts)
	return s, nil
}

// withDefaults returns o with its defaults set, or what is wrong with it.
func (o Options) withDefaults() (Options, error) {
	if o.Prefix == "" {
		o.Prefix = "floodgate"
	}
	if strings.ContainsAny(o.Prefix, "{}") {
		return o, fmt.Errorf("redisstore: prefix %q: must not contain '{' or '}'", o.Prefix)
	}
	if o.Timeout <= 0 {
		o.Timeout = 50 * time.Millisecond
	}
	if o.BreakerThreshold <= 0 {
		o.BreakerThreshold = 3
	}
	if o.BreakerCooldown <= 0 {
		o.BreakerCooldown = 500 * time.Millisecond
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.MaxBatch <= 0 {
		o.MaxBatch = 64
	}
	if o.Batches <= 0 {
		o.Batches = 2
	}
	if o.LocalKeys <= 0 {
		o.LocalKeys = 1 << 16
	}
	if o.WriteBackInterval <= 0 {
		o.WriteBackInterval = 10 * time.Millisecond
	}
	if o.WriteBackKeys <= 0 {
		o.WriteBackKeys = 1 << 14
	}
	if o.ShareKeys <= 0 {
		o.ShareKeys = 1024
	}
	if o.ShareHotRate <= 0 {
		o.ShareHotRate = 10
	}
	return o, nil
}

// newBreakers returns a store's breakers: one for a standalone Redis or a
// Sentinel's master, one per clusterBreakerSlots hash slots in a Cluster.
func newBreakers(mode rueidis.ClientMode, opts Options) []breaker {
	n := 1
	if mode == rueidis.ClientModeCluster {
		n = clusterSlots / clusterBreakerSlots
	}
	brks := make([]breaker, n)
	for i := range brks {
		brks[i].threshold, brks[i].cooldown = opts.BreakerThreshold, opts.BreakerCooldown
	}
	return brks
}

// Close closes the store's connections (when New opened them).
func (s *Store) Close() error {
	s.shares.close() // gives back the slices: before the connections go
	s.stopMonitor()
	s.wb.close()
	s.local.close()
	if s.co != nil {
		s.co.close()
	}
	if s.owned {
		s.client.Close()
	}
	return s.fallback.close()
}

// Client returns the underlying rueidis client.
func (s *Store) Client() rueidis.Client { return s.client }

// Stats are a store's counters.
type Stats struct {
	Calls    int64 // decisions asked of Redis
	Errors   int64 // calls that failed (timeouts included)
	Timeouts int64 // calls that ran out of time
	Degraded int64 // decisions made by failure modes
	Breaker  bool  // the breaker is open: calls go straight to failure modes
	// Starved counts the timeouts not held against Redis: this process
	// was starved of CPU during the call (starve.go). They are in Timeouts
	// and Errors too.
	Starved int64
	// BreakerOpens counts the times a breaker opened.
	BreakerOpens int64
	Timeout      time.Duration // the timeout a call gets now (timeout.go)
	// Lag is the longest this process was late to run, as the store's lag
	// monitor saw it, in its last half second (starve.go).
	Lag time.Duration
	// LocalCharged counts the requests admitted by rules failing to local
	// and charged back to Redis when it answered again; LocalUntracked the
	// local decisions on keys that found no room to be seeded and charged
	// back (Options.LocalKeys; localsync.go).
	LocalCharged, LocalUntracked int64
	// Write-back (writeback.go): decisions made in memory, decisions of
	// hot keys made exactly in Redis, pipelined syncs sent, the live node
	// count the heartbeats last read, and the keys tracked.
	WriteBackLocal, WriteBackExact, WriteBackSyncs, WriteBackNodes int64
	WriteBackKeys                                                  int
	// Share counts local share's slices (floodgate.TierLocalShare).
	Share ShareStats
	// NearHits counts the requests the near cache refused without asking
	// Redis (Options.NoNearCache); they are not in Calls.
	NearHits int64
}

// Stats returns the store's counters.
func (s *Store) Stats() Stats {
	st := Stats{Calls: s.calls.Load(), Errors: s.errs.Load(), Timeouts: s.timeouts.Load(),
		Degraded: s.degraded.Load(), Breaker: s.breakerOpen(), Starved: s.starved.Load(), BreakerOpens: s.breakerOpens(),
		Timeout: s.timeout(), Lag: time.Duration(s.ex.mon.lag.Load()) * time.Microsecond,
		LocalCharged: s.local.charged.Load(), LocalUntracked: s.local.untracked.Load(), NearHits: s.nearHits(),
		Share: s.shares.stats()}
	s.wb.stats(&st)
	return st
}

// Ping asks Redis (every node of a Cluster) to answer, by ctx's end: what
// a readiness check needs when no decision has been asked for a while, and
// so none has found Redis gone. It leaves the breaker as it is.
func (s *Store) Ping(ctx context.Context) error {
	ping := func() error {
		for _, r := range s.client.DoMulti(ctx, s.client.B().Ping().Build()) {
			if err := r.Error(); err != nil {
				return err
			}
		}
		return nil
	}
	if _, ok := ctx.Deadline(); !ok {
		return ping()
	}
	return within(ctx, ping, func(err error) error { return err })
}

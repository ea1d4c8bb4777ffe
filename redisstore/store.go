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
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/storekit"
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
	moveScript  *rueidis.Lua // MoveFunction as a script, likewise
	co          *coalescer   // nil: every decision is a call of its own
	follow      *follower    // Sentinel: the master the coalescer's connections must be on; nil otherwise
	batchAlways bool         // tests: a lone decision goes through BatchFunction too

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

	calls, errs, timeouts, degraded atomic.Int64
	starved                         atomic.Int64 // timeouts excused as this process's starvation
	lastLog                         atomic.Int64

	ex    *excuse   // the lag monitor and the last answer (starve.go)
	adapt *adaptive // nil: the timeout is fixed (timeout.go)

	deadline atomic.Pointer[sharedDeadline]
	early    atomic.Pointer[sharedDeadline] // storeContext's, by the millisecond it ends in
}

// sharedDeadline is the call deadline shared by every call that starts in
// one millisecond: one timer a millisecond instead of one a call.
type sharedDeadline struct {
	ms     int64
	ctx    context.Context
	cancel context.CancelFunc // never called: the deadline's timer releases ctx
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
	if opts.Prefix == "" {
		opts.Prefix = "floodgate"
	}
	if strings.ContainsAny(opts.Prefix, "{}") {
		return nil, fmt.Errorf("redisstore: prefix %q: must not contain '{' or '}'", opts.Prefix)
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 50 * time.Millisecond
	}
	if opts.BreakerThreshold <= 0 {
		opts.BreakerThreshold = 3
	}
	if opts.BreakerCooldown <= 0 {
		opts.BreakerCooldown = 500 * time.Millisecond
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.MaxBatch <= 0 {
		opts.MaxBatch = 64
	}
	if opts.Batches <= 0 {
		opts.Batches = 2
	}
	if opts.LocalKeys <= 0 {
		opts.LocalKeys = 1 << 16
	}
	s := &Store{client: c, opts: opts, script: rueidis.NewLuaScript(Script()), batchScript: rueidis.NewLuaScript(BatchScript()),
		moveScript: rueidis.NewLuaScript(MoveScript())}
	if opts.MaxTimeout > opts.Timeout {
		s.adapt = newAdaptive(opts.Timeout, opts.MaxTimeout)
	}
	if !opts.NoCoalescing && c.Mode() != rueidis.ClientModeCluster {
		s.co = &coalescer{s: s, slots: opts.Batches, maxOps: opts.MaxBatch}
	}
	s.scriptMode.Store(opts.NoFunctions)
	n := 1
	if c.Mode() == rueidis.ClientModeCluster {
		n = clusterSlots / clusterBreakerSlots
	}
	s.brks = make([]breaker, n)
	for i := range s.brks {
		s.brks[i].threshold, s.brks[i].cooldown = opts.BreakerThreshold, opts.BreakerCooldown
	}
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
	return s, nil
}

// Close closes the store's connections (when New opened them).
func (s *Store) Close() error {
	s.stopMonitor()
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

// MaxKeyBytes bounds the bytes of a key as Redis keys hold it: a longer
// one is kept as its SHA-256 digest. Sending megabytes a call would cost
// more than the store's timeout, and each call that timed out so would
// count as Redis failing (Options.BreakerThreshold) for every key.
const MaxKeyBytes = 1024

// Key returns the Redis key holding key's state under policy:
// prefix:1:{key}:policy, with '{', '}' and '%' in key percent-escaped (no
// key can choose its Cluster slot or meet another's), the empty key as
// {%} (an empty hash tag would not be one, and a key's names would land
// in other slots), and a key over MaxKeyBytes as {%s<its SHA-256 in hex>}.
// An escaped key holds '%' only before two hex digits, so none of the
// three forms meets another.
func (s *Store) Key(policy, key string) string {
	var b strings.Builder
	b.Grow(len(s.opts.Prefix) + min(len(key), MaxKeyBytes) + len(policy) + 8)
	b.WriteString(s.opts.Prefix)
	b.WriteString(":1:{")
	switch {
	case key == "":
		b.WriteByte('%')
	case len(key) > MaxKeyBytes:
		sum := sha256.Sum256([]byte(key))
		b.WriteString("%s")
		b.WriteString(hex.EncodeToString(sum[:]))
		key = ""
	}
	for i := 0; i < len(key); i++ {
		switch c := key[i]; c {
		case '{':
			b.WriteString("%7B")
		case '}':
			b.WriteString("%7D")
		case '%':
			b.WriteString("%25")
		default:
			b.WriteByte(c)
		}
	}
	b.WriteString("}:")
	b.WriteString(policy)
	return b.String()
}

// policyArgs returns p's prepared arguments, kept with p (so they go when
// p does: a map of policies here grew at every reload of the rules).
func (s *Store) policyArgs(p *floodgate.Policy) *policyArgs {
	return storekit.Attached(p, argsKey{}, func() any { return newPolicyArgs(p) }).(*policyArgs)
}

// argsKey is the key of a policy's prepared arguments (storekit.Attached):
// they depend on the policy alone, so every store shares them.
type argsKey struct{}

func (s *Store) scriptArgs(now int64, op *floodgate.Op) (*policyArgs, []string) {
	pa, o := s.nums(now, op)
	return pa, pa.singleArgs(o)
}

// nums returns op's policy arguments and its own numbers.
func (s *Store) nums(now int64, op *floodgate.Op) (*policyArgs, opNums) {
	pa := s.policyArgs(op.Policy)
	t := now
	if !s.opts.ClientTime {
		t = 0
	}
	return pa, pa.nums(t, now, op)
}

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
}

// Stats returns the store's counters.
func (s *Store) Stats() Stats {
	return Stats{Calls: s.calls.Load(), Errors: s.errs.Load(), Timeouts: s.timeouts.Load(),
		Degraded: s.degraded.Load(), Breaker: s.breakerOpen(), Starved: s.starved.Load(), BreakerOpens: s.breakerOpens(),
		Timeout: s.timeout(), Lag: time.Duration(s.ex.mon.lag.Load()) * time.Microsecond,
		LocalCharged: s.local.charged.Load(), LocalUntracked: s.local.untracked.Load()}
}

var errNoPolicy = errors.New("redisstore: op without a policy")

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

// Do performs op in one script call.
func (s *Store) Do(ctx context.Context, now int64, op floodgate.Op) (floodgate.Decision, error) {
	if op.Policy == nil {
		return floodgate.Decision{}, errNoPolicy
	}
	key := s.Key(op.Policy.Name(), op.Key)
	s.checkMaster()
	brk := s.breakerFor(key)
	if !brk.allow() {
		return s.degrade(ctx, now, &op, nil), nil
	}
	start := time.Now()
	sctx, ok := s.storeContextAt(ctx, start)
	if !ok { // no time left to ask Redis: answer by the failure mode now
		if ctx.Err() != nil {
			return floodgate.Decision{}, ctx.Err()
		}
		return s.degrade(ctx, now, &op, errNoTime), nil
	}
	if s.local.busy.Load() > 0 { // local admitted on some key: Redis learns it first
		s.local.settle(sctx, now, []floodgate.Op{op})
	}
	s.calls.Add(1)
	var d floodgate.Decision
	var err error
	if s.co != nil {
		w := getWaiter(1)
		pa, o := s.nums(now, &op)
		w.add(key, pa, o)
		if err = s.co.submit(ctx, sctx, w); err == nil {
			d, err = w.dec[0], w.errs[0]
			putWaiter(w)
		} // else it left the queue at sctx's end: w belongs to the batch
	} else {
		pa, args := s.scriptArgs(now, &op)
		var r rueidis.RedisResult
		if brk.troubled.Load() {
			r = within(sctx, func() rueidis.RedisResult { return s.call(sctx, key, args) }, rueidis.NewErrorResult)
		} else {
			r = s.call(sctx, key, args)
		}
		d, err = s.decideReply(pa, r)
	}
	if err == nil {
		s.answered(start.UnixMicro())
		brk.success()
		s.local.answered(&op, &d, now)
		return d, nil
	}
	if ctx.Err() != nil { // the caller gave up: not Redis's failure
		return floodgate.Decision{}, ctx.Err()
	}
	s.failed(brk, err, sctx, start.UnixMicro())
	return s.degrade(ctx, now, &op, err), nil
}

// DoBatch performs every op in one pipelined round trip (keys in different
// Cluster slots go to their nodes in parallel). Each key is atomic on its
// own; a failed key is decided by its rules' failure modes.
func (s *Store) DoBatch(ctx context.Context, now int64, ops []floodgate.Op, out []floodgate.Decision) error {
	if len(out) < len(ops) {
		return errors.New("redisstore: out is shorter than ops")
	}
	return s.doBatch(ctx, now, ops, nil, out)
}

// DoGroup performs ops as DoBatch does, those whose index is set in group
// all or nothing (floodgate.GroupStore), atomically: the batch is one call
// of BatchFunction, which Redis runs alone. A store on a Redis Cluster,
// which sends each key to its own node, returns errors.ErrUnsupported, and
// floodgate.DoGroup compensates instead. When Redis cannot be asked, each
// operation is decided by its rules' failure modes, as in DoBatch.
func (s *Store) DoGroup(ctx context.Context, now int64, ops []floodgate.Op, group []bool, out []floodgate.Decision) error {
	if s.co == nil {
		return errors.ErrUnsupported
	}
	if len(out) < len(ops) || len(group) < len(ops) {
		return errors.New("redisstore: out or group is shorter than ops")
	}
	return s.doBatch(ctx, now, ops, group[:len(ops)], out)
}

// doBatch is DoBatch, with an all-or-nothing group when group is not nil
// (coalescing stores only).
func (s *Store) doBatch(ctx context.Context, now int64, ops []floodgate.Op, group []bool, out []floodgate.Decision) error {
	if len(ops) == 0 {
		return nil
	}
	for i := range ops {
		if ops[i].Policy == nil {
			return errNoPolicy
		}
	}
	if len(ops) == 1 { // one key: a plain call (which asks the breaker itself)
		d, err := s.Do(ctx, now, ops[0])
		if err != nil {
			return err
		}
		out[0] = d
		return nil
	}
	s.checkMaster()
	if s.co == nil {
		return s.doEach(ctx, now, ops, out)
	}
	// one Redis: one breaker, and the batch is one call (all or nothing
	// for a group), so it goes to Redis or to the failure modes whole
	brk := &s.brks[0]
	if !brk.allow() {
		for i := range ops {
			out[i] = s.degrade(ctx, now, &ops[i], nil)
		}
		return nil
	}
	start := time.Now()
	sctx, ok := s.storeContextAt(ctx, start)
	if !ok { // no time left to ask Redis: answer by the failure modes now
		if ctx.Err() != nil {
			return ctx.Err()
		}
		for i := range ops {
			out[i] = s.degrade(ctx, now, &ops[i], errNoTime)
		}
		return nil
	}
	if s.local.busy.Load() > 0 { // local admitted on some key: Redis learns it first
		s.local.settle(sctx, now, ops)
	}
	s.calls.Add(int64(len(ops)))
	errs := make([]error, len(ops))
	w := getWaiter(len(ops))
	for i := range ops {
		pa, o := s.nums(now, &ops[i])
		w.add(s.Key(ops[i].Policy.Name(), ops[i].Key), pa, o)
	}
	if group != nil {
		w.grp = slices.Clone(group) // the batch may outlive this call
	}
	if err := s.co.submit(ctx, sctx, w); err != nil {
		// it left the queue at sctx's end (w belongs to the batch)
		for i := range errs {
			errs[i] = err
		}
	} else {
		copy(out, w.dec)
		copy(errs, w.errs)
		putWaiter(w)
	}
	var firstErr error
	for i, err := range errs {
		if err == nil {
			s.local.answered(&ops[i], &out[i], now)
			continue
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if firstErr == nil {
			firstErr = err
		}
		out[i] = s.degrade(ctx, now, &ops[i], err)
	}
	if firstErr != nil {
		s.failed(brk, firstErr, sctx, start.UnixMicro())
	} else {
		s.answered(start.UnixMicro())
		brk.success()
	}
	return nil
}

// doEach is doBatch without coalescing (a Cluster, or Options.NoCoalescing):
// each key is a call of its own (in a Cluster, to the master of its slot),
// all of them in one pipelined round trip, and each asks and feeds the
// breaker of its slots, so that keys on a master that is down or silent go
// to the failure modes and the others to Redis.
func (s *Store) doEach(ctx context.Context, now int64, ops []floodgate.Op, out []floodgate.Decision) error {
	keys := make([]string, len(ops))
	brks := make([]*breaker, len(ops))
	ask := make([]int, 0, len(ops)) // the ops whose breaker lets them ask Redis
	troubled := false
	for i := range ops {
		keys[i] = s.Key(ops[i].Policy.Name(), ops[i].Key)
		brks[i] = s.breakerFor(keys[i])
		if brks[i].allow() {
			ask = append(ask, i)
			troubled = troubled || brks[i].troubled.Load()
		}
	}
	var sctx context.Context
	start := time.Now()
	if len(ask) > 0 {
		var ok bool
		if sctx, ok = s.storeContextAt(ctx, start); !ok {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			for i := range ops {
				out[i] = s.degrade(ctx, now, &ops[i], errNoTime)
			}
			return nil
		}
	}
	errs := make([]error, len(ops))
	for i := range ops {
		errs[i] = errBreakerOpen
	}
	if len(ask) > 0 && s.local.busy.Load() > 0 { // local admitted on some key: Redis learns it first
		asked := make([]floodgate.Op, len(ask))
		for j, i := range ask {
			asked[j] = ops[i]
		}
		s.local.settle(sctx, now, asked)
	}
	if len(ask) > 0 {
		s.calls.Add(int64(len(ask)))
		pas := make([]*policyArgs, len(ask))
		execs := make([]rueidis.LuaExec, len(ask))
		for j, i := range ask {
			var args []string
			pas[j], args = s.scriptArgs(now, &ops[i])
			execs[j] = rueidis.LuaExec{Keys: []string{keys[i]}, Args: args}
		}
		var res []rueidis.RedisResult
		if troubled {
			res = within(sctx, func() []rueidis.RedisResult { return s.execMulti(sctx, execs) }, func(err error) []rueidis.RedisResult {
				res := make([]rueidis.RedisResult, len(execs))
				for i := range res {
					res[i] = rueidis.NewErrorResult(err)
				}
				return res
			})
		} else {
			res = s.execMulti(sctx, execs)
		}
		answered := false
		for j, r := range res {
			i := ask[j]
			out[i], errs[i] = s.decideReply(pas[j], r)
			answered = answered || errs[i] == nil
		}
		if answered {
			s.answered(start.UnixMicro())
		}
	}
	for i, err := range errs {
		switch {
		case err == nil:
			brks[i].success()
			s.local.answered(&ops[i], &out[i], now)
			continue
		case err == errBreakerOpen:
			out[i] = s.degrade(ctx, now, &ops[i], nil)
			continue
		case ctx.Err() != nil:
			return ctx.Err()
		}
		s.failed(brks[i], err, sctx, start.UnixMicro())
		out[i] = s.degrade(ctx, now, &ops[i], err)
	}
	return nil
}

// errBreakerOpen marks, in doEach, an op its breaker kept from Redis.
var errBreakerOpen = errors.New("redisstore: breaker open")

// within returns f's result, or, if ctx ends first, failed(ctx's error),
// leaving f to finish in its goroutine. rueidis bounds a command by its
// context, but a caller that finds its connection being made again waits
// for the making, whatever its deadline: against a paused or overloaded
// Redis, which accepts the connection and never answers the handshake, that
// is the dial and write timeouts, seconds (the coalescer's connections have
// the same guard: getConn). Calls go through within while Redis has been
// failing or a timeout was excused as starvation (the breaker is
// troubled), and straight to rueidis otherwise, so the healthy path pays
// no goroutine.
func within[T any](ctx context.Context, f func() T, failed func(error) T) T {
	ch := make(chan T, 1)
	go func() { ch <- f() }()
	select {
	case v := <-ch:
		return v
	case <-ctx.Done():
		return failed(ctx.Err())
	}
}

// errNoTime is the error a decision is degraded with when its caller left
// no time to ask Redis.
var errNoTime = errors.New("redisstore: the caller's deadline leaves no time for Redis")

// storeContext returns the context Redis is asked under: a deadline shared
// by the calls that end in the same millisecond, never cancelled but by
// its own timer (no timer per call; see timeoutContext). When the caller has
// a deadline (Envoy gives its rate limit calls 20ms) that comes before
// the store's timeout, Redis gets until a fifth of the time left before it
// (at least 1 ms, rounded down to the millisecond where that leaves 1 ms:
// 4 ms of Envoy's 20),
// so that on a slow or silent Redis the failure mode still answers, as a
// timeout, before the caller's deadline; otherwise it gets the store's
// timeout (Options.Timeout, or the adaptive timeout: see timeout.go). A
// caller cancelled meanwhile still waits, at most until
// that deadline. False when less than a millisecond is left to ask Redis
// in (the caller has under 2 ms): the caller is answered by the failure
// mode at once, and Redis is not blamed.
func (s *Store) storeContext(ctx context.Context) (context.Context, bool) {
	return s.storeContextAt(ctx, time.Now())
}

// storeContextAt is storeContext for a call that starts at now.
func (s *Store) storeContextAt(ctx context.Context, now time.Time) (context.Context, bool) {
	if ctx.Err() != nil {
		return ctx, false
	}
	d, ok := ctx.Deadline()
	end := d.Add(-max(d.Sub(now)/5, time.Millisecond))
	if !ok || end.Sub(now) > s.timeout() {
		return s.timeoutContext(now), true
	}
	if end.Sub(now) < time.Millisecond {
		return ctx, false
	}
	ms := end.UnixMilli()
	if time.UnixMilli(ms).Sub(now) < time.Millisecond {
		// rounded down, the shared deadline would leave Redis under a
		// millisecond: a deadline of this call's own (a timer; only the
		// calls with 2 to 3 ms left take one)
		ectx, cancel := context.WithDeadline(context.Background(), end)
		return &ownDeadline{ectx, cancel}, true
	}
	if e := s.early.Load(); e != nil && e.ms == ms {
		return e.ctx, true
	}
	ectx, cancel := context.WithDeadline(context.Background(), time.UnixMilli(ms))
	s.early.Store(&sharedDeadline{ms: ms, ctx: ectx, cancel: cancel})
	return ectx, true
}

// An ownDeadline is a call's own deadline context, released by its timer
// (cancel is kept, never called: the call ends before the deadline or at
// it).
type ownDeadline struct {
	context.Context
	cancel context.CancelFunc
}

// timeoutContext is the context of a call started at now that only the
// store's timeout bounds: a deadline shared by the calls that start within
// the same millisecond, Timeout to Timeout+1ms after they start, released
// by its own timer. A timer per call (context.WithTimeout) had been 6% of
// the service's CPU on Redis.
func (s *Store) timeoutContext(now time.Time) context.Context {
	ms := now.UnixMilli()
	if sd := s.deadline.Load(); sd != nil && sd.ms == ms {
		return sd.ctx
	}
	// Calls of this millisecond may still use the previous context: it is
	// released by its own timer at its deadline.
	dctx, cancel := context.WithDeadline(context.Background(), time.UnixMilli(ms+1).Add(s.timeout()))
	s.deadline.Store(&sharedDeadline{ms: ms, ctx: dctx, cancel: cancel})
	return dctx
}

// call makes one decision's call: FCALL of the function library, loading
// it first if this store has not yet (or Redis lost it: a restart without
// persistence, a new node); EVALSHA/EVAL on servers without functions.
func (s *Store) call(ctx context.Context, key string, args []string) rueidis.RedisResult {
	return s.callOn(ctx, s.client, key, args)
}

// callOn is call on the connection cc (a coalescer's own, or the client).
func (s *Store) callOn(ctx context.Context, cc rueidis.CoreClient, key string, args []string) rueidis.RedisResult {
	if s.scriptMode.Load() {
		return s.script.Exec(ctx, s.client, []string{key}, args)
	}
	if !s.libLoaded.Load() {
		if err := s.loadLibrary(ctx); err != nil {
			return rueidis.NewErrorResult(err)
		}
		if s.scriptMode.Load() {
			return s.script.Exec(ctx, s.client, []string{key}, args)
		}
	}
	r := cc.Do(ctx, s.fcall(key, args))
	if notLoaded(r.Error()) {
		s.libLoaded.Store(false)
		if err := s.loadLibrary(ctx); err != nil {
			return rueidis.NewErrorResult(err)
		}
		r = s.explainMissing(cc.Do(ctx, s.fcall(key, args)))
	}
	return r
}

// explainMissing returns r, or, when r says the library is missing after
// the store tried to load it and its user may not (NOPERM), an error that
// says so rather than Redis's bare "Function not found".
func (s *Store) explainMissing(r rueidis.RedisResult) rueidis.RedisResult {
	if denied := s.loadDenied.Load(); denied != nil && notLoaded(r.Error()) {
		return rueidis.NewErrorResult(fmt.Errorf("redisstore: Redis lacks the function library %s (%w) and this user may not load it (%w): load it as an admin (FUNCTION LOAD) or grant the store's user +function|load",
			LibraryName, r.Error(), *denied))
	}
	return r
}

func (s *Store) fcall(key string, args []string) rueidis.Completed {
	return s.client.B().Fcall().Function(Function).Numkeys(1).Key(key).Arg(args...).Build()
}

// notLoaded reports whether err says the function library is missing.
func notLoaded(err error) bool {
	e, ok := rueidis.IsRedisErr(err)
	return ok && strings.Contains(e.Error(), "Function not found")
}

// loadLibrary loads the function library on every node (FUNCTION LOAD
// REPLACE: the same code under the same name is a no-op in effect). A
// server without functions (before Redis 7) switches the store to scripts.
func (s *Store) loadLibrary(ctx context.Context) error {
	s.libMu.Lock()
	defer s.libMu.Unlock()
	if s.libLoaded.Load() || s.scriptMode.Load() {
		return nil
	}
	lib := Library()
	var firstErr, readonly, denied error
	loaded := 0
	for addr, n := range s.client.Nodes() {
		err := n.Do(ctx, n.B().FunctionLoad().Replace().FunctionCode(lib).Build()).Error()
		if e, ok := rueidis.IsRedisErr(err); ok {
			switch {
			case strings.Contains(e.Error(), "unknown command"):
				s.scriptMode.Store(true)
				s.opts.Logger.Warn("redisstore: Redis has no functions (before 7.0); using EVALSHA")
				return nil
			case strings.Contains(e.Error(), "READONLY"):
				// a replica: it gets the library from its master
				if readonly == nil {
					readonly = fmt.Errorf("redisstore: %s is a replica (%w): decisions write, so point the store at the master, or use redis-sentinel:// or redis-cluster:// to follow it", addr, err)
				}
				continue
			case strings.HasPrefix(e.Error(), "NOPERM"):
				// the store's user may not load code (a least-privilege
				// ACL): use the library an admin loaded
				if denied == nil {
					denied = fmt.Errorf("FUNCTION LOAD on %s: %w", addr, err)
				}
				continue
			}
		}
		if err != nil {
			if firstErr == nil {
				firstErr = fmt.Errorf("redisstore: FUNCTION LOAD on %s: %w", addr, err)
			}
			continue
		}
		loaded++
	}
	switch {
	case loaded > 0:
		s.loadDenied.Store(nil)
	case firstErr != nil:
		return firstErr
	case denied != nil:
		s.loadDenied.Store(&denied)
	case readonly != nil:
		// no master among the nodes: every decision would fail with
		// READONLY, or with "Function not found" if the master never
		// loaded the library
		return readonly
	}
	s.libLoaded.Store(true)
	return nil
}

// execMulti sends every decision in one pipeline (FCALL; EVALSHA on
// servers without functions), reloading the library for those that found
// it missing.
func (s *Store) execMulti(ctx context.Context, execs []rueidis.LuaExec) []rueidis.RedisResult {
	if s.scriptMode.Load() {
		return s.script.ExecMulti(ctx, s.client, execs...)
	}
	if !s.libLoaded.Load() {
		if err := s.loadLibrary(ctx); err != nil {
			res := make([]rueidis.RedisResult, len(execs))
			for i := range res {
				res[i] = rueidis.NewErrorResult(err)
			}
			return res
		}
		if s.scriptMode.Load() {
			return s.script.ExecMulti(ctx, s.client, execs...)
		}
	}
	cmds := make(rueidis.Commands, len(execs))
	for i, e := range execs {
		cmds[i] = s.fcall(e.Keys[0], e.Args)
	}
	res := s.client.DoMulti(ctx, cmds...)
	var retry []int
	for i, r := range res {
		if notLoaded(r.Error()) {
			retry = append(retry, i)
		}
	}
	if len(retry) > 0 {
		s.libLoaded.Store(false)
		if err := s.loadLibrary(ctx); err == nil {
			again := make(rueidis.Commands, len(retry))
			for j, i := range retry {
				again[j] = s.fcall(execs[i].Keys[0], execs[i].Args)
			}
			for j, r := range s.client.DoMulti(ctx, again...) {
				res[retry[j]] = s.explainMissing(r)
			}
		}
	}
	return res
}

var scriptSHA = sync.OnceValue(func() string { return sha1hex(Script()) })

func (s *Store) sha() string { return scriptSHA() }

// failed counts and logs a failed call, which started at start (µs) under
// sctx, and feeds its breaker unless the failure is this process's
// starvation (excused, starve.go).
func (s *Store) failed(brk *breaker, err error, sctx context.Context, start int64) {
	s.errs.Add(1)
	if errors.Is(err, context.DeadlineExceeded) {
		s.timeouts.Add(1)
	}
	excused, lag := s.excused(err, sctx, start)
	if excused {
		s.starved.Add(1)
		// not a failure, but calls go through within until Redis answers
		// again: a caller that finds a connection being made again must
		// not wait for it past its deadline (see within)
		brk.troubled.Store(true)
		if s.adapt != nil {
			// its latency is at least this long: a busy host's calls
			// raise the timeout even when none of them comes back in time
			s.adapt.observe(time.Now().UnixMicro() - start)
		}
	} else {
		brk.failure()
	}
	now := time.Now().Unix()
	if last := s.lastLog.Load(); now != last && s.lastLog.CompareAndSwap(last, now) {
		if excused {
			s.opts.Logger.Warn("redisstore: call timed out while this process was starved of CPU; not held against Redis; rules' failure modes decide",
				"lag", lag, "timeouts_excused", s.starved.Load())
			return
		}
		s.opts.Logger.Error("redisstore: call failed; rules' failure modes decide", "err", err,
			"errors", s.errs.Load(), "breaker_open", brk.isOpen())
	}
}

// timeout is the store's timeout now: Options.Timeout, or the adaptive
// timeout (timeout.go).
func (s *Store) timeout() time.Duration {
	if s.adapt != nil {
		return s.adapt.timeout()
	}
	return s.opts.Timeout
}

// degrade decides op by its rules' failure modes.
func (s *Store) degrade(ctx context.Context, now int64, op *floodgate.Op, cause error) floodgate.Decision {
	s.degraded.Add(1)
	d := s.fallback.decide(ctx, now, op)
	d.Degraded = true
	return d
}

// BatchCommand returns the exact Redis command the store sends when it
// decides ops at now together (coalescing; see Command): FCALL of
// BatchFunction, or EVALSHA of BatchScript() on servers without
// functions. It loads the library first.
func (s *Store) BatchCommand(ctx context.Context, now int64, ops []floodgate.Op) ([]string, error) {
	if err := s.loadLibrary(ctx); err != nil {
		return nil, err
	}
	w := &waiter{}
	for i := range ops {
		if ops[i].Policy == nil {
			return nil, errNoPolicy
		}
		pa, o := s.nums(now, &ops[i])
		w.add(s.Key(ops[i].Policy.Name(), ops[i].Key), pa, o)
	}
	keys, args := batchArgs([]*waiter{w}, len(ops))
	head := []string{"FCALL", BatchFunction}
	if s.scriptMode.Load() {
		head = []string{"EVALSHA", sha1hex(BatchScript())}
	}
	cmd := append(head, strconv.Itoa(len(keys)))
	cmd = append(cmd, keys...)
	return append(cmd, args...), nil
}

// Command returns the exact Redis command the store sends for op at now
// (now is ignored unless ClientTime): FCALL of the library's function, or
// EVALSHA of Script() on servers without functions, with its key and
// arguments, for tools that replay it (redis-benchmark, bench/). It loads
// the library first.
func (s *Store) Command(ctx context.Context, now int64, op floodgate.Op) ([]string, error) {
	if err := s.loadLibrary(ctx); err != nil {
		return nil, err
	}
	_, args := s.scriptArgs(now, &op)
	key := s.Key(op.Policy.Name(), op.Key)
	if s.scriptMode.Load() {
		return append([]string{"EVALSHA", s.sha(), "1", key}, args...), nil
	}
	return append([]string{"FCALL", Function, "1", key}, args...), nil
}

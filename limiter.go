// Package floodgate is an exact rate limiter: it caps how many requests a
// key (a user, an IP address, an API key) may make in a time window, by any
// of the classic algorithms, in process memory or in Redis for one limit
// shared by a fleet.
//
// Start with a Policy, one or more Rules applied together (all or nothing),
// and a Limiter that applies it to keys kept in a Store:
//
//	policy := floodgate.MustPolicy("api",
//		floodgate.Rule{Name: "minute", Algorithm: floodgate.SlidingWindow, Limit: 10, Period: time.Minute},
//		floodgate.Rule{Name: "hour", Algorithm: floodgate.SlidingWindow, Limit: 500, Period: time.Hour},
//	)
//	limiter := floodgate.NewLimiter(policy, memstore.MustNew(memstore.Options{}))
//	d, err := limiter.Allow(ctx, "user:241531")
//	if err == nil && !d.Allowed {
//		// refuse: d.RetryAfterSeconds() for Retry-After, d.Rule names the rule
//	}
//
// Limiter.Allow answers one request with a Decision: Allowed, and what to
// tell the client (Limit, Remaining, ResetAfter, RetryAfter, the deciding
// Rule). The other operations: AllowN (a request of cost n; 0 peeks), PeekN,
// Wait and Reserve (wait for capacity), Charge and Refund (count after the
// fact), Reset, SetLimit and SetPolicy (change a live limit, keeping what
// each key consumed), and AllowBatch and AllowAll (several keys in one store
// call; AllowAll all or nothing across them).
//
// Stores: package memstore keeps state in this process; package redisstore
// keeps it in Redis (standalone, Sentinel or Cluster), so that every
// instance enforces one limit, with a failure mode per rule
// (Rule.OnStoreFailure) for when Redis cannot answer. Both implement Store;
// package storekit has what a new store needs of a Policy, and package
// storetest is the suite it must pass.
//
// To limit HTTP or gRPC requests rather than call a Limiter yourself, use
// package httplimit (net/http middleware) or grpclimit (grpc-go
// interceptors), both configured with package gate. The floodgate command
// (cmd/floodgate) runs the same engine as Envoy's rate limit service
// (floodgate serve) and as a rate-limiting reverse proxy (floodgate proxy).
//
// docs/ALGORITHMS.md in the repository defines each algorithm's decisions,
// and docs/ARCHITECTURE.md how the packages fit together.
package floodgate

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/floodgate/floodgate/clock"
)

// Clock is the time source of a Limiter: microseconds since the Unix epoch,
// and a sleep measured on the same clock. Package clock has a coarse system
// clock (the default), a precise one, and a manual one for tests.
type Clock interface {
	// NowMicro returns the time in microseconds since the Unix epoch.
	NowMicro() int64
	// Sleep waits for d on this clock, or returns ctx's error if ctx ends
	// first.
	Sleep(ctx context.Context, d time.Duration) error
}

// An Event is one decision, as an Observer sees it.
type Event struct {
	Policy   *Policy  // the limiter's policy
	Key      string   // the key decided
	Op       OpKind   // what was asked: allow, peek, reserve, charge, refund or reset
	Cost     int64    // the requests (units) asked for
	Decision Decision // the decision returned
	Err      error    // the store's error, if the decision could not be made
}

// An Observer sees every decision a Limiter makes, for metrics and logs. It
// runs on the caller's goroutine and must be quick and safe for concurrent
// use. A Limiter without one pays nothing for it.
type Observer func(Event)

// A Limiter applies a policy to keys held in a store.
// It is safe for concurrent use. Make one with NewLimiter: the zero
// Limiter has neither policy nor store.
type Limiter struct {
	policy  atomic.Pointer[Policy]
	store   Store
	clock   Clock
	observe Observer
}

// An Option configures a Limiter.
type Option func(*Limiter)

// WithClock sets the limiter's clock (default clock.Coarse).
func WithClock(c Clock) Option { return func(l *Limiter) { l.clock = c } }

// WithObserver sets a hook that sees every decision.
func WithObserver(o Observer) Option { return func(l *Limiter) { l.observe = o } }

// NewLimiter returns a limiter applying p to keys kept in s. It panics,
// saying which, when p is nil or was not made by NewPolicy (or MustPolicy,
// or WithLimit), or s is nil: a mistake of the program's, not of its input,
// caught where it is made rather than at the first request.
func NewLimiter(p *Policy, s Store, opts ...Option) *Limiter {
	mustPolicy("NewLimiter", p)
	if s == nil {
		panic("floodgate: NewLimiter: nil store (memstore.New or redisstore.New makes one)")
	}
	l := &Limiter{store: s, clock: clock.Coarse}
	l.policy.Store(p)
	for _, o := range opts {
		o(l)
	}
	return l
}

// Policy returns the limiter's current policy.
func (l *Limiter) Policy() *Policy { return l.policy.Load() }

// Store returns the limiter's store.
func (l *Limiter) Store() Store { return l.store }

// ParamError reports a bad argument to a Limiter call, naming it.
type ParamError struct {
	Field string // the argument: "cost", "out", "items[i].Limiter"
	Msg   string // what is wrong with it
}

// Error returns "floodgate: FIELD: MSG".
func (e *ParamError) Error() string { return "floodgate: " + e.Field + ": " + e.Msg }

func (l *Limiter) do(ctx context.Context, key string, kind OpKind, cost int64, maxDelay time.Duration) (Decision, error) {
	if cost < 0 {
		return Decision{}, &ParamError{Field: "cost", Msg: fmt.Sprintf("must not be negative, got %d", cost)}
	}
	p := l.policy.Load()
	op := Op{Policy: p, Key: key, Kind: kind, Cost: cost, MaxDelay: maxDelay}
	if p.elastic != 0 {
		op.Spare = p.spare()
	}
	if l.observe == nil {
		return l.store.Do(ctx, l.clock.NowMicro(), op)
	}
	return l.exec(ctx, op)
}

// exec performs op on the store at the clock's time, observed.
func (l *Limiter) exec(ctx context.Context, op Op) (Decision, error) {
	d, err := l.store.Do(ctx, l.clock.NowMicro(), op)
	if l.observe != nil {
		l.observe(Event{Policy: op.Policy, Key: op.Key, Op: op.Kind, Cost: op.Cost, Decision: d, Err: err})
	}
	return d, err
}

// Allow reports whether one request for key is admitted now, and consumes
// it if so.
func (l *Limiter) Allow(ctx context.Context, key string) (Decision, error) {
	if p := l.policy.Load(); l.observe == nil && p.elastic == 0 {
		// The hot path, one call deep: every layer a Decision passes
		// through costs a copy.
		return l.store.Do(ctx, l.clock.NowMicro(), Op{Policy: p, Key: key, Kind: OpAllow, Cost: 1})
	}
	return l.do(ctx, key, OpAllow, 1, 0)
}

// AllowN reports whether a request of cost n is admitted now, and consumes
// it if so. A cost of 0 peeks: it reports the key's state, consuming
// nothing.
func (l *Limiter) AllowN(ctx context.Context, key string, n int64) (Decision, error) {
	if n == 0 {
		return l.do(ctx, key, OpPeek, 0, 0)
	}
	if p := l.policy.Load(); l.observe == nil && p.elastic == 0 && n > 0 {
		return l.store.Do(ctx, l.clock.NowMicro(), Op{Policy: p, Key: key, Kind: OpAllow, Cost: n})
	}
	return l.do(ctx, key, OpAllow, n, 0)
}

// PeekN reports whether a request of cost n would be admitted now, without
// consuming anything.
func (l *Limiter) PeekN(ctx context.Context, key string, n int64) (Decision, error) {
	return l.do(ctx, key, OpPeek, n, 0)
}

// Charge records cost n against key after the fact, whether or not it fits
// (each rule's count is clamped at its capacity): count only what failed,
// say. The decision's Allowed reports whether the charge fitted.
func (l *Limiter) Charge(ctx context.Context, key string, n int64) (Decision, error) {
	return l.do(ctx, key, OpCharge, n, 0)
}

// Refund gives back up to n of what key consumed, newest first.
func (l *Limiter) Refund(ctx context.Context, key string, n int64) (Decision, error) {
	return l.do(ctx, key, OpRefund, n, 0)
}

// Reset forgets key: its next request finds a fresh state.
func (l *Limiter) Reset(ctx context.Context, key string) error {
	_, err := l.do(ctx, key, OpReset, 0, 0)
	return err
}

// SetLimit changes the limit of the named rule. Every key keeps what it
// has consumed, in requests, clamped to the new limit.
func (l *Limiter) SetLimit(rule string, limit int64) error {
	for {
		old := l.policy.Load()
		p, err := old.WithLimit(rule, limit)
		if err != nil {
			return err
		}
		if l.policy.CompareAndSwap(old, p) {
			return nil
		}
	}
}

// SetPolicy replaces the limiter's policy. A policy of the same name keeps
// each key's state, rule by rule, matched by rule name. It panics, as
// NewLimiter does, on a nil policy or one not made by NewPolicy.
func (l *Limiter) SetPolicy(p *Policy) {
	mustPolicy("SetPolicy", p)
	l.policy.Store(p)
}

// mustPolicy panics, naming the caller, unless p is a policy NewPolicy
// made (the zero Policy has no rules, and would fail at the first request
// with an index out of range).
func mustPolicy(caller string, p *Policy) {
	if p == nil {
		panic("floodgate: " + caller + ": nil policy (NewPolicy or MustPolicy makes one)")
	}
	if p.c.Width == 0 {
		panic("floodgate: " + caller + ": a zero Policy (NewPolicy or MustPolicy makes one)")
	}
}

// A Reservation is capacity taken now for a request that may proceed after
// Delay. Cancel gives the capacity back.
type Reservation struct {
	Decision
	l    *Limiter
	p    *Policy
	key  string
	cost int64
}

// OK reports whether the reservation was made.
func (r *Reservation) OK() bool { return r.Allowed }

// Cancel gives the reserved capacity back, when the request will not
// proceed after all: the whole cost, whenever it is called (unlike
// golang.org/x/time/rate's Cancel, which gives nothing back once the
// reservation's time has come), and once. Call it only for a request that
// did not proceed.
func (r *Reservation) Cancel(ctx context.Context) error {
	if !r.Allowed || r.cost == 0 {
		return nil
	}
	_, err := r.l.exec(ctx, Op{Policy: r.p, Key: r.key, Kind: OpRefund, Cost: r.cost})
	r.Allowed = false
	return err
}

// budget is how long ctx allows a wait to last.
func budget(ctx context.Context) time.Duration {
	if dl, ok := ctx.Deadline(); ok {
		return max(0, time.Until(dl))
	}
	return math.MaxInt64
}

// Reserve takes capacity for a request of cost n that may proceed after
// the returned Delay, as golang.org/x/time/rate reserves: bucket rules
// (token bucket, GCRA, the leaky-bucket shaper) lend capacity that frees
// within the context's deadline; window rules must admit now. When the
// reservation cannot be made, OK is false and nothing is consumed.
func (l *Limiter) Reserve(ctx context.Context, key string, n int64) (*Reservation, error) {
	d, err := l.do(ctx, key, OpReserve, n, budget(ctx))
	if err != nil {
		return nil, err
	}
	return &Reservation{Decision: d, l: l, p: l.policy.Load(), key: key, cost: n}, nil
}

// ErrDeadline is returned by Wait when the request cannot be admitted
// before the context's deadline; nothing was consumed.
var ErrDeadline = errors.New("floodgate: would wait past the context's deadline")

// Wait blocks until one request for key is admitted.
func (l *Limiter) Wait(ctx context.Context, key string) error {
	_, err := l.WaitN(ctx, key, 1)
	return err
}

// WaitN blocks until a request of cost n for key is admitted. Bucket rules
// reserve future capacity and WaitN sleeps until the reservation's time;
// window rules make it sleep until their retry-after and try again (never
// polling). It returns at once with ErrDeadline, consuming nothing, when
// the context's deadline comes too soon, with ErrCostTooLarge when no wait
// can help, and with the context's error, giving the reservation back,
// when the context ends while it sleeps.
func (l *Limiter) WaitN(ctx context.Context, key string, n int64) (Decision, error) {
	for {
		if err := ctx.Err(); err != nil {
			return Decision{}, err
		}
		p := l.policy.Load()
		maxDelay := budget(ctx)
		op := Op{Policy: p, Key: key, Kind: OpReserve, Cost: n, MaxDelay: maxDelay, Spare: p.spare()}
		if n < 0 {
			return Decision{}, &ParamError{Field: "cost", Msg: fmt.Sprintf("must not be negative, got %d", n)}
		}
		d, err := l.exec(ctx, op)
		switch {
		case err != nil:
			return d, err
		case d.Reason == ReasonCostTooLarge:
			return d, ErrCostTooLarge
		case d.Allowed:
			if err := l.clock.Sleep(ctx, d.Delay); err != nil {
				l.exec(context.WithoutCancel(ctx), Op{Policy: p, Key: key, Kind: OpRefund, Cost: n}) //nolint:errcheck // best effort; the wait's error wins
				return d, err
			}
			return d, nil
		case d.RetryAfter > maxDelay:
			return d, ErrDeadline
		}
		if err := l.clock.Sleep(ctx, d.RetryAfter); err != nil {
			return d, err
		}
	}
}

// An Item is one key of a batch.
type Item struct {
	Limiter *Limiter // the key's limiter; every item's must share one store
	Key     string   // the key, decided under Limiter's policy
	Cost    int64    // 0 peeks
}

// AllowBatch decides several keys (per IP and per user, say) in one store
// call, one round trip for a remote store. Each key's rules are all or
// nothing; keys are decided independently and out[i] is items[i]'s
// decision. All limiters must share one store.
func AllowBatch(ctx context.Context, items []Item, out []Decision) error {
	ops, err := itemOps(items, out)
	if err != nil || len(ops) == 0 {
		return err
	}
	l := items[0].Limiter
	err = l.store.DoBatch(ctx, l.clock.NowMicro(), ops, out)
	observeItems(items, ops, out, err)
	return err
}

// AllowAll decides several keys together, all or nothing: the request is
// admitted (ok) only if every key admits it, and otherwise consumes from
// none. The keys are decided in one store call. On the in-memory store and
// on a Redis store on one server this is atomic: no concurrent request sees
// part of it applied. On a Redis Cluster, whose keys in different slots
// cannot change in one step, it is compensation: what the admitted keys
// consumed is refunded in a second call (see DoGroup). Each key's own
// rules remain all or nothing and exact. out[i] is items[i]'s decision; when
// the whole is denied, a key that would have admitted the request on its
// own says Allowed, with nothing taken from it.
func AllowAll(ctx context.Context, items []Item, out []Decision) (ok bool, err error) {
	ops, err := itemOps(items, out)
	if err != nil || len(ops) == 0 {
		return err == nil, err
	}
	group := make([]bool, len(ops))
	for i := range group {
		group[i] = true
	}
	l := items[0].Limiter
	ok, err = DoGroup(ctx, l.store, l.clock.NowMicro(), ops, group, out)
	observeItems(items, ops, out, err)
	return ok && err == nil, err
}

// itemOps checks items and returns their operations.
func itemOps(items []Item, out []Decision) ([]Op, error) {
	if len(out) < len(items) {
		return nil, &ParamError{Field: "out", Msg: "shorter than items"}
	}
	if len(items) == 0 {
		return nil, nil
	}
	store := items[0].Limiter.store
	ops := make([]Op, len(items))
	for i, it := range items {
		if it.Limiter.store != store {
			return nil, &ParamError{Field: fmt.Sprintf("items[%d].Limiter", i), Msg: "uses a different store from items[0]"}
		}
		if it.Cost < 0 {
			return nil, &ParamError{Field: fmt.Sprintf("items[%d].Cost", i), Msg: fmt.Sprintf("must not be negative, got %d", it.Cost)}
		}
		p := it.Limiter.policy.Load()
		kind := OpAllow
		if it.Cost == 0 {
			kind = OpPeek
		}
		ops[i] = Op{Policy: p, Key: it.Key, Kind: kind, Cost: it.Cost, Spare: p.spare()}
	}
	return ops, nil
}

// observeItems reports each item's decision to its limiter's observer.
func observeItems(items []Item, ops []Op, out []Decision, err error) {
	for i, it := range items {
		if it.Limiter.observe != nil {
			it.Limiter.observe(Event{Policy: ops[i].Policy, Key: it.Key, Op: ops[i].Kind, Cost: it.Cost, Decision: out[i], Err: err})
		}
	}
}

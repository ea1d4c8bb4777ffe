package capacity

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/floodgate/floodgate"
)

// Mode is what a client does with a resource when it holds no unexpired
// lease on it: no server could be reached before its lease expired, or it
// has not had one yet.
type Mode string

// Modes.
const (
	// Safe uses the safe capacity of the last lease: the resource's
	// configured safe capacity, or its capacity divided by the number of
	// clients, as the server computed it. Before the first lease it uses
	// Options.SafeCapacity. The default ("" too).
	Safe Mode = "safe"
	// Pessimistic uses nothing: capacity 0. For batch work that can wait.
	Pessimistic Mode = "pessimistic"
	// Optimistic uses what the client wants, for work that must go on and
	// whose resource is protected against overload by other means.
	Optimistic Mode = "optimistic"
)

// Options configure one resource of a Client.
type Options struct {
	// Wants is the capacity the client would use if it could, in the
	// resource's units (per second for a rate). Not negative.
	Wants float64
	// Priority: a higher band is served before a lower one.
	Priority int64
	// Mode is what the client uses when it holds no unexpired lease
	// (default Safe).
	Mode Mode
	// SafeCapacity is the safe mode's capacity until a lease brings the
	// server's. Default 0: nothing before the first lease.
	SafeCapacity float64
}

// A Lease is a capacity granted until Expiry, to be renewed every Refresh.
type Lease struct {
	Capacity float64       // what the client may use
	Expiry   time.Time     // when the lease ends
	Refresh  time.Duration // how often to ask again
	Safe     float64       // the safe mode's capacity
}

// rating is a Resource's current capacity, the policy enforcing it, and
// until when it holds (the lease's expiry, after which the mode applies).
type rating struct {
	capacity float64
	until    int64 // µs; math.MaxInt64: until something changes
	leased   bool  // from an unexpired lease, not from the mode
	policy   *floodgate.Policy
	burst    int64
}

// A Resource is one resource's lease as application code sees it: its
// capacity now, its wants, and a limiter enforcing the capacity. Its
// methods are safe for concurrent use. Client.Resource makes one.
type Resource struct {
	c    *Client
	id   string
	mode Mode
	prio int64
	name string // the policy's name: the client's and the resource's
	lim  *floodgate.Limiter

	cur atomic.Pointer[rating]

	// decisions counted (Stats): refused under a lease; under the mode,
	// [0] allowed and [1] refused
	leasedRefused atomic.Uint64
	fallback      [2]atomic.Uint64

	mu      sync.Mutex // guards what follows, and re-rating
	wants   float64
	sent    float64 // the wants of the last successful refresh
	lease   Lease
	has     bool          // lease is set
	safe    float64       // the safe mode's capacity before a lease
	changed chan struct{} // closed and replaced at each re-rating
}

// errWants reports a bad Wants.
func checkWants(w float64) error {
	if w < 0 || math.IsNaN(w) || math.IsInf(w, 0) {
		return fmt.Errorf("capacity: wants must be a finite number >= 0, got %v", w)
	}
	return nil
}

func checkOptions(id string, o Options) error {
	if id == "" {
		return errors.New("capacity: resource id: must not be empty")
	}
	if err := checkWants(o.Wants); err != nil {
		return fmt.Errorf("capacity: resource %q: %w", id, err)
	}
	switch o.Mode {
	case "", Safe, Pessimistic, Optimistic:
	default:
		return fmt.Errorf("capacity: resource %q: mode: %q is not safe, pessimistic or optimistic", id, o.Mode)
	}
	if o.SafeCapacity < 0 || math.IsNaN(o.SafeCapacity) || math.IsInf(o.SafeCapacity, 0) {
		return fmt.Errorf("capacity: resource %q: safe capacity must be a finite number >= 0, got %v", id, o.SafeCapacity)
	}
	return nil
}

// ID returns the resource's id.
func (r *Resource) ID() string { return r.id }

// Limiter returns the floodgate.Limiter enforcing the capacity, for the
// engine's other operations (AllowN, Reserve, Refund...). Its policy is
// replaced at each new lease; use the resource's ID as the key. Prefer
// the Resource's own Allow, AllowN and Wait: they also refuse everything
// while the capacity is 0, which the limiter alone cannot express.
func (r *Resource) Limiter() *floodgate.Limiter { return r.lim }

// Capacity returns the capacity the client may use now: its unexpired
// lease's, or else what its mode gives.
func (r *Resource) Capacity() float64 { return r.rating(r.c.clock.NowMicro()).capacity }

// Leased reports whether the capacity comes from an unexpired lease rather
// than from the mode.
func (r *Resource) Leased() bool { return r.rating(r.c.clock.NowMicro()).leased }

// Lease returns the last lease the servers gave, and whether there was one
// (it may have expired).
func (r *Resource) Lease() (Lease, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lease, r.has
}

// Wants returns what the client wants.
func (r *Resource) Wants() float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.wants
}

// SetWants changes what the client wants. The servers hear of it at the
// next refresh, or at once (within the client's MinInterval) when it
// differs from what they last heard by more than the client's WantsChange.
// In optimistic mode without a lease, the capacity follows at once.
func (r *Resource) SetWants(w float64) error {
	if err := checkWants(w); err != nil {
		return fmt.Errorf("capacity: resource %q: %w", r.id, err)
	}
	r.mu.Lock()
	r.wants = w
	far := bigChange(r.sent, w, r.c.opts.WantsChange)
	r.rerate(r.c.clock.NowMicro())
	r.mu.Unlock()
	if far {
		r.c.wake(false)
	}
	return nil
}

// bigChange reports whether wants moved from sent by more than the
// fraction frac of the larger.
func bigChange(sent, wants, frac float64) bool {
	return math.Abs(wants-sent) > frac*max(sent, wants)
}

// rating returns the rating at now, re-rating first if its lease expired.
func (r *Resource) rating(now int64) *rating {
	rt := r.cur.Load()
	if now < rt.until {
		return rt
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rerate(now)
}

// setLease takes a new lease from the servers and re-rates.
func (r *Resource) setLease(l Lease, sent float64, now int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lease, r.has, r.sent = l, true, sent
	r.rerate(now)
}

// request returns what a refresh asks for this resource: its wants and its
// lease if unexpired.
func (r *Resource) request(now int64) (wants float64, has Lease, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.has && now < r.lease.Expiry.UnixMicro() {
		return r.wants, r.lease, true
	}
	return r.wants, Lease{}, false
}

// target returns the capacity at now, until when it holds, and whether it
// comes from a lease. r.mu is held.
func (r *Resource) target(now int64) (float64, int64, bool) {
	if r.has {
		if exp := r.lease.Expiry.UnixMicro(); now < exp {
			return r.lease.Capacity, exp, true
		}
	}
	switch r.mode {
	case Pessimistic:
		return 0, math.MaxInt64, false
	case Optimistic:
		return r.wants, math.MaxInt64, false
	}
	if r.has {
		return r.lease.Safe, math.MaxInt64, false
	}
	return r.safe, math.MaxInt64, false
}

// rerate sets the rating for now, replacing the limiter's policy when the
// capacity changed. The limiter keeps what the bucket consumed. r.mu is
// held.
func (r *Resource) rerate(now int64) *rating {
	capa, until, leased := r.target(now)
	old := r.cur.Load()
	if old != nil && old.capacity == capa {
		if old.until != until || old.leased != leased {
			nr := *old
			nr.until, nr.leased = until, leased
			r.cur.Store(&nr)
			return &nr
		}
		return old
	}
	nr := &rating{capacity: capa, until: until, leased: leased}
	nr.policy, nr.burst = r.policyFor(capa, old)
	if old == nil {
		r.lim = floodgate.NewLimiter(nr.policy, r.c.store, floodgate.WithClock(r.c.clock))
	} else {
		r.lim.SetPolicy(nr.policy)
		// Convert the bucket now, at the change, not at the next request:
		// until then it would refill at the old rate (and at capacity 0
		// no request asks it).
		_, _ = r.lim.AllowN(context.Background(), r.id, 0)
	}
	r.cur.Store(nr)
	close(r.changed)
	r.changed = make(chan struct{})
	return nr
}

// Units: a rule's Limit is an integer, so a capacity of c per second is
// rated as round(c×rateScale) per rateScale seconds: a thousandth of a
// request per second is the finest rate.
const (
	rateScale  = 1000
	ratePeriod = rateScale * time.Second
	// frozenRefill is how long a bucket at capacity 0 takes to refill
	// (about 35 years), so that it keeps what it consumed while it gets
	// nothing (Allow refuses at capacity 0 before asking the bucket).
	frozenRefill = 1 << 50 // µs
	// MaxCapacity is the largest capacity a limiter enforces; a larger
	// lease is enforced at it.
	MaxCapacity = 1e12
)

// policyFor returns the token bucket of capacity capa: refilling capa per
// second, holding capa × the client's Burst (at least one request). A
// capacity of 0 keeps the previous bucket's size and all but stops its
// refill.
func (r *Resource) policyFor(capa float64, old *rating) (*floodgate.Policy, int64) {
	rule := floodgate.Rule{Name: "capacity", Algorithm: floodgate.TokenBucket}
	if capa > 0 {
		capa = min(capa, MaxCapacity)
		rule.Limit = max(1, int64(math.Round(capa*rateScale)))
		rule.Period = ratePeriod
		rule.Burst = max(1, int64(math.Ceil(capa*r.c.opts.Burst.Seconds())))
	} else {
		rule.Limit, rule.Burst = 1, 1
		if old != nil {
			rule.Burst = old.burst
		}
		rule.Period = time.Duration(max(1, frozenRefill/rule.Burst)) * time.Microsecond
	}
	return floodgate.MustPolicy(r.name, rule), rule.Burst
}

// refused is the decision while the capacity is 0.
func (r *Resource) refused() floodgate.Decision {
	d := floodgate.Decision{Rule: "capacity", Reason: floodgate.ReasonLimited}
	if next := r.c.nextRefresh.Load(); next > 0 {
		d.RetryAfter = time.Duration(max(0, next-r.c.clock.NowMicro())) * time.Microsecond
	}
	return d
}

// Counts are a Resource's decisions (Allow, AllowN with n > 0, Wait) under
// its mode.
type Counts struct {
	Allowed uint64 // decisions that admitted
	Refused uint64 // decisions that refused
}

// Stats are a Resource's decisions since it was made, by where the
// capacity they were decided under came from: an unexpired lease, or the
// resource's Mode (no lease yet, or the servers unreachable past the
// lease's expiry). Fallback.Refused is what the mode refused: all of a
// pessimistic resource's requests while it is cut off. Admissions under a
// lease, the hot path, are not counted (a counter there would cost Allow
// a tenth of its time).
type Stats struct {
	Mode          Mode   // the resource's mode
	LeasedRefused uint64 // refused under a lease
	Fallback      Counts // decided under the mode
}

// Stats returns the resource's decision counts.
func (r *Resource) Stats() Stats {
	return Stats{Mode: r.mode, LeasedRefused: r.leasedRefused.Load(),
		Fallback: Counts{Allowed: r.fallback[0].Load(), Refused: r.fallback[1].Load()}}
}

// count records a decision made under rt.
func (r *Resource) count(rt *rating, d floodgate.Decision, err error) {
	switch {
	case err != nil || rt.leased && d.Allowed:
	case rt.leased:
		r.leasedRefused.Add(1)
	case d.Allowed:
		r.fallback[0].Add(1)
	default:
		r.fallback[1].Add(1)
	}
}

// Allow reports whether one unit (one request) of the resource may be used
// now, and consumes it if so: the engine's token bucket at the current
// capacity, refusing everything at capacity 0.
func (r *Resource) Allow(ctx context.Context) (floodgate.Decision, error) {
	now := r.c.clock.NowMicro()
	rt := r.cur.Load()
	if now >= rt.until {
		rt = r.rating(now)
	}
	if rt.capacity <= 0 {
		d := r.refused()
		r.count(rt, d, nil)
		return d, nil
	}
	// The engine's Allow, on the time already read: the limiter's policy
	// is rt's (set together under r.mu).
	d, err := r.c.store.Do(ctx, now, floodgate.Op{Policy: rt.policy, Key: r.id, Kind: floodgate.OpAllow, Cost: 1})
	if !d.Allowed || !rt.leased {
		r.count(rt, d, err)
	}
	return d, err
}

// AllowN is Allow for n units; n = 0 peeks.
func (r *Resource) AllowN(ctx context.Context, n int64) (floodgate.Decision, error) {
	rt := r.rating(r.c.clock.NowMicro())
	if n == 0 {
		return r.lim.AllowN(ctx, r.id, 0)
	}
	if rt.capacity <= 0 {
		d := r.refused()
		r.count(rt, d, nil)
		return d, nil
	}
	d, err := r.lim.AllowN(ctx, r.id, n)
	r.count(rt, d, err)
	return d, err
}

// Wait blocks until one unit may be used (see WaitN).
func (r *Resource) Wait(ctx context.Context) error {
	_, err := r.WaitN(ctx, 1)
	return err
}

// WaitN blocks until n units may be used and consumes them, or ctx ends.
// At capacity 0 it waits for the capacity to change; otherwise it waits on
// the token bucket as floodgate.Limiter.WaitN does (a wait begun under one
// rate ends under it).
func (r *Resource) WaitN(ctx context.Context, n int64) (floodgate.Decision, error) {
	for {
		now := r.c.clock.NowMicro()
		// The rating and the channel its change closes, read together.
		r.mu.Lock()
		rt := r.cur.Load()
		if now >= rt.until {
			rt = r.rerate(now)
		}
		ch := r.changed
		r.mu.Unlock()
		if rt.capacity > 0 {
			d, err := r.lim.WaitN(ctx, r.id, n)
			r.count(rt, d, err)
			return d, err
		}
		if rt.until == math.MaxInt64 {
			select {
			case <-ch:
			case <-ctx.Done():
				return r.refused(), ctx.Err()
			}
			continue
		}
		if err := r.sleepOrChange(ctx, ch, time.Duration(rt.until-now)*time.Microsecond); err != nil {
			return r.refused(), err
		}
	}
}

// sleepOrChange sleeps d on the client's clock, returning early when ch
// closes.
func (r *Resource) sleepOrChange(ctx context.Context, ch <-chan struct{}, d time.Duration) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-ch:
			cancel()
		case <-sctx.Done():
		}
	}()
	err := r.c.clock.Sleep(sctx, d)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	_ = err // woken by a change
	return nil
}

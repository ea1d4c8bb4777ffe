package redisstore

import (
	"context"
	"errors"
	"time"
)

// sharedDeadline is the call deadline shared by every call that starts in
// one millisecond: one timer a millisecond instead of one a call.
type sharedDeadline struct {
	ms     int64
	ctx    context.Context
	cancel context.CancelFunc // never called: the deadline's timer releases ctx
}

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

// timeout is the store's timeout now: Options.Timeout, or the adaptive
// timeout (timeout.go).
func (s *Store) timeout() time.Duration {
	if s.adapt != nil {
		return s.adapt.timeout()
	}
	return s.opts.Timeout
}

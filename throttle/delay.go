package throttle

import (
	"context"
	"errors"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/clock"
)

// Suspend gives back the slot of an admitted ticket whose request must
// wait out a delay before it runs (a gate's Delay action, a limiter's
// Wait), so that requests in their delay hold neither a slot nor queued
// cost: no completion is counted (as Release), and the next queued
// request is admitted in its place. Resume enters it again when the delay
// ends; Done or Release end a suspended ticket that will not run (its
// client left during the delay). Suspend reports whether it gave a slot
// back: false for a ticket that is not admitted (nothing to resume).
func (tk *Ticket) Suspend() bool {
	t := tk.th
	now := t.clock.NowMicro()
	t.mu.Lock()
	defer t.mu.Unlock()
	if tk.state != admitted {
		return false
	}
	tk.state = suspended
	t.inflight--
	t.stats.suspended.Add(1)
	t.dispatch(now)
	t.ensurePacer()
	t.changed()
	return true
}

// Resume enters a suspended ticket into the throttler again, when its
// delay has ended, as a new arrival of the same route, level and
// deadline (the one given to Enter or Admit; MaxWait counts from now):
// admitted at once if there is room, queued (call Wait, as after Enter),
// or refused with ErrQueueFull. Its admission is counted in
// Stats.Readmitted, not Admitted, so that each request is admitted once;
// a refusal, eviction, expiry or withdrawal is counted as any arrival's:
// the request is shed. Then the caller gives back what the delay
// reserved, so that a shed request spends no quota. A ticket Resume or
// Wait failed is finished (Recycle takes it). Resume on a ticket that is
// not suspended returns ErrNotSuspended and changes nothing.
func (tk *Ticket) Resume() error {
	t := tk.th
	t.mu.Lock()
	if tk.state != suspended {
		t.mu.Unlock()
		return ErrNotSuspended
	}
	tk.state, tk.again, tk.ready, tk.predicted = waiting, true, nil, 0
	t.mu.Unlock()
	if _, err := t.enter(tk, tk.key, tk.crit, tk.given); err != nil {
		t.mu.Lock()
		tk.state = finished
		t.mu.Unlock()
		return err
	}
	return nil
}

// ErrNotSuspended is Resume's error for a ticket Suspend did not suspend
// (a mistake of the caller's).
var ErrNotSuspended = errNotSuspended{}

type errNotSuspended struct{}

func (errNotSuspended) Error() string { return "throttle: Resume of a ticket that is not suspended" }

// IsShed reports whether err is one the throttler sheds a request with
// (ErrQueueFull, ErrEvicted, ErrExpired): the server is out of room, 503
// or UNAVAILABLE, not the client's quota.
func IsShed(err error) bool {
	return errors.Is(err, ErrQueueFull) || errors.Is(err, ErrEvicted) || errors.Is(err, ErrExpired)
}

// Context returns parent carrying tk, the request's admission, for a
// DelayClock: a delay the request waits out on that clock, with this
// context, gives tk's slot back while it lasts. It allocates nothing: the
// context lives in the ticket and must not be used once the ticket is
// recycled.
func (tk *Ticket) Context(parent context.Context) context.Context {
	tk.dctx = ticketCtx{Context: parent, tk: tk}
	return &tk.dctx
}

// ticketCtx is Ticket.Context's: parent, and the ticket for ticketKey.
type ticketCtx struct {
	context.Context
	tk *Ticket
}

type ticketKey struct{}

// Value implements context.Context.
func (c *ticketCtx) Value(key any) any {
	if _, ok := key.(ticketKey); ok {
		return c.tk
	}
	return c.Context.Value(key)
}

// DelayClock returns base's time (clock.Coarse if base is nil) with a
// Sleep that, for a context carrying an admitted ticket (Ticket.Context),
// suspends the ticket for the sleep and resumes it after (Suspend,
// Resume, then Wait with the same context if it is queued). It is the
// clock to give a gate whose requests are admitted through a Throttler
// first (httplimit and grpclimit give it theirs): a request the gate
// delays holds no slot while it waits, and when the delay ends it is
// admitted again like any arrival, or shed. Sleep's error is then the
// throttler's (IsShed), or ctx's if the client left while it waited its
// turn: the gate gives back what the delay reserved, as when the client
// leaves during the delay, and the request is answered as shed.
func DelayClock(base floodgate.Clock) floodgate.Clock {
	if base == nil {
		base = clock.Coarse
	}
	if d, ok := base.(delayClock); ok {
		return d
	}
	return delayClock{base}
}

type delayClock struct{ base floodgate.Clock }

// NowMicro is base's.
func (c delayClock) NowMicro() int64 { return c.base.NowMicro() }

// Sleep is base's, with the request's ticket suspended meanwhile.
func (c delayClock) Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return c.base.Sleep(ctx, d)
	}
	tk, _ := ctx.Value(ticketKey{}).(*Ticket)
	if tk == nil || !tk.Suspend() {
		return c.base.Sleep(ctx, d)
	}
	if err := c.base.Sleep(ctx, d); err != nil {
		return err // the ticket stays suspended: the caller's Done or Release ends it
	}
	if err := tk.Resume(); err != nil {
		return err
	}
	return tk.Wait(ctx)
}

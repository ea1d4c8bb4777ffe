package throttle

import (
	"context"
	"net/http"
	"strconv"
	"time"
)

// Release gives back the slot of an admitted ticket whose request was
// not run after all (a quota refused it once admitted, or its body
// failed before it was sent), without a completion: no cost enters the
// model and no latency the adaptive limit, as Done's would. The next
// queued request is admitted in its place. Release of a suspended
// ticket (Suspend) ends it, with no slot to give back; after Done, twice,
// or on a ticket never admitted it does nothing.
func (tk *Ticket) Release() {
	t := tk.th
	now := t.clock.NowMicro()
	t.mu.Lock()
	defer t.mu.Unlock()
	if tk.state == suspended {
		tk.state = finished // it holds no slot: its delay gave it back
		return
	}
	if tk.state != admitted {
		return
	}
	tk.state = finished
	t.inflight--
	t.dispatch(now)
	t.ensurePacer()
	t.changed()
}

// Admit enters a request of route key and level crit (deadline as
// Enter's) and, if it is queued, waits for its turn while ctx lasts. It
// returns an admitted ticket (run the request, then Done or Release), or
// why the request was shed: ErrQueueFull, ErrEvicted, ErrExpired, or
// ctx's error (the ticket left the queue).
//
// The ticket comes from a pool: once it is finished (Done, DoneCost,
// Release, or Serve returned), Recycle gives it back.
func (t *Throttler) Admit(ctx context.Context, key RouteKey, crit Criticality, deadline int64) (*Ticket, error) {
	if !crit.Valid() {
		crit = DefaultCriticality
	}
	tk := ticketPool.Get().(*Ticket)
	*tk = Ticket{}
	if _, err := t.enter(tk, key, crit, deadline); err != nil {
		ticketPool.Put(tk) // refused: nothing refers to it
		return nil, err
	}
	if err := tk.Wait(ctx); err != nil {
		ticketPool.Put(tk) // out of the queue: nothing refers to it
		return nil, err
	}
	return tk, nil
}

// Recycle puts a finished ticket from Admit back in its pool; the caller
// must not use it afterwards (nor its Context). An unfinished ticket is
// not recycled (it would still hold its slot, or its place in the queue,
// or be resumed); one shed by Resume or the Wait after it is finished.
func (tk *Ticket) Recycle() {
	tk.th.mu.Lock()
	done := tk.state == finished || tk.state == evicted || tk.state == expired || tk.state == withdrawn
	tk.th.mu.Unlock()
	if done {
		ticketPool.Put(tk)
	}
}

// WriteShed answers a request shed with err (from Enter, Wait or Admit)
// as the middleware does: 503 Service Unavailable, Retry-After (retry
// rounded up to whole seconds, at least 1), Cache-Control: no-store, and
// a problem-details body when the client accepts application/problem+json,
// else a line of text.
func WriteShed(w http.ResponseWriter, r *http.Request, crit Criticality, err error, retry time.Duration) {
	secs := max(1, int64((retry+time.Second-1)/time.Second))
	writeShed(w, r, crit, err, []string{strconv.FormatInt(secs, 10)})
}

// Claim returns the level of a request whose header (or gRPC metadata)
// values are values, as FromValues reads them (the first four; the
// first that names a level), against ceiling, the level its route or
// client is allowed (DefaultCriticality when nothing sets one): with no
// level claimed, ceiling; from a trusted source (a proxy of yours that
// sets the header), the claimed level as it is; otherwise the claimed
// level capped at ceiling, so a client can lower its level and never
// raise it.
func Claim(values []string, ceiling Criticality, trusted bool) Criticality {
	if !ceiling.Valid() {
		ceiling = DefaultCriticality
	}
	for i, v := range values {
		if i == 4 {
			break
		}
		if c, ok := ParseCriticality(v); ok {
			if trusted {
				return c
			}
			return min(c, ceiling)
		}
	}
	return ceiling
}

// Serve runs next for a request admitted with tk and ends the ticket when
// it returns (or panics): with threadCPU (Linux), its cost is the
// handler's CPU time as MiddlewareOptions.ThreadCPU measures it, else
// Done's estimate. The request's level goes into its context when it is
// not DefaultCriticality and the context does not carry it already (Stamp
// does the rest of what the middleware does).
func (tk *Ticket) Serve(w http.ResponseWriter, r *http.Request, next http.Handler, threadCPU bool) {
	if tk.crit != DefaultCriticality {
		if c, ok := FromContext(r.Context()); !ok || c != tk.crit {
			r = r.WithContext(WithCriticality(r.Context(), tk.crit))
		}
	}
	if threadCPU && threadCPUSupported {
		runThreadCPU(tk, w, r, next)
		return
	}
	defer tk.Done()
	next.ServeHTTP(w, r)
}

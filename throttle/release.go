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
// queued request is admitted in its place. Release after Done, twice, or
// on a ticket never admitted does nothing.
func (tk *Ticket) Release() {
	t := tk.th
	now := t.clock.NowMicro()
	t.mu.Lock()
	defer t.mu.Unlock()
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
func (t *Throttler) Admit(ctx context.Context, key RouteKey, crit Criticality, deadline int64) (*Ticket, error) {
	tk, err := t.Enter(key, crit, deadline)
	if err != nil || tk.ready == nil {
		return tk, err
	}
	if err := tk.Wait(ctx); err != nil {
		return nil, err
	}
	return tk, nil
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

// Capped returns the level a request claims (claimed, from a header or
// metadata it sets itself) limited to ceiling, the most its route or
// client is allowed: a client may lower its level, never raise it.
func Capped(claimed, ceiling Criticality) Criticality {
	if !claimed.Valid() {
		return ceiling
	}
	return min(claimed, ceiling)
}

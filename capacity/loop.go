package capacity

import (
	"context"
	"time"
)

// run is the background refresh: it sleeps on the client's clock until the
// next refresh is due (the shortest refresh interval of the last answer,
// less a jitter), or a retry after a failure (with backoff), or a wake-up
// (a new resource, wants that changed a lot), and refreshes; until Close.
func (c *Client) run() {
	defer close(c.done)
	failures := 0
	for c.sleep(failures) {
		err := c.Refresh(c.ctx)
		c.attempts.Add(1)
		if err != nil && c.ctx.Err() == nil {
			c.scheduleRetry(failures + 1)
		}
		c.mu.Lock()
		c.signal()
		c.mu.Unlock()
		if c.ctx.Err() != nil {
			return
		}
		if err == nil {
			failures = 0
			continue
		}
		failures++
		c.opts.Logger.Warn("capacity: refresh failed; the leases run on until they expire, then the resources' modes apply",
			"client", c.opts.ID, "failures", failures, "err", err)
	}
}

// scheduleRetry sets the next refresh after the failures-th failure in a
// row: Backoff doubled at each failure up to MaxBackoff, less a jitter.
func (c *Client) scheduleRetry(failures int) {
	b := c.opts.MaxBackoff
	if shift := failures - 1; shift < 30 && c.opts.Backoff<<shift < b {
		b = c.opts.Backoff << shift
	}
	c.mu.Lock()
	b -= time.Duration(c.rng.Float64() * c.opts.Jitter * float64(b))
	c.mu.Unlock()
	c.nextRefresh.Store(c.clock.NowMicro() + b.Microseconds())
}

// sleep waits until a refresh is due, and reports false when the client
// closes.
func (c *Client) sleep(failures int) bool {
	for {
		c.mu.Lock()
		d, forever := c.due(failures)
		if d <= 0 && !forever {
			c.mu.Unlock()
			return c.ctx.Err() == nil
		}
		sctx, cancel := context.WithCancel(c.ctx)
		c.wakeSleep = cancel
		c.signal()
		c.mu.Unlock()
		var err error
		if forever {
			<-sctx.Done()
			err = sctx.Err()
		} else {
			err = c.clock.Sleep(sctx, d)
		}
		c.mu.Lock()
		c.wakeSleep = nil
		c.mu.Unlock()
		cancel()
		switch {
		case c.ctx.Err() != nil:
			return false
		case err == nil:
			return true
		}
		// Woken: work out the time again.
	}
}

// due returns how long until the next refresh, or forever when there is
// nothing to refresh. It consumes a wake-up. c.mu is held.
func (c *Client) due(failures int) (time.Duration, bool) {
	if len(c.order) == 0 {
		c.woken, c.urgent = false, false
		return 0, true
	}
	now := c.clock.NowMicro()
	at := now
	if c.last != 0 || failures > 0 {
		at = c.nextRefresh.Load()
	}
	if c.woken && failures > 0 && !c.urgent {
		// Wants that changed while no server answers wait for the
		// backoff, however often they change.
		c.woken = false
	}
	if c.woken {
		early := now
		if !c.urgent && c.last != 0 {
			early = max(now, c.last+c.opts.MinInterval.Microseconds())
		}
		at = min(at, early)
		c.woken, c.urgent = false, false
	}
	return time.Duration(at-now) * time.Microsecond, false
}

// wake brings the next refresh forward: to now when urgent, else to
// MinInterval after the last.
func (c *Client) wake(urgent bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.woken = true
	c.urgent = c.urgent || urgent
	if c.wakeSleep != nil {
		c.wakeSleep()
	}
}

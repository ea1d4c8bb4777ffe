package service

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/floodgate/floodgate"
)

// Hysteresis gives a readiness check hysteresis: the answer turns from
// ready to unready only after the check has failed on every sample for
// UnreadyAfter, and back only after it has passed on every sample for
// ReadyAfter. A store whose breaker flaps (open for its cooldown, closed
// by a probe, open again), or a busy host's late PINGs, then no longer
// flap readiness, which took a healthy instance out of its load
// balancer's rotation and put it back hundreds of times an hour; an
// instance whose store is really gone still turns unready, UnreadyAfter
// later. The first sample sets the answer as it is (at start, an instance
// whose store is down is unready at once).
//
// Samples are taken by Check (each GET /readyz) and by Run, in the
// background, so that "every sample" means what happened between sparse
// probes too.
type Hysteresis struct {
	check        Readiness
	clk          floodgate.Clock
	unreadyAfter time.Duration
	readyAfter   time.Duration

	mu      sync.Mutex
	started bool
	ready   bool
	since   int64 // µs: the first sample of the run that disagrees with ready; -1 none
	changes int64
}

// NewHysteresis returns check with hysteresis: unready after unreadyAfter
// of failed samples, ready again after readyAfter of passed ones (0: at
// the first), on the clock clk (clock.Precise; a test's manual clock).
func NewHysteresis(check Readiness, clk floodgate.Clock, unreadyAfter, readyAfter time.Duration) *Hysteresis {
	return &Hysteresis{check: check, clk: clk, unreadyAfter: unreadyAfter, readyAfter: readyAfter, since: -1}
}

// Check samples the check and returns the answer with hysteresis, and
// why: the check's own reason, and, while the check disagrees with the
// answer, for how long it has.
func (h *Hysteresis) Check() (bool, string) {
	ok, why := h.check()
	return h.observe(h.clk.NowMicro(), ok, why)
}

// Readiness returns Check as a Readiness.
func (h *Hysteresis) Readiness() Readiness { return h.Check }

// Changes returns how many times the answer has changed since the first
// sample.
func (h *Hysteresis) Changes() int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.changes
}

// Run samples the check every interval until ctx ends.
func (h *Hysteresis) Run(ctx context.Context, every time.Duration) {
	for {
		h.Check()
		if h.clk.Sleep(ctx, every) != nil {
			return
		}
	}
}

// observe takes a sample (ok, why) at now (µs) and returns the answer.
func (h *Hysteresis) observe(now int64, ok bool, why string) (bool, string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.started {
		h.started, h.ready = true, ok
		return ok, why
	}
	if ok == h.ready {
		h.since = -1
		return ok, why
	}
	if h.since < 0 {
		h.since = now
	}
	held := time.Duration(now-h.since) * time.Microsecond
	need := h.unreadyAfter
	if !h.ready {
		need = h.readyAfter
	}
	if held >= need {
		h.ready, h.since = ok, -1
		h.changes++
		return ok, why
	}
	if h.ready {
		return true, fmt.Sprintf("ready: failing for %v, unready if it goes on for %v: %s", held.Round(time.Millisecond), need, why)
	}
	return false, fmt.Sprintf("not ready: passing for %v, ready when it has for %v: %s", held.Round(time.Millisecond), need, why)
}

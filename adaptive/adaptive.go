// Package adaptive is client-side adaptive throttling, as the Google SRE
// book describes it: a client that sees its backend refuse requests drops
// a share of its own requests locally, before they cost the backend
// anything, with probability
//
//	max(0, (requests − K·accepts) / (requests + 1))
//
// where requests are the requests the client tried and accepts those the
// backend accepted, both over a sliding window, per target (backend). K
// (2 by default) is how many requests the client sends per one the
// backend accepts before it backs off: while the backend accepts half or
// more, nothing is dropped. It recovers by itself: while the backend
// accepts what is sent, each window lets through about K times what the
// last one did.
//
// A retry budget bounds retries: within the window, retries are at most a
// fraction of the requests (plus a few), as gRPC's retry throttling and
// Finagle's RetryBudget do, so retries cannot multiply an overload.
//
// Transport (an http.RoundTripper) and UnaryClientInterceptor apply both.
package adaptive

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/clock"
)

// ErrThrottled is the error of a request dropped locally.
var ErrThrottled = errors.New("adaptive: request dropped locally: the backend has been refusing requests")

// Options configure a Throttle.
type Options struct {
	// K is how many requests the client sends per request the backend
	// accepts before it drops any (at least 1); 0 means 2. Lower is more
	// aggressive.
	K float64
	// Window is the sliding window the counts are kept over; 0 means 2
	// minutes, as the SRE book does. It moves in Window/Buckets steps.
	Window time.Duration
	// Buckets is how many steps the window moves in; 0 means 20.
	Buckets int
	// RetryRatio is the retry budget: retries in the window are at most
	// RetryRatio times the first attempts in it, plus MinRetries. 0 means
	// 0.1; a negative value allows no retries.
	RetryRatio float64
	// MinRetries is the retries allowed in a window whatever the traffic
	// (so a quiet client can still retry); 0 means 10, negative none.
	MinRetries int
	// MaxTargets bounds the targets tracked; past it one is forgotten to
	// make room. 0 means 10000.
	MaxTargets int
	// Clock is the time source; nil means the system clock.
	Clock floodgate.Clock
	// Rand returns a uniform number in [0, 1) for the drop decisions; it
	// is called concurrently for distinct targets, so it must be safe for
	// concurrent use (a *rand.Rand is not). nil means math/rand/v2's
	// Float64.
	Rand func() float64
}

// A Throttle keeps the counts of each target. It is safe for concurrent
// use.
type Throttle struct {
	o      Options
	bucket int64 // microseconds per bucket

	mu      sync.Mutex
	targets map[string]*target
}

// target is one backend's window: a ring of buckets.
type target struct {
	mu      sync.Mutex
	buckets []counts
	head    int64 // the index (time/bucket) of the newest bucket
	started bool  // head is set
	sum     counts
}

type counts struct {
	requests, accepts, firsts, retries int64
}

// New returns a Throttle.
func New(o Options) (*Throttle, error) {
	if o.K == 0 {
		o.K = 2
	}
	if o.K < 1 {
		return nil, fmt.Errorf("adaptive: K %v: want 1 or more (2 is the SRE book's)", o.K)
	}
	if o.Window == 0 {
		o.Window = 2 * time.Minute
	}
	if o.Buckets == 0 {
		o.Buckets = 20
	}
	if o.Buckets < 1 || o.Window < time.Duration(o.Buckets)*time.Microsecond {
		return nil, fmt.Errorf("adaptive: Window %v in %d buckets: want a positive window of at least a microsecond per bucket", o.Window, o.Buckets)
	}
	switch {
	case o.RetryRatio == 0:
		o.RetryRatio = 0.1
	case o.RetryRatio < 0:
		o.RetryRatio = 0
	}
	switch {
	case o.MinRetries == 0:
		o.MinRetries = 10
	case o.MinRetries < 0:
		o.MinRetries = 0
	}
	if o.MaxTargets <= 0 {
		o.MaxTargets = 10000
	}
	if o.Clock == nil {
		o.Clock = clock.Coarse
	}
	if o.Rand == nil {
		o.Rand = rand.Float64
	}
	return &Throttle{o: o, bucket: o.Window.Microseconds() / int64(o.Buckets), targets: map[string]*target{}}, nil
}

func (t *Throttle) target(name string) *target {
	t.mu.Lock()
	defer t.mu.Unlock()
	tg := t.targets[name]
	if tg == nil {
		if len(t.targets) >= t.o.MaxTargets {
			for k := range t.targets { // forget one: the map's order is random
				delete(t.targets, k)
				break
			}
		}
		tg = &target{buckets: make([]counts, t.o.Buckets)}
		t.targets[name] = tg
	}
	return tg
}

// advance moves tg's window to now, dropping the buckets that left it.
// tg.mu is held.
func (t *Throttle) advance(tg *target) *counts {
	now := t.o.Clock.NowMicro() / t.bucket
	if !tg.started { // new: start here
		tg.head, tg.started = now, true
	}
	n := int64(len(tg.buckets))
	if now-tg.head >= n {
		clear(tg.buckets)
		tg.sum = counts{}
	} else {
		for i := tg.head + 1; i <= now; i++ {
			b := &tg.buckets[i%n]
			tg.sum.requests -= b.requests
			tg.sum.accepts -= b.accepts
			tg.sum.firsts -= b.firsts
			tg.sum.retries -= b.retries
			*b = counts{}
		}
	}
	if now > tg.head {
		tg.head = now
	}
	return &tg.buckets[tg.head%n]
}

// DropProbability returns the probability a request to target is
// dropped now: max(0, (requests − K·accepts) / (requests + 1)).
func (t *Throttle) DropProbability(target string) float64 {
	tg := t.target(target)
	tg.mu.Lock()
	defer tg.mu.Unlock()
	t.advance(tg)
	return t.dropP(tg)
}

func (t *Throttle) dropP(tg *target) float64 {
	return max(0, (float64(tg.sum.requests)-t.o.K*float64(tg.sum.accepts))/float64(tg.sum.requests+1))
}

// Admit counts a request to target (retry tells a retry from a first
// attempt) and says whether to send it: false means drop it locally
// (ErrThrottled). A request sent must be followed by one Done.
func (t *Throttle) Admit(target string, retry bool) bool {
	tg := t.target(target)
	tg.mu.Lock()
	defer tg.mu.Unlock()
	b := t.advance(tg)
	p := t.dropP(tg)
	b.requests++
	tg.sum.requests++
	if !retry {
		b.firsts++
		tg.sum.firsts++
	}
	return p <= 0 || t.o.Rand() >= p
}

// Done records whether the backend accepted a request that was sent.
// Refusals are what overload looks like (HTTP 429 and 503, gRPC
// UNAVAILABLE and RESOURCE_EXHAUSTED, no answer at all); an application
// error the backend answered counts as accepted.
func (t *Throttle) Done(target string, accepted bool) {
	if !accepted {
		return
	}
	tg := t.target(target)
	tg.mu.Lock()
	defer tg.mu.Unlock()
	b := t.advance(tg)
	b.accepts++
	tg.sum.accepts++
}

// AllowRetry takes a retry from target's budget: true, and the retry is
// counted, when the window's retries are below RetryRatio times its
// first attempts plus MinRetries; else false, and the caller gives up.
func (t *Throttle) AllowRetry(target string) bool {
	tg := t.target(target)
	tg.mu.Lock()
	defer tg.mu.Unlock()
	b := t.advance(tg)
	if float64(tg.sum.retries+1) > t.o.RetryRatio*float64(tg.sum.firsts)+float64(t.o.MinRetries) {
		return false
	}
	b.retries++
	tg.sum.retries++
	return true
}

// Counts returns target's window: the requests tried, those the backend
// accepted, the first attempts among them, and the retries the budget
// granted.
func (t *Throttle) Counts(target string) (requests, accepts, firsts, retries int64) {
	tg := t.target(target)
	tg.mu.Lock()
	defer tg.mu.Unlock()
	t.advance(tg)
	return tg.sum.requests, tg.sum.accepts, tg.sum.firsts, tg.sum.retries
}

package deferq

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"sync/atomic"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/memstore"
)

var (
	// ErrPollRate is PollStatus's error for a client over Options.PollRate:
	// answer 429 with Retry-After; Redis was not asked.
	ErrPollRate = errors.New("deferq: too many polls from this client")
	// ErrPollBusy is PollStatus's error when Options.PollConcurrency polls
	// are asking Redis already: answer 503 with Retry-After; Redis was not
	// asked.
	ErrPollBusy = errors.New("deferq: too many polls under way")
)

// maxPollClients bounds the per-client poll table: past it a new client
// takes the room of one whose bucket is full again, or, if none has,
// passes unbounded by rate (still under PollConcurrency).
const maxPollClients = 1 << 16

// pollGuard keeps polls from asking Redis too often: a token bucket per
// client address (the engine on a memory store of bounded size, no
// background goroutine) and a bound on the polls asking Redis at once.
type pollGuard struct {
	lim    *floodgate.Limiter // nil: no per-client bound
	sem    chan struct{}
	flight atomic.Int64
}

func newPollGuard(o *Options) (*pollGuard, error) {
	g := &pollGuard{sem: make(chan struct{}, o.PollConcurrency)}
	if o.PollRate < 0 {
		return g, nil
	}
	burst := int64(math.Ceil(2 * o.PollRate))
	// the bucket's period: burst polls at PollRate a second
	period := time.Duration(float64(burst) / o.PollRate * float64(time.Second))
	p, err := floodgate.NewPolicy("deferq-poll", floodgate.Rule{Algorithm: floodgate.TokenBucket, Limit: burst, Period: period,
		OnStoreFailure: floodgate.FailOpen})
	if err != nil {
		return nil, fmt.Errorf("deferq: PollRate %v: %w", o.PollRate, err)
	}
	st, err := memstore.New(memstore.Options{MaxKeys: maxPollClients, SweepInterval: -1})
	if err != nil {
		return nil, err
	}
	g.lim = floodgate.NewLimiter(p, st, floodgate.WithClock(o.Clock))
	return g, nil
}

// enter admits one poll of client (its address; "" for none: no
// per-client bound) to Redis, or says why not; leave ends it.
func (g *pollGuard) enter(ctx context.Context, client string) error {
	if g.lim != nil && client != "" {
		if d, err := g.lim.Allow(ctx, client); err == nil && !d.Allowed {
			return ErrPollRate
		}
	}
	select {
	case g.sem <- struct{}{}:
		g.flight.Add(1)
		return nil
	default:
		return ErrPollBusy
	}
}

func (g *pollGuard) leave() {
	g.flight.Add(-1)
	<-g.sem
}

// PollStatus is Status for a poll from client (an address, "ip" or
// "ip:port"; "" for a trusted caller, bounded by PollConcurrency only):
// before Redis is asked, the client's polls are held to
// Options.PollRate (ErrPollRate) and this Queue's polls under way to
// Options.PollConcurrency (ErrPollBusy), so that a client polling ids,
// or many of them, cannot keep Redis busy.
func (q *Queue) PollStatus(ctx context.Context, client, id string) (State, *Result, error) {
	if h, _, err := net.SplitHostPort(client); err == nil {
		client = h
	}
	if err := q.guard.enter(ctx, client); err != nil {
		return Unknown, nil, err
	}
	defer q.guard.leave()
	return q.Status(ctx, id)
}

// PollsInFlight returns how many of this Queue's polls are asking Redis.
func (q *Queue) PollsInFlight() int { return int(q.guard.flight.Load()) }

package main

import (
	"flag"
	"fmt"
	"math"
	"time"

	"github.com/floodgate/floodgate/deferq"
)

// deferConfig is `floodgate proxy`'s tuning of the defer action's queues
// (deferq.Options), the same for every defer route.
type deferConfig struct {
	// claimIdle is how long a deferred request a worker took may go
	// unfinished before another worker claims it.
	claimIdle time.Duration
	// pollRate bounds each client's polls of deferred requests, a
	// second; pollConcurrency the polls asking Redis at once.
	pollRate        float64
	pollConcurrency int
	// maxDeliveries bounds the attempts at delivering a request before it
	// is dead-lettered; maxDead the dead-letter stream.
	maxDeliveries, maxDead int64
}

func (c *deferConfig) register(fs *flag.FlagSet) {
	fs.Float64Var(&c.pollRate, "defer-poll-rate", envFloat("DEFER_POLL_RATE", 10), "action defer: the polls of deferred requests one client address may make a second (twice as many in a burst); more are answered 429 without asking Redis; negative: no bound (--trusted-proxies are not bounded by address) [FLOODGATE_DEFER_POLL_RATE]")
	fs.IntVar(&c.pollConcurrency, "defer-poll-concurrency", envInt("DEFER_POLL_CONCURRENCY", 64), "action defer: the polls of one queue that may ask Redis at once, whoever sends them; more are answered 503 with Retry-After without asking Redis; at least 1 [FLOODGATE_DEFER_POLL_CONCURRENCY]")
	fs.DurationVar(&c.claimIdle, "defer-claim-idle", envDuration("DEFER_CLAIM_IDLE", 30*time.Second), "action defer: how long a deferred request's delivery may go unfinished (a worker died, the upstream did not answer) before another worker delivers it again; also the delivery's timeout [FLOODGATE_DEFER_CLAIM_IDLE]")
	fs.Int64Var(&c.maxDeliveries, "defer-max-deliveries", envInt64("DEFER_MAX_DELIVERIES", 5), "action defer: the attempts at delivering a deferred request (each failed by a transport error or a timeout, not by the upstream's status) before it is moved to its queue's dead-letter stream, its poll answering 502; at least 1 [FLOODGATE_DEFER_MAX_DELIVERIES]")
	fs.Int64Var(&c.maxDead, "defer-max-dead", envInt64("DEFER_MAX_DEAD", 1000), "action defer: the dead letters kept per queue, for `floodgate deadletters` to list and requeue; past it the oldest is dropped; at least 1 [FLOODGATE_DEFER_MAX_DEAD]")
}

// check names the first bad flag and its value.
func (c *deferConfig) check() error {
	switch r := c.pollRate; {
	case math.IsNaN(r) || math.IsInf(r, 0) || r >= 0 && r < 0.001:
		return fmt.Errorf("proxy: --defer-poll-rate %v: want polls a second (at least 0.001), or negative for no bound", r)
	case c.pollConcurrency < 1:
		return fmt.Errorf("proxy: --defer-poll-concurrency %d: want 1 or more polls asking Redis at once", c.pollConcurrency)
	case c.claimIdle < time.Millisecond:
		return fmt.Errorf("proxy: --defer-claim-idle %v: want 1ms or more", c.claimIdle)
	case c.maxDeliveries < 1:
		return fmt.Errorf("proxy: --defer-max-deliveries %d: want 1 or more attempts", c.maxDeliveries)
	case c.maxDead < 1:
		return fmt.Errorf("proxy: --defer-max-dead %d: want 1 or more dead letters kept", c.maxDead)
	}
	return nil
}

// options returns the deferq.Options the flags set; each queue adds its
// route's.
func (c *deferConfig) options() deferq.Options {
	return deferq.Options{ClaimIdle: c.claimIdle, PollRate: c.pollRate, PollConcurrency: c.pollConcurrency,
		MaxDeliveries: c.maxDeliveries, MaxDead: c.maxDead}
}

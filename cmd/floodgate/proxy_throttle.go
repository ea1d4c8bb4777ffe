package main

import (
	"flag"
	"fmt"
	"time"

	"github.com/floodgate/floodgate/rules"
	"github.com/floodgate/floodgate/throttle"
)

// throttleConfig is `floodgate proxy`'s server throttler
// (proxy.Config.Throttle): off unless --throttle-max-inflight or
// --throttle-adaptive is set.
type throttleConfig struct {
	maxInflight int
	adaptive    bool
	queueCost   time.Duration
	maxWait     time.Duration
	header      string
	spare       float64
}

func (c *throttleConfig) register(fs *flag.FlagSet) {
	fs.IntVar(&c.maxInflight, "throttle-max-inflight", envInt("THROTTLE_MAX_INFLIGHT", 0), "the server throttler: forward at most this many allowed requests at once, queue the rest (bounded by --throttle-queue-cost) and shed what does not fit with 503 and Retry-After, the least critical first; with --throttle-adaptive the starting limit; 0 and no --throttle-adaptive: no throttler [FLOODGATE_THROTTLE_MAX_INFLIGHT]")
	fs.BoolVar(&c.adaptive, "throttle-adaptive", envBool("THROTTLE_ADAPTIVE"), "the server throttler, with its concurrency limit learned from the upstream's latency (Vegas) [FLOODGATE_THROTTLE_ADAPTIVE]")
	fs.DurationVar(&c.queueCost, "throttle-queue-cost", envDuration("THROTTLE_QUEUE_COST", 100*time.Millisecond), "the throttler's queue bound: the total predicted cost of the requests it holds (0: no queue, a request that cannot be forwarded at once is shed) [FLOODGATE_THROTTLE_QUEUE_COST]")
	fs.DurationVar(&c.maxWait, "throttle-max-wait", envDuration("THROTTLE_MAX_WAIT", time.Second), "the longest a request waits in the throttler's queue before it is shed (0: no bound but the client's leaving) [FLOODGATE_THROTTLE_MAX_WAIT]")
	fs.Float64Var(&c.spare, "throttle-spare", envFloat("THROTTLE_SPARE", 0.5), "elastic limits (mode: elastic in the rules) admit up to their elastic_ceiling while the throttler has nothing queued and fewer than this share of its limit in flight, the request being decided included; (0, 1] [FLOODGATE_THROTTLE_SPARE]")
	fs.StringVar(&c.header, "criticality-header", envString("CRITICALITY_HEADER", throttle.DefaultHeader), "the request header the throttler reads criticality from: CRITICAL_PLUS, CRITICAL, SHEDDABLE_PLUS, SHEDDABLE; absent or unknown: CRITICAL [FLOODGATE_CRITICALITY_HEADER]")
}

func (c *throttleConfig) check() error {
	switch {
	case c.maxInflight < 0:
		return fmt.Errorf("proxy: --throttle-max-inflight %d: want 0 (no throttler) or more", c.maxInflight)
	case c.queueCost < 0:
		return fmt.Errorf("proxy: --throttle-queue-cost %v: want 0 (no queue) or more", c.queueCost)
	case c.maxWait < 0:
		return fmt.Errorf("proxy: --throttle-max-wait %v: want 0 (no bound) or more", c.maxWait)
	case c.header == "":
		return fmt.Errorf("proxy: --criticality-header is empty; the default is %s", throttle.DefaultHeader)
	case !(c.spare > 0 && c.spare <= 1):
		return fmt.Errorf("proxy: --throttle-spare %v: want a share of the throttler's limit in (0, 1]", c.spare)
	}
	return nil
}

// throttler returns the throttler the flags ask for, or nil.
func (c *throttleConfig) throttler() *throttle.Throttler {
	if c.maxInflight == 0 && !c.adaptive {
		return nil
	}
	tc := throttle.Config{Limit: c.maxInflight, MaxQueueCost: c.queueCost, MaxWait: c.maxWait}
	if c.adaptive {
		tc.Adaptive = &throttle.AdaptiveConfig{}
	}
	return throttle.New(tc)
}

// rulesOptions returns the rules' parse options: with a throttler, its
// spare-capacity signal feeds the rules' elastic limits (Throttler.Spare
// at --throttle-spare); without one, mode: elastic is refused at its
// line.
func (c *throttleConfig) rulesOptions(th *throttle.Throttler, calendarMonth bool) rules.Options {
	o := rules.Options{CalendarMonth: calendarMonth}
	if th != nil {
		o.Spare = th.Spare(c.spare)
	}
	return o
}

package main

import (
	"context"
	"flag"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/redisstore"
	"github.com/floodgate/floodgate/service"
)

// busyHostConfig is what serve and proxy are told about a busy host: the
// ceiling of the Redis store's adaptive timeout (--store-timeout is its
// floor) and /readyz's hysteresis.
type busyHostConfig struct {
	storeTimeoutMax          time.Duration
	unreadyAfter, readyAfter time.Duration
}

// register adds the flags.
func (b *busyHostConfig) register(fs *flag.FlagSet) {
	fs.DurationVar(&b.storeTimeoutMax, "store-timeout-max", envDuration("STORE_TIMEOUT_MAX", time.Second),
		"ceiling of a Redis store's adaptive timeout: each call gets 3 times the p99 of the last 5s of calls' latencies, at least --store-timeout and at most this (at most --store-timeout: the timeout is fixed) [FLOODGATE_STORE_TIMEOUT_MAX]")
	fs.DurationVar(&b.unreadyAfter, "unready-after", envDuration("UNREADY_AFTER", 3*time.Second),
		"/readyz turns unready only when the store has failed every check for this long; 0: at the first [FLOODGATE_UNREADY_AFTER]")
	fs.DurationVar(&b.readyAfter, "ready-after", envDuration("READY_AFTER", 5*time.Second),
		"/readyz turns ready again only when the store has passed every check for this long; 0: at the first [FLOODGATE_READY_AFTER]")
}

// check refuses negative durations.
func (b *busyHostConfig) check() error {
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"store-timeout-max", b.storeTimeoutMax}, {"unready-after", b.unreadyAfter}, {"ready-after", b.readyAfter}} {
		if f.d < 0 {
			return fmt.Errorf("--%s %v: want 0 or more", f.name, f.d)
		}
	}
	return nil
}

// redisReadiness is the readiness of a Redis store, with hysteresis: a
// check fails while a breaker is open, when one has opened since the last
// check, or when Redis does not answer a PING within twice the store's
// timeout (100ms at least); /readyz turns unready after --unready-after of
// failed checks and ready after --ready-after of passed ones, sampled at
// each request and in the background (a quarter of the shorter, 25ms to
// 1s). The returned stop ends the background sampling.
func (b *busyHostConfig) redisReadiness(rs *redisstore.Store) (service.Readiness, func() error) {
	var opens atomic.Int64
	opens.Store(rs.Stats().BreakerOpens)
	raw := func() (bool, string) {
		st := rs.Stats()
		if seen := opens.Swap(st.BreakerOpens); st.Breaker || seen != st.BreakerOpens {
			return false, fmt.Sprintf("degraded: the Redis store is not answering (%d errors); rules' failure modes decide", st.Errors)
		}
		// an idle instance has asked Redis nothing lately: ask it now
		ctx, cancel := context.WithTimeout(context.Background(), max(2*st.Timeout, 100*time.Millisecond))
		defer cancel()
		if err := rs.Ping(ctx); err != nil {
			return false, fmt.Sprintf("degraded: the Redis store does not answer a PING (%v); rules' failure modes would decide", err)
		}
		return true, "ready: Redis store"
	}
	h := service.NewHysteresis(raw, clock.Precise, b.unreadyAfter, b.readyAfter)
	every := min(b.unreadyAfter, b.readyAfter) / 4
	every = min(max(every, 25*time.Millisecond), time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); h.Run(ctx, every) }()
	return h.Readiness(), func() error {
		cancel()
		<-done
		return nil
	}
}

// busyCollector exports what a Redis store sees of a busy host
// (redisstore.Stats): timeouts excused as this process's starvation,
// breaker openings, the adaptive timeout, and the scheduling lag.
type busyCollector struct {
	rs                           *redisstore.Store
	starved, opens, timeout, lag *prometheus.Desc
}

func newBusyCollector(rs *redisstore.Store) *busyCollector {
	d := func(name, help string) *prometheus.Desc { return prometheus.NewDesc(name, help, nil, nil) }
	return &busyCollector{rs: rs,
		starved: d("floodgate_store_starved_timeouts_total", "Redis calls that timed out while this process (or, for a Redis on this host, the host) was starved of CPU: not held against Redis by the breaker."),
		opens:   d("floodgate_store_breaker_opens_total", "Times the store's breaker opened."),
		timeout: d("floodgate_store_timeout_seconds", "The timeout a Redis call gets now (adaptive between --store-timeout and --store-timeout-max)."),
		lag:     d("floodgate_store_sched_lag_seconds", "The longest this process was late to run in the last half second, as the store's lag monitor saw it."),
	}
}

// Describe implements prometheus.Collector.
func (c *busyCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.starved, c.opens, c.timeout, c.lag} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *busyCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.rs.Stats()
	ch <- prometheus.MustNewConstMetric(c.starved, prometheus.CounterValue, float64(st.Starved))
	ch <- prometheus.MustNewConstMetric(c.opens, prometheus.CounterValue, float64(st.BreakerOpens))
	ch <- prometheus.MustNewConstMetric(c.timeout, prometheus.GaugeValue, st.Timeout.Seconds())
	ch <- prometheus.MustNewConstMetric(c.lag, prometheus.GaugeValue, st.Lag.Seconds())
}

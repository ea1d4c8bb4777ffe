package main

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/floodgate/floodgate/deferq"
)

// deferMetrics is a prometheus.Collector of the proxy's deferred queues,
// read from Redis at each scrape (deferq.Queue's Len and Oldest: an XLEN
// and an XRANGE of one entry per queue):
//
//	floodgate_defer_queue_length{queue}        requests queued, not yet delivered
//	floodgate_defer_oldest_age_seconds{queue}  how long the oldest of them has waited (0: none)
//	floodgate_defer_dead_letters{queue}        requests whose delivery failed --defer-max-deliveries times, kept in the dead-letter stream (at most --defer-max-dead)
//
// The queues are those of the rules loaded last; a queue Redis could not
// be asked about is left out of that scrape (and counted in
// floodgate_defer_scrape_errors_total).
type deferMetrics struct {
	dw                *deferWorkers
	timeout           time.Duration
	length, age, dead *prometheus.Desc
	errCount          prometheus.Counter
}

func newDeferMetrics(dw *deferWorkers) *deferMetrics {
	return &deferMetrics{dw: dw, timeout: 2 * time.Second,
		length: prometheus.NewDesc("floodgate_defer_queue_length",
			"Deferred requests queued (action defer), not yet delivered, by queue (the defer limit's name).", []string{"queue"}, nil),
		age: prometheus.NewDesc("floodgate_defer_oldest_age_seconds",
			"How long the oldest deferred request still queued has waited (by Redis's clock when it was accepted; 0 if none), by queue.", []string{"queue"}, nil),
		dead: prometheus.NewDesc("floodgate_defer_dead_letters",
			"Deferred requests whose delivery failed too many times (--defer-max-deliveries: a transport error, a timeout, a worker that died), moved to the queue's dead-letter stream (its newest --defer-max-dead kept; floodgate deadletters lists and requeues them), by queue.", []string{"queue"}, nil),
		errCount: prometheus.NewCounter(prometheus.CounterOpts{Name: "floodgate_defer_scrape_errors_total",
			Help: "Scrapes of a deferred queue's length or age that Redis did not answer (the queue was left out of that scrape)."}),
	}
}

// Describe implements prometheus.Collector.
func (m *deferMetrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.length
	ch <- m.age
	ch <- m.dead
	m.errCount.Describe(ch)
}

// Collect implements prometheus.Collector.
func (m *deferMetrics) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), m.timeout)
	defer cancel()
	for _, q := range m.dw.current() {
		n, err := q.Len(ctx)
		if err != nil {
			m.errCount.Inc()
			continue
		}
		oldest, ok, err := q.Oldest(ctx)
		if err != nil {
			m.errCount.Inc()
			continue
		}
		dead, err := q.DeadLen(ctx)
		if err != nil {
			m.errCount.Inc()
			continue
		}
		age := 0.0
		if ok {
			age = max(0, time.Since(oldest).Seconds())
		}
		ch <- prometheus.MustNewConstMetric(m.length, prometheus.GaugeValue, float64(n), q.Name())
		ch <- prometheus.MustNewConstMetric(m.age, prometheus.GaugeValue, age, q.Name())
		ch <- prometheus.MustNewConstMetric(m.dead, prometheus.GaugeValue, float64(dead), q.Name())
	}
	m.errCount.Collect(ch)
}

// current returns the queues of the rules loaded last.
func (d *deferWorkers) current() []*deferq.Queue {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.queues
}

// Package throttlemetrics exports a throttle.Throttler's state and
// counters as Prometheus metrics. It is a package of its own so that
// package throttle (and httplimit, which wires it) link no Prometheus
// client.
package throttlemetrics

import (
	"github.com/floodgate/floodgate/throttle"
	"github.com/prometheus/client_golang/prometheus"
)

// Collector is a prometheus.Collector of one throttler's metrics, read
// at each scrape from Throttler.Stats (atomic counters; no lock taken).
//
//	floodgate_throttle_limit                   the concurrency limit
//	floodgate_throttle_in_flight               requests running
//	floodgate_throttle_queue_length            requests queued
//	floodgate_throttle_queue_cost_seconds      their total predicted cost (CPU)
//	floodgate_throttle_admitted_total          requests admitted, each once
//	floodgate_throttle_suspended_total         admitted requests that gave their slot back for a delay
//	floodgate_throttle_readmitted_total        of those, the ones admitted again when it ended
//	floodgate_throttle_shed_total{criticality,reason}  reason: queue_full, evicted, deadline, canceled
//	floodgate_throttle_completions_total       requests completed
//	floodgate_throttle_cost_predicted_seconds_total  predicted cost of the completed
//	floodgate_throttle_cost_actual_seconds_total     their measured cost
//	floodgate_throttle_cost_error_seconds_total      the sum of |predicted − measured|
type Collector struct {
	t     *throttle.Throttler
	descs struct {
		limit, inFlight, queued, queuedCost, admitted, shed *prometheus.Desc
		suspended, readmitted                               *prometheus.Desc
		completions, predicted, actual, absErr              *prometheus.Desc
	}
}

// New returns a Collector of t's metrics; constLabels (may be nil) tell
// several throttlers apart.
func New(t *throttle.Throttler, constLabels prometheus.Labels) *Collector {
	c := &Collector{t: t}
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("floodgate_throttle_"+name, help, labels, constLabels)
	}
	c.descs.limit = d("limit", "The concurrency limit: requests run at once.")
	c.descs.inFlight = d("in_flight", "Requests running.")
	c.descs.queued = d("queue_length", "Requests waiting in the admission queue.")
	c.descs.queuedCost = d("queue_cost_seconds", "The total predicted cost (CPU seconds) of the queued requests.")
	c.descs.admitted = d("admitted_total", "Requests admitted to run, each once (not again after a delay: see readmitted_total).")
	c.descs.suspended = d("suspended_total", "Admitted requests that gave their slot back to wait out a delay action.")
	c.descs.readmitted = d("readmitted_total", "Suspended requests admitted again when their delay ended (the others were shed then, left, or are in their delay).")
	c.descs.shed = d("shed_total", "Requests shed (answered 503), by criticality and reason.", "criticality", "reason")
	c.descs.completions = d("completions_total", "Requests completed.")
	c.descs.predicted = d("cost_predicted_seconds_total", "The predicted cost of the completed requests, CPU seconds.")
	c.descs.actual = d("cost_actual_seconds_total", "The measured cost of the completed requests, CPU seconds.")
	c.descs.absErr = d("cost_error_seconds_total", "The sum of the absolute differences between predicted and measured cost.")
	return c
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.descs.limit, c.descs.inFlight, c.descs.queued, c.descs.queuedCost,
		c.descs.admitted, c.descs.suspended, c.descs.readmitted, c.descs.shed, c.descs.completions, c.descs.predicted, c.descs.actual, c.descs.absErr} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	s := c.t.Stats()
	g := func(d *prometheus.Desc, v float64) { ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v) }
	n := func(d *prometheus.Desc, v float64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, l...)
	}
	g(c.descs.limit, float64(s.Limit))
	g(c.descs.inFlight, float64(s.InFlight))
	g(c.descs.queued, float64(s.Queued))
	g(c.descs.queuedCost, s.QueuedCost.Seconds())
	n(c.descs.admitted, float64(s.Admitted))
	n(c.descs.suspended, float64(s.Suspended))
	n(c.descs.readmitted, float64(s.Readmitted))
	for l := range s.Refused {
		crit := throttle.Criticality(l).String()
		n(c.descs.shed, float64(s.Refused[l]), crit, "queue_full")
		n(c.descs.shed, float64(s.Evicted[l]), crit, "evicted")
		n(c.descs.shed, float64(s.Expired[l]), crit, "deadline")
		n(c.descs.shed, float64(s.Withdrawn[l]), crit, "canceled")
	}
	n(c.descs.completions, float64(s.Completions))
	n(c.descs.predicted, s.Predicted.Seconds())
	n(c.descs.actual, s.Actual.Seconds())
	n(c.descs.absErr, s.AbsoluteErr.Seconds())
}

package server

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Why the RLQS abandons buckets, and the codes its streams end with: the
// label values of its metrics.
var (
	rlqsAbandonReasons = []string{"idle", "removed", "over_bound", "table_full"}
	rlqsErrorCodes     = []string{"invalid_argument", "unavailable", "resource_exhausted", "internal", "other"}
)

// rlqsMetrics are RLQS's counters; gauges are read at each scrape.
type rlqsMetrics struct {
	reports  atomic.Int64
	abandons [4]atomic.Int64 // by rlqsAbandonReasons
	errors   [5]atomic.Int64 // by rlqsErrorCodes
}

// Indexes of rlqsAbandonReasons.
const (
	abandonIdle = iota
	abandonRemoved
	abandonOverBound
	abandonTableFull
)

// rlqsCollector exports an RLQS's metrics.
type rlqsCollector struct {
	r                                         *RLQS
	streams, buckets, reports, abandons, errs *prometheus.Desc
}

// Collector returns RLQS's Prometheus metrics, to register beside the
// Server's: floodgate_rlqs_streams (open streams: Envoys),
// floodgate_rlqs_buckets (buckets subscribed, over all streams),
// floodgate_rlqs_reports_total (usage reports received),
// floodgate_rlqs_abandons_total by reason (idle: no requests for
// IdleAfter; removed: its configuration entry is gone; over_bound: beyond
// MaxBuckets; table_full: the table's MaxClients) and
// floodgate_rlqs_stream_errors_total by code (invalid_argument,
// unavailable: not the master, or stopping, resource_exhausted: beyond MaxStreams,
// internal, other: the stream cut or reset). Per-resource figures
// (capacity, granted, wanted, clients) are the Server's, whose table
// RLQS's buckets are in.
func (r *RLQS) Collector() prometheus.Collector {
	return &rlqsCollector{r: r,
		streams:  prometheus.NewDesc("floodgate_rlqs_streams", "Open RLQS streams (Envoys).", nil, nil),
		buckets:  prometheus.NewDesc("floodgate_rlqs_buckets", "RLQS buckets subscribed, over all streams.", nil, nil),
		reports:  prometheus.NewDesc("floodgate_rlqs_reports_total", "RLQS usage reports received.", nil, nil),
		abandons: prometheus.NewDesc("floodgate_rlqs_abandons_total", "RLQS buckets abandoned, by reason: idle, removed, over_bound, table_full.", []string{"reason"}, nil),
		errs:     prometheus.NewDesc("floodgate_rlqs_stream_errors_total", "RLQS streams ended by an error, by code: invalid_argument, unavailable, resource_exhausted, internal, other.", []string{"code"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *rlqsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.streams, c.buckets, c.reports, c.abandons, c.errs} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *rlqsCollector) Collect(ch chan<- prometheus.Metric) {
	streams := c.r.snapshot()
	buckets := 0
	for _, st := range streams {
		st.mu.Lock()
		buckets += len(st.buckets)
		st.mu.Unlock()
	}
	m := &c.r.metrics
	ch <- prometheus.MustNewConstMetric(c.streams, prometheus.GaugeValue, float64(len(streams)))
	ch <- prometheus.MustNewConstMetric(c.buckets, prometheus.GaugeValue, float64(buckets))
	ch <- prometheus.MustNewConstMetric(c.reports, prometheus.CounterValue, float64(m.reports.Load()))
	for i, reason := range rlqsAbandonReasons {
		ch <- prometheus.MustNewConstMetric(c.abandons, prometheus.CounterValue, float64(m.abandons[i].Load()), reason)
	}
	for i, code := range rlqsErrorCodes {
		ch <- prometheus.MustNewConstMetric(c.errs, prometheus.CounterValue, float64(m.errors[i].Load()), code)
	}
}

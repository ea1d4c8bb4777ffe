package server

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the server's Prometheus metrics: per resource, gauges read
// from the table at each scrape, and refusals counted as they happen.
type metrics struct {
	s        *Server
	capacity *prometheus.Desc
	granted  *prometheus.Desc
	wanted   *prometheus.Desc
	clients  *prometheus.Desc
	learning *prometheus.Desc
	master   *prometheus.Desc

	mu       sync.Mutex
	refusals map[[2]string]float64 // {resource entry, reason}
	refDesc  *prometheus.Desc
}

func newMetrics(s *Server) *metrics {
	l := []string{"resource"}
	return &metrics{s: s,
		capacity: prometheus.NewDesc("floodgate_capacity_capacity", "A resource's capacity now (for an intermediate server, its parent's grant).", l, nil),
		granted:  prometheus.NewDesc("floodgate_capacity_granted", "The capacity of a resource in unexpired leases.", l, nil),
		wanted:   prometheus.NewDesc("floodgate_capacity_wanted", "The sum of a resource's clients' wants.", l, nil),
		clients:  prometheus.NewDesc("floodgate_capacity_clients", "Clients holding or asking for a resource.", l, nil),
		learning: prometheus.NewDesc("floodgate_capacity_learning", "1 while a resource is in learning mode (after becoming master).", l, nil),
		master:   prometheus.NewDesc("floodgate_capacity_master", "1 when this server is the master.", nil, nil),
		refDesc: prometheus.NewDesc("floodgate_capacity_refusals_total",
			"Calls refused, by the resources-file entry of the first resource asked for (\"\" when not known) and reason: not_master, invalid_argument, too_many_clients, error.",
			[]string{"resource", "reason"}, nil),
		refusals: map[[2]string]float64{},
	}
}

func (m *metrics) refuse(resource, reason string) {
	m.mu.Lock()
	m.refusals[[2]string{resource, reason}]++
	m.mu.Unlock()
}

// Describe implements prometheus.Collector.
func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.capacity, m.granted, m.wanted, m.clients, m.learning, m.master, m.refDesc} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	for _, st := range m.s.table.Stats() {
		ch <- prometheus.MustNewConstMetric(m.capacity, prometheus.GaugeValue, st.Capacity, st.Resource)
		ch <- prometheus.MustNewConstMetric(m.granted, prometheus.GaugeValue, st.Granted, st.Resource)
		ch <- prometheus.MustNewConstMetric(m.wanted, prometheus.GaugeValue, st.Wanted, st.Resource)
		ch <- prometheus.MustNewConstMetric(m.clients, prometheus.GaugeValue, float64(st.Clients), st.Resource)
		ch <- prometheus.MustNewConstMetric(m.learning, prometheus.GaugeValue, b2f(st.Learning), st.Resource)
	}
	isMaster, _ := m.s.Mastership()
	ch <- prometheus.MustNewConstMetric(m.master, prometheus.GaugeValue, b2f(isMaster))
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, v := range m.refusals {
		ch <- prometheus.MustNewConstMetric(m.refDesc, prometheus.CounterValue, v, k[0], k[1])
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// Collector returns the server's Prometheus metrics, to register on a
// registry: per resource floodgate_capacity_capacity, _granted, _wanted,
// _clients and _learning (gauges), floodgate_capacity_master, and
// floodgate_capacity_refusals_total by resource entry and reason.
func (s *Server) Collector() prometheus.Collector { return s.metrics }

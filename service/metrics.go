package service

import (
	"errors"
	"sync"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/rules"
)

// maxValues is how many distinct descriptor values a detailed_metric rule
// reports on its own before the rest count as "other".
const maxValues = 100

// Metrics are the service's Prometheus metrics.
type Metrics struct {
	Registry  *prometheus.Registry
	decisions *prometheus.CounterVec   // domain, rule, outcome
	detailed  *prometheus.CounterVec   // domain, rule, value, outcome
	requests  *prometheus.CounterVec   // domain, code
	latency   *prometheus.HistogramVec // domain
	reloads   *prometheus.CounterVec   // result
	rulesLive prometheus.Gauge

	mu     sync.Mutex
	values map[string]map[string]bool // rule → values reported on their own

	// Children of the vectors, looked up once: WithLabelValues hashes its
	// labels on every call.
	counters   sync.Map // counterKey → prometheus.Counter
	histograms sync.Map // domain → prometheus.Observer
}

type counterKey struct {
	vec     *prometheus.CounterVec
	a, b, c string
}

// maxChildren bounds the cached children (label values come from
// configuration, but a domain is whatever a caller sends).
const maxChildren = 1 << 16

func (m *Metrics) counter(vec *prometheus.CounterVec, a, b, c string) prometheus.Counter {
	k := counterKey{vec, a, b, c}
	if v, ok := m.counters.Load(k); ok {
		return v.(prometheus.Counter)
	}
	var ctr prometheus.Counter
	if c == "" && vec == m.requests {
		ctr = vec.WithLabelValues(a, b)
	} else {
		ctr = vec.WithLabelValues(a, b, c)
	}
	m.counters.Store(k, ctr)
	return ctr
}

func (m *Metrics) histogram(domain string) prometheus.Observer {
	if v, ok := m.histograms.Load(domain); ok {
		return v.(prometheus.Observer)
	}
	h := m.latency.WithLabelValues(domain)
	m.histograms.Store(domain, h)
	return h
}

// NewMetrics registers the metrics in a registry of their own (with the Go
// and process collectors).
func NewMetrics() *Metrics {
	r := prometheus.NewRegistry()
	m := &Metrics{
		Registry: r,
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "floodgate_decisions_total",
			Help: "Descriptor decisions by domain, rule and outcome (ok, over_limit, shadow_over_limit, degraded_ok, degraded_over_limit)."},
			[]string{"domain", "rule", "outcome"}),
		detailed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "floodgate_decisions_by_value_total",
			Help: "Decisions per descriptor value, for rules with detailed_metric, capped to 100 values per rule plus \"other\"."},
			[]string{"domain", "rule", "value", "outcome"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "floodgate_requests_total",
			Help: "ShouldRateLimit requests by domain and overall code (ok, over_limit, invalid, error)."},
			[]string{"domain", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "floodgate_request_duration_seconds",
			Help:    "ShouldRateLimit latency inside the service.",
			Buckets: []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25}},
			[]string{"domain"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "floodgate_rule_reloads_total",
			Help: "Rule file loads by result (ok, refused)."}, []string{"result"}),
		rulesLive: prometheus.NewGauge(prometheus.GaugeOpts{Name: "floodgate_rule_domains",
			Help: "Domains in the live rules."}),
		values: map[string]map[string]bool{},
	}
	r.MustRegister(m.decisions, m.detailed, m.requests, m.latency, m.reloads, m.rulesLive,
		prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
	return m
}

// Register adds more collectors (a store's error counters, say).
func (m *Metrics) Register(c prometheus.Collector) error { return m.Registry.Register(c) }

// Reload counts a rules load: ok, or refused files.
func (m *Metrics) Reload(ok bool, domains int) {
	if ok {
		m.reloads.WithLabelValues("ok").Inc()
	} else {
		m.reloads.WithLabelValues("refused").Inc()
	}
	m.rulesLive.Set(float64(domains))
}

func (m *Metrics) observeRequest(domain string, resp *rlsv3.RateLimitResponse, err error, took time.Duration) {
	if len(domain) > 128 {
		domain = domain[:128]
	}
	code := "ok"
	switch {
	case errors.Is(err, errBadRequest):
		code, domain = "invalid", "" // not a domain we know: no label per garbage
	case err != nil:
		code = "error"
	case resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT:
		code = "over_limit"
	}
	m.counter(m.requests, domain, code, "").Inc()
	if err == nil {
		m.histogram(domain).Observe(took.Seconds())
	}
}

func (m *Metrics) observeDecision(domain string, l *rules.Limit, key string, d *floodgate.Decision) {
	outcome := "ok"
	if !d.Allowed {
		outcome = "over_limit"
		if l.ShadowMode {
			outcome = "shadow_over_limit"
		}
	}
	if d.Degraded {
		outcome = "degraded_" + outcome
	}
	m.counter(m.decisions, domain, l.Name, outcome).Inc()
	if !l.DetailedMetric {
		return
	}
	m.mu.Lock()
	vs := m.values[l.Name]
	if vs == nil {
		vs = map[string]bool{}
		m.values[l.Name] = vs
	}
	value := key
	if !vs[value] {
		if len(vs) < maxValues {
			vs[value] = true
		} else {
			value = "other"
		}
	}
	m.mu.Unlock()
	m.detailed.WithLabelValues(domain, l.Name, value, outcome).Inc()
}

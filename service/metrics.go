package service

import (
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/decide"
	"github.com/floodgate/floodgate/internal/recorder"
	"github.com/floodgate/floodgate/internal/topk"
	"github.com/floodgate/floodgate/rules"
)

// maxValues is how many distinct descriptor values a detailed_metric rule
// reports on its own, its most frequent ones; the rest count as "other".
// The counts come from the Space-Saving algorithm over trackedValues
// values, so a flood of distinct values costs fixed memory and the values
// reported are the heavy hitters (each count is at most the true count plus
// the error of the slot it took over).
const (
	maxValues     = 100
	trackedValues = 10 * maxValues
)

// Metrics are the service's Prometheus metrics.
type Metrics struct {
	// Registry holds the metrics and the Go and process collectors: serve
	// it with promhttp.HandlerFor; Register adds collectors to it.
	Registry  *prometheus.Registry
	decisions *prometheus.CounterVec // domain, rule, outcome
	soft      *prometheus.CounterVec // domain, rule: soft-limit crossings (issue 22)
	detailed  *topValues
	requests  *prometheus.CounterVec   // domain, code
	latency   *prometheus.HistogramVec // domain
	reloads   *prometheus.CounterVec   // result
	rulesLive prometheus.Gauge
	adminAuth *prometheus.CounterVec // result: the admin API's refused attempts (adminauth.go)

	// Children of the vectors, looked up once: WithLabelValues hashes its
	// labels on every call.
	counters   sync.Map // counterKey → prometheus.Counter
	histograms sync.Map // domain → prometheus.Observer

	// The same, resolved further: one entry per domain for its requests,
	// one per limit of the rules (by pointer) for its decisions, each
	// holding its children as they are first used.
	domainSeries sync.Map // domain → *domainSeries
	limitSeries  sync.Map // *rules.Limit → *limitSeries
	nLimitSeries atomic.Int64
}

// domainSeries are a domain's request counters (ok, over_limit, error) and
// latency histogram.
type domainSeries struct {
	codes   [3]atomic.Pointer[prometheus.Counter]
	latency prometheus.Observer
}

var requestCodes = [...]string{"ok", "over_limit", "error"}

// limitSeries are a limit's decision counters, by outcome, and its
// counters in the service's recorder (found with the same lookup).
type limitSeries struct {
	outcomes [8]atomic.Pointer[prometheus.Counter]
	soft     atomic.Pointer[prometheus.Counter] // its soft-limit crossings
	rec      atomic.Pointer[recorder.Counters]
}

var decisionOutcomes = [...]string{"ok", "over_limit", "shadow_over_limit", "quota_over_limit",
	"degraded_ok", "degraded_over_limit", "degraded_shadow_over_limit", "degraded_quota_over_limit"}

type counterKey struct {
	vec     *prometheus.CounterVec
	a, b, c string
}

// requestLimitRule is the rule label of decisions by a descriptor's own
// limit (--allow-request-limits).
const requestLimitRule = "_request_limit"

// labelValue makes s a label value Prometheus takes: valid UTF-8. A label
// that is not makes client_golang panic, and a request's values can hold
// any bytes (a long value's store key is cut at a byte count, say). Two
// values may come out alike; the collectors merge them.
func labelValue(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}

// maxChildren bounds the cached children (label values come from
// configuration, but a domain is whatever a caller sends).
const maxChildren = 1 << 16

func (m *Metrics) counter(vec *prometheus.CounterVec, labels ...string) prometheus.Counter {
	k := counterKey{vec: vec, a: labels[0], b: labels[1]}
	if len(labels) > 2 {
		k.c = labels[2]
	}
	if v, ok := m.counters.Load(k); ok {
		return v.(prometheus.Counter)
	}
	safe := make([]string, len(labels))
	for i, l := range labels {
		safe[i] = labelValue(l)
	}
	ctr := vec.WithLabelValues(safe...)
	m.counters.Store(k, ctr)
	return ctr
}

func (m *Metrics) histogram(domain string) prometheus.Observer {
	if v, ok := m.histograms.Load(domain); ok {
		return v.(prometheus.Observer)
	}
	h := m.latency.WithLabelValues(labelValue(domain))
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
			Help: "Descriptor decisions by domain, rule and outcome (ok, over_limit, shadow_over_limit, quota_over_limit, and each degraded_: decided by a failure mode)."},
			[]string{"domain", "rule", "outcome"}),
		soft: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "floodgate_soft_limit_crossings_total",
			Help: "Descriptors a rule in mode: soft admitted past its soft line (beyond requests_per_unit, within soft_percent), by domain and rule: each got Floodgate-Warning, unless its rule is in shadow mode. Each is also in floodgate_decisions_total (ok, or degraded_ok)."},
			[]string{"domain", "rule"}),
		detailed: &topValues{desc: prometheus.NewDesc("floodgate_top_value_decisions",
			"Decisions per descriptor value for rules with detailed_metric: the 100 most frequent values per rule (Space-Saving estimate), the rest as \"other\". A gauge: values enter and leave the top.",
			[]string{"domain", "rule", "value", "outcome"}, nil), rules: map[[2]string]*ruleValues{}},
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
	}
	r.MustRegister(m.decisions, m.soft, m.detailed, m.requests, m.latency, m.reloads, m.rulesLive,
		prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
	m.adminAuth = newAdminAuthCounter()
	r.MustRegister(m.adminAuth)
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
	code := 0 // ok
	switch {
	case errors.Is(err, errBadRequest):
		// not a domain we know: no label per garbage
		m.counter(m.requests, "", "invalid").Inc()
		return
	case err != nil:
		code = 2
	case resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT:
		code = 1
	}
	ds := m.domain(domain)
	cp := ds.codes[code].Load()
	if cp == nil {
		c := m.counter(m.requests, domain, requestCodes[code])
		cp = &c
		ds.codes[code].Store(cp)
	}
	(*cp).Inc()
	if err == nil {
		ds.latency.Observe(took.Seconds())
	}
}

func (m *Metrics) domain(domain string) *domainSeries {
	if v, ok := m.domainSeries.Load(domain); ok {
		return v.(*domainSeries)
	}
	v, _ := m.domainSeries.LoadOrStore(domain, &domainSeries{latency: m.histogram(domain)})
	return v.(*domainSeries)
}

// observeDecision counts a decision, and returns its limit's series (nil
// for a request's own limit).
func (m *Metrics) observeDecision(domain string, l *rules.Limit, shadow bool, key, statKey string, d *floodgate.Decision) (ls *limitSeries) {
	outcome := 0 // ok
	if !d.Allowed {
		outcome = 1 // over_limit
		switch {
		case shadow:
			outcome = 2 // shadow_over_limit
		case l.QuotaMode:
			outcome = 3 // quota_over_limit: admitted in quota mode
		}
	}
	if d.Degraded {
		outcome += 4
	}
	if l.Policy == nil {
		// a request's own limit: a fresh *rules.Limit each time, and a
		// name ("11/1s") the caller chooses, so one series for them all
		m.counter(m.decisions, domain, requestLimitRule, decisionOutcomes[outcome]).Inc()
	} else {
		ls = m.limit(l)
		cp := ls.outcomes[outcome].Load()
		if cp == nil {
			c := m.counter(m.decisions, domain, l.Name, decisionOutcomes[outcome])
			cp = &c
			ls.outcomes[outcome].Store(cp)
		}
		(*cp).Inc()
		// issue 22, soft limits: the "warned" outcome is softCrossed(d)
		if softCrossed(d) {
			m.softCrossing(domain, l.Name, ls)
		}
	}
	switch {
	case l.DetailedMetric:
		m.detailed.add(domain, l.Name, key, d.Allowed)
	case l.ValueToMetric && statKey != "":
		// the statistics key, with the request's values where the
		// rules ask for them (envoyproxy/ratelimit's stat name), kept to
		// MaxKeyBytes as store keys are: a value is as long as a client
		// makes it, and the summary holds trackedValues of them per rule
		// (megabyte values held hundreds of megabytes, and each scrape
		// wrote them all out again)
		m.detailed.add(domain, l.Name, decide.BoundKey(statKey), d.Allowed)
	}
	return ls
}

// softCrossing counts a soft-limit crossing of the limit named rule (ls
// its series). Only a rules file's limits are soft: a request's own limit
// has no mode.
func (m *Metrics) softCrossing(domain, rule string, ls *limitSeries) {
	cp := ls.soft.Load()
	if cp == nil {
		c := m.counter(m.soft, domain, rule)
		cp = &c
		ls.soft.Store(cp)
	}
	(*cp).Inc()
}

// limit returns l's decision series. A limit belongs to one domain, so its
// pointer names the pair; every reload brings new limits, and the old ones
// are dropped when there are too many.
func (m *Metrics) limit(l *rules.Limit) *limitSeries {
	if v, ok := m.limitSeries.Load(l); ok {
		return v.(*limitSeries)
	}
	if m.nLimitSeries.Add(1) > maxChildren {
		m.limitSeries.Clear()
		m.nLimitSeries.Store(1)
	}
	v, _ := m.limitSeries.LoadOrStore(l, &limitSeries{})
	return v.(*limitSeries)
}

// topValues is a collector of per-value decision counts, one Space-Saving
// summary (internal/topk) per (domain, rule), each value's count split by
// outcome in its tag.
type topValues struct {
	desc  *prometheus.Desc
	mu    sync.Mutex
	rules map[[2]string]*ruleValues
}

// ruleValues are a rule's values: their summary, the ok and over_limit
// counts of each kept value as its tag, and every decision's in total.
type ruleValues struct {
	values *topk.Tagged[[2]float64]
	total  [2]float64 // ok, over: every decision of the rule
}

func (t *topValues) add(domain, rule, value string, allowed bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := [2]string{domain, rule}
	rv := t.rules[k]
	if rv == nil {
		if len(t.rules) >= maxChildren {
			return
		}
		rv = &ruleValues{values: topk.NewTagged[[2]float64](trackedValues)}
		t.rules[k] = rv
	}
	i := 0
	if !allowed {
		i = 1
	}
	rv.total[i]++
	// A value that takes a slot over inherits its count (an estimate that
	// may overstate it by that much, as Space-Saving does) but starts its
	// split by outcome afresh.
	rv.values.AddTag(value, 1)[i]++
}

// Describe implements prometheus.Collector.
func (t *topValues) Describe(ch chan<- *prometheus.Desc) { ch <- t.desc }

// Collect implements prometheus.Collector: each rule's most frequent
// values, and "other" for the rest.
func (t *topValues) Collect(ch chan<- prometheus.Metric) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k, rv := range t.rules {
		top := rv.values.Top(maxValues)
		restOK, restOver := rv.total[0], rv.total[1]
		byLabel := make(map[string]*[2]float64, len(top)) // values alike as labels, merged
		var labels []string
		for _, e := range top {
			l := labelValue(e.Key)
			c := byLabel[l]
			if c == nil {
				c = new([2]float64)
				byLabel[l] = c
				labels = append(labels, l)
			}
			c[0] += e.Tag[0]
			c[1] += e.Tag[1]
			restOK -= e.Tag[0]
			restOver -= e.Tag[1]
		}
		for _, l := range labels {
			c := byLabel[l]
			ch <- prometheus.MustNewConstMetric(t.desc, prometheus.GaugeValue, c[0], labelValue(k[0]), labelValue(k[1]), l, "ok")
			ch <- prometheus.MustNewConstMetric(t.desc, prometheus.GaugeValue, c[1], labelValue(k[0]), labelValue(k[1]), l, "over_limit")
		}
		ch <- prometheus.MustNewConstMetric(t.desc, prometheus.GaugeValue, max(restOK, 0), labelValue(k[0]), labelValue(k[1]), "other", "ok")
		ch <- prometheus.MustNewConstMetric(t.desc, prometheus.GaugeValue, max(restOver, 0), labelValue(k[0]), labelValue(k[1]), "other", "over_limit")
	}
}

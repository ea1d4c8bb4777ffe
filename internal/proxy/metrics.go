package proxy

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/gate"
)

// Metrics are the proxy's own metrics.
type Metrics struct {
	requests *prometheus.CounterVec
	limits   *prometheus.CounterVec
	// soft counts the decisions a limit in mode: soft (or elastic)
	// admitted past its soft line, per route: serve's
	// floodgate_soft_limit_crossings_total, the dashboard's "warned".
	soft *prometheus.CounterVec
	// upstream counts the requests the upstream failed (502 and 504),
	// upstreamTimeouts those of them it sent no header for in time (504).
	upstream         prometheus.Counter
	upstreamTimeouts prometheus.Counter
	// clients counts the requests their client failed, by reason
	// (clientReasons).
	clients *prometheus.CounterVec
	// connsRefused counts the connections refused for --max-conns-per-ip.
	connsRefused prometheus.Counter
	mu           sync.Mutex
	limitKeys    map[[2]string]prometheus.Counter
	softKeys     map[string]prometheus.Counter
}

// NewMetrics returns the proxy's metrics, registered nowhere yet
// (Collectors).
func NewMetrics() *Metrics {
	return &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "floodgate_proxy_requests_total",
			Help: "Requests through the proxy by outcome (passed, refused, delayed, error)."}, []string{"outcome"}),
		limits: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "floodgate_proxy_limit_decisions_total",
			Help: "Decisions per http route (domain/route) and outcome (ok, over_limit, shadow_over_limit, banned; not_limited: an exempt value or an unlimited limit; store_unavailable: refused, the store not asked; degraded: decided by a failure mode without the store)."}, []string{"limit", "outcome"}),
		soft: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "floodgate_proxy_soft_limit_crossings_total",
			Help: "Decisions per http route (domain/route) that a limit in mode: soft (or elastic) admitted past its soft line (beyond requests_per_unit): each got Floodgate-Warning unless the route is in shadow mode. Each is also in floodgate_proxy_limit_decisions_total (ok, or degraded)."}, []string{"limit"}),
		upstream: prometheus.NewCounter(prometheus.CounterOpts{Name: "floodgate_proxy_upstream_errors_total",
			Help: "Requests the upstream failed: it could not be reached or broke off (502), or sent no response header within --upstream-timeout (504)."}),
		upstreamTimeouts: prometheus.NewCounter(prometheus.CounterOpts{Name: "floodgate_proxy_upstream_timeouts_total",
			Help: "Requests whose upstream sent no response header within --upstream-timeout (504); also in floodgate_proxy_upstream_errors_total."}),
		clients: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "floodgate_proxy_client_errors_total",
			Help: "Requests their client failed, by reason: body_timeout (its body stalled past --client-body-timeout), body_aborted (it went away while sending its body), body_invalid (a malformed body), gone_while_delayed (it went away while a delay action held it)."}, []string{"reason"}),
		connsRefused: prometheus.NewCounter(prometheus.CounterOpts{Name: "floodgate_proxy_connections_refused_total",
			Help: "Connections answered 429 and closed at accept because their client address held --max-conns-per-ip connections already."}),
		limitKeys: map[[2]string]prometheus.Counter{},
		softKeys:  map[string]prometheus.Counter{},
	}
}

// Collectors returns the metrics to register.
func (m *Metrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.requests, m.limits, m.soft, m.upstream, m.upstreamTimeouts, m.clients, m.connsRefused}
}

// limit returns the counter of a route's outcome.
func (m *Metrics) limit(name, outcome string) prometheus.Counter {
	k := [2]string{name, outcome}
	m.mu.Lock()
	defer m.mu.Unlock()
	c, ok := m.limitKeys[k]
	if !ok {
		c = m.limits.WithLabelValues(name, outcome)
		m.limitKeys[k] = c
	}
	return c
}

// softCrossing returns the counter of a route's soft-line crossings.
func (m *Metrics) softCrossing(name string) prometheus.Counter {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, ok := m.softKeys[name]
	if !ok {
		c = m.soft.WithLabelValues(name)
		m.softKeys[name] = c
	}
	return c
}

// The reasons of floodgate_proxy_client_errors_total, indexes of
// clientReasons.
const (
	reasonBodyTimeout = iota
	reasonBodyAborted
	reasonBodyInvalid
	reasonGoneWhileDelayed
	numClientReasons
)

// clientReasons are the reason labels of floodgate_proxy_client_errors_total.
var clientReasons = [numClientReasons]string{"body_timeout", "body_aborted", "body_invalid", "gone_while_delayed"}

// bodyErrReason sorts a failure to read a request's body: the client too
// slow, gone, or sending a malformed body.
func bodyErrReason(err error) int {
	switch {
	case isTimeout(err):
		return reasonBodyTimeout
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF), errors.Is(err, net.ErrClosed),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return reasonBodyAborted
	default:
		return reasonBodyInvalid
	}
}

// isTimeout reports whether err is a deadline's.
func isTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &t) && t.Timeout()
}

// observe counts a verdict, as httplimit's Observe did.
func (p *Proxy) observe(v *gate.Verdict) {
	for i := range v.Outcomes {
		o := &v.Outcomes[i]
		outcome := "ok"
		switch {
		case o.Banned:
			outcome = "banned"
		case o.Decision.Degraded && o.Decision.Reason == floodgate.ReasonStoreUnavailable:
			outcome = "store_unavailable" // refused, the store not asked
		case o.Decision.Degraded:
			outcome = "degraded" // a failure mode admitted it, or its local share refused it
		case o.Over:
			outcome = "over_limit"
		case !o.Decided():
			outcome = "not_limited" // an exempt value, or an unlimited limit
		case !o.Decision.Allowed:
			outcome = "shadow_over_limit"
		}
		p.pm.limit(o.Limit.Name, outcome).Inc()
		// as serve counts it (softCrossed): admitted past the soft line
		if o.Decided() && o.Decision.Allowed && o.Decision.Excess {
			p.pm.softCrossing(o.Limit.Name).Inc()
		}
	}
	if p.onVerdict != nil {
		p.onVerdict(v)
	}
	switch {
	case v.Err != nil && v.Deciding == nil:
		p.errored.Inc()
	case !v.Allowed:
		p.refused.Inc()
	case v.Delayed > 0:
		p.delayed.Inc()
	default:
		p.passed.Inc()
	}
}

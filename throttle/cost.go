package throttle

import "time"

// RouteKey names the class of requests whose costs are alike: by default
// a request's method and its route pattern (http.Request.Pattern, as
// net/http's ServeMux sets it), so "GET /items/{id}" is one class however
// many ids there are. Middleware can key it with any function; the cost
// model holds at most Config.MaxRoutes classes.
type RouteKey struct {
	Method, Route string
}

// CostConfig configures the cost model.
type CostConfig struct {
	// Weight is the weight of a new measurement in a route's
	// exponentially weighted moving average of cost, in (0, 1]; 0.2 if 0.
	Weight float64
	// Initial is the cost predicted for a route nothing is known of
	// before any route completed; after that, the average of all routes
	// is. 1 ms if 0.
	Initial time.Duration
	// MaxRoutes bounds the routes tracked (a flood of distinct keys must
	// not exhaust memory): past it, new routes share one entry. 1024 if 0.
	MaxRoutes int
}

// costModel predicts a request's cost (CPU time, in microseconds) from
// the measured cost of its route's recent completions: an exponentially
// weighted moving average per route, in integer microseconds. It is not
// safe for concurrent use: the Throttler calls it under its lock.
type costModel struct {
	weight  float64
	routes  map[RouteKey]*routeCost
	max     int
	other   routeCost // routes past max
	all     routeCost // every completion, for a new route
	initial int64
}

type routeCost struct {
	avg float64 // µs
	n   uint64
	// base is the route's latency without contention (µs; 0: unknown),
	// and probeMin the least latency seen in the current probe: the
	// adaptive limit's baseline (adaptive.go).
	base, probeMin float64
}

func newCostModel(c CostConfig) *costModel {
	m := &costModel{weight: c.Weight, max: c.MaxRoutes, initial: c.Initial.Microseconds()}
	if m.weight <= 0 || m.weight > 1 {
		m.weight = 0.2
	}
	if m.max <= 0 {
		m.max = 1024
	}
	if m.initial <= 0 {
		m.initial = 1000
	}
	m.routes = make(map[RouteKey]*routeCost)
	return m
}

// predict returns the predicted cost of a request of route k in µs (at
// least 1, so that every queued request counts against the bound).
func (m *costModel) predict(k RouteKey) int64 {
	r := m.routes[k]
	if r == nil && len(m.routes) >= m.max {
		r = &m.other
	}
	switch {
	case r != nil && r.n > 0:
		return max(1, int64(r.avg+0.5))
	case m.all.n > 0:
		return max(1, int64(m.all.avg+0.5))
	}
	return m.initial
}

// observe records a completion of route k that cost us µs, and returns
// the route's entry.
func (m *costModel) observe(k RouteKey, us int64) *routeCost {
	r := m.routes[k]
	if r == nil {
		if len(m.routes) >= m.max {
			r = &m.other
		} else {
			r = &routeCost{}
			m.routes[k] = r
		}
	}
	r.add(float64(us), m.weight)
	m.all.add(float64(us), m.weight)
	return r
}

func (r *routeCost) add(x, w float64) {
	if r.n == 0 {
		r.avg = x
	} else {
		r.avg += w * (x - r.avg)
	}
	r.n++
}

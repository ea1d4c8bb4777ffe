package throttle

import (
	"math"
	"math/rand/v2"
	"time"
)

// AdaptiveConfig configures the adaptive concurrency limit: a
// Vegas-style controller on each request's latency relative to its
// route's latency without contention (its baseline).
//
// Every Window (and at least MinSamples completions) it takes the mean
// stretch of the window's completions, s = latency / baseline of the
// request's route (normalizing by route keeps a mix of cheap and dear
// requests from reading as congestion), and estimates the requests
// queued inside the server (on its processors, locks, connection pools)
// as q = limit × (1 − 1/s), Vegas's estimate. Below Alpha queued, and
// only if the window filled the limit, the limit grows by one; above
// Beta it shrinks by half the excess (at least one, at most a quarter of
// the limit); in between it holds.
//
// The baselines are not averages of recent latency (Netflix's Gradient2
// tracks a long-term average, which under sustained modest overload
// drifts up to the inflated latency, so the gradient reads "no
// congestion" and the limit creeps up). A route's baseline falls to any
// lower latency it shows, and can rise only in a probe: every
// ProbeInterval (±25%, at random) the limit drops to a quarter until
// MinSamples requests started at that concurrency complete, or one has
// and a Window has passed, the baselines become the least latency of each route seen
// in the probe, and the limit returns to what it was. A probe lowers the
// limit to a quarter, not to a floor, for a few milliseconds, and
// arrivals wait in the cost-bounded queue meanwhile instead of being
// refused (Envoy's adaptive concurrency filter drops to its minimum
// concurrency for the whole re-measurement and answers 503 to what
// exceeds it: a burst of refusals at every interval).
type AdaptiveConfig struct {
	// MinLimit and MaxLimit bound the limit; 1 and 1000 if 0.
	MinLimit, MaxLimit int
	// Window is the shortest time between two changes of the limit;
	// 100 ms if 0.
	Window time.Duration
	// MinSamples is the fewest completions a window (and a probe) needs;
	// 16 if 0.
	MinSamples int
	// ProbeInterval is the mean time between two re-measurements of the
	// baselines; 30 s if 0.
	ProbeInterval time.Duration
	// Alpha and Beta are the queued-request thresholds; if 0,
	// max(2, 3·log10 limit) and max(4, 6·log10 limit) as in Netflix's Vegas.
	Alpha, Beta float64
	// Seed seeds the probe's jitter (tests set it; 0 is a fixed seed).
	Seed uint64
}

type vegas struct {
	c     AdaptiveConfig
	limit int
	rng   *rand.Rand

	windowStart int64
	n           int
	sum         float64 // of the window's stretches
	maxLoad     int

	nextProbe              int64
	probing                bool
	probeStart             int64
	probeLimit, savedLimit int
	probeRoutes            []*routeCost
}

func newVegas(c AdaptiveConfig, initial int) *vegas {
	if c.MinLimit <= 0 {
		c.MinLimit = 1
	}
	if c.MaxLimit <= 0 {
		c.MaxLimit = 1000
	}
	c.MaxLimit = max(c.MaxLimit, c.MinLimit)
	if c.Window <= 0 {
		c.Window = 100 * time.Millisecond
	}
	if c.MinSamples <= 0 {
		c.MinSamples = 16
	}
	if c.ProbeInterval <= 0 {
		c.ProbeInterval = 30 * time.Second
	}
	return &vegas{c: c, limit: min(max(initial, c.MinLimit), c.MaxLimit), rng: rand.New(rand.NewPCG(c.Seed, 0x7e9a5))}
}

// sample takes one completion of route rc that started at start with
// load requests in flight (itself included) and took wall µs; it returns
// the limit.
func (v *vegas) sample(rc *routeCost, now, start, wall int64, load int) int {
	if v.windowStart == 0 {
		v.windowStart = now
		v.nextProbe = now + v.c.Window.Microseconds() // measure baselines early
	}
	w := float64(max(wall, 1))
	if rc.base == 0 || w < rc.base {
		rc.base = w
	}
	if v.probing && start >= v.probeStart && load <= v.probeLimit {
		if rc.probeMin == 0 {
			v.probeRoutes = append(v.probeRoutes, rc)
		}
		if rc.probeMin == 0 || w < rc.probeMin {
			rc.probeMin = w
		}
		v.n++
	} else if !v.probing {
		v.sum += min(w/rc.base, 20)
		v.n++
		v.maxLoad = max(v.maxLoad, load)
	}
	switch {
	case v.probing:
		// A probe ends at MinSamples samples, or after a Window with
		// at least one: on a slow host it must not hold the limit low.
		if v.n >= v.c.MinSamples || v.n > 0 && now-v.probeStart >= v.c.Window.Microseconds() {
			v.endWindow(now)
		}
	case v.n >= v.c.MinSamples && now-v.windowStart >= v.c.Window.Microseconds():
		v.endWindow(now)
	}
	return v.limit
}

func (v *vegas) endWindow(now int64) {
	defer func() { v.windowStart, v.n, v.sum, v.maxLoad = now, 0, 0, 0 }()
	if v.probing {
		for _, rc := range v.probeRoutes {
			rc.base, rc.probeMin = rc.probeMin, 0
		}
		v.probeRoutes = v.probeRoutes[:0]
		v.probing, v.limit = false, v.savedLimit
		iv := float64(v.c.ProbeInterval.Microseconds())
		v.nextProbe = now + int64(iv*(0.75+0.5*v.rng.Float64()))
		return
	}
	v.adjust(v.sum / float64(v.n))
	if now >= v.nextProbe {
		v.probing, v.probeStart, v.savedLimit = true, now, v.limit
		v.probeLimit = max(v.c.MinLimit, v.limit/4)
		v.limit = v.probeLimit
	}
}

// adjust moves the limit by Vegas's rule on the window's mean stretch s.
func (v *vegas) adjust(s float64) {
	l := float64(v.limit)
	q := l * (1 - 1/max(s, 1))
	alpha, beta := v.c.Alpha, v.c.Beta
	if alpha <= 0 {
		alpha = max(2, 3*math.Log10(l))
	}
	if beta <= 0 {
		beta = max(4, 6*math.Log10(l))
	}
	switch {
	case q < alpha && v.maxLoad >= v.limit:
		v.limit++
	case q > beta:
		v.limit -= min(max(1, int((q-beta)/2)), max(1, v.limit/4))
	}
	v.limit = min(max(v.limit, v.c.MinLimit), v.c.MaxLimit)
}

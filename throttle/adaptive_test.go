package throttle

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/floodgate/floodgate/clock"
)

// sim is a deterministic server on a manual clock: cpus processors shared
// equally by the requests running (processor sharing, as a CPU-bound Go
// server behaves), Poisson arrivals of a mix of cheap (1 ms) and dear
// (5 ms) requests, all through a real Throttler.
type sim struct {
	t       *testing.T
	th      *Throttler
	m       *clock.Manual
	rng     *rand.Rand
	cpus    float64
	rate    float64 // arrivals per µs
	running []*simJob
	waiting []*simJob

	// per 100 ms of simulated time: refusals (queue full, evicted,
	// expired), limits, whether a probe ran
	refusals, limits []int
	probed           []bool
	stretchSum       float64
	stretchN         int
	early            int     // refusals with the queue's cost under its bound (on the predicted wait)
	busy             float64 // processor-µs used
}

type simJob struct {
	tk         *Ticket
	work, done float64 // µs
	started    int64
}

const simDT = 250 // µs per step

const meanWork = 0.8*1000 + 0.2*5000 // µs

func newSim(t *testing.T, load float64, c Config) *sim {
	if raceEnabled {
		t.Skip("a deterministic single-goroutine simulation: nothing for the race detector")
	}
	m := clock.NewManual(epoch)
	c.Clock = m
	s := &sim{t: t, th: New(c), m: m, rng: rand.New(rand.NewPCG(42, 42)), cpus: 2}
	s.rate = load * s.cpus / meanWork
	return s
}

func (s *sim) run(d time.Duration) {
	steps := int(d.Microseconds() / simDT)
	for i := range steps {
		if i%(100_000/simDT) == 0 {
			s.refusals = append(s.refusals, 0)
			s.limits = append(s.limits, 0)
			s.probed = append(s.probed, false)
		}
		s.step()
		w := len(s.limits) - 1
		s.limits[w] = max(s.limits[w], int(s.th.stats.limit.Load()))
		if s.th.adaptive.probing {
			s.probed[w] = true
		}
	}
}

func (s *sim) step() {
	share := 1.0
	if n := float64(len(s.running)); n > s.cpus {
		share = s.cpus / n
	}
	s.busy += min(float64(len(s.running)), s.cpus) * simDT
	s.m.Advance(simDT * time.Microsecond)
	now := s.m.NowMicro()
	changed := false
	kept := s.running[:0]
	var done []*simJob
	for _, j := range s.running {
		j.done += simDT * share
		if j.done >= j.work {
			done = append(done, j)
		} else {
			kept = append(kept, j)
		}
	}
	s.running = kept
	for _, j := range done {
		j.tk.DoneCost(time.Duration(j.work) * time.Microsecond)
		s.stretchSum += float64(now-j.started) / j.work
		s.stretchN++
		changed = true
	}
	if s.rng.Float64() < s.rate*simDT {
		s.arrive(now)
		changed = true
	}
	if changed {
		s.poll(now)
	}
}

func (s *sim) arrive(now int64) {
	k, work := route("/cheap"), 1000.0
	if s.rng.IntN(5) == 0 {
		k, work = route("/dear"), 5000
	}
	crit := Sheddable
	if s.rng.IntN(5) == 0 {
		crit = Critical
	}
	queued := s.th.stats.queuedCost.Load()
	tk, err := s.th.Enter(k, crit, 0)
	if err != nil {
		s.refusals[len(s.refusals)-1]++
		if queued+int64(work) <= s.th.maxCost {
			s.early++
		}
		return
	}
	j := &simJob{tk: tk, work: work, started: now}
	if tk.ready == nil {
		s.running = append(s.running, j)
	} else {
		s.waiting = append(s.waiting, j)
	}
}

func (s *sim) poll(now int64) {
	kept := s.waiting[:0]
	for _, j := range s.waiting {
		switch state(j.tk) {
		case waiting:
			kept = append(kept, j)
		case admitted:
			j.started = now
			s.running = append(s.running, j)
		default:
			s.refusals[len(s.refusals)-1]++
		}
	}
	s.waiting = kept
}

func median(xs []int) int {
	c := slices.Clone(xs)
	slices.Sort(c)
	return c[len(c)/2]
}

func adaptiveConfig() Config {
	return Config{Limit: 2, MaxQueueCost: 100 * time.Millisecond, MaxWait: 200 * time.Millisecond,
		Adaptive: &AdaptiveConfig{ProbeInterval: 10 * time.Second, Seed: 1}}
}

// Under modest overload (1.3× capacity, for 5 simulated minutes and 30
// probes) the limit settles and stays: it does not creep upward as
// Gradient2's does, and the processors stay busy.
func TestAdaptiveNoCreepUnderModestOverload(t *testing.T) {
	s := newSim(t, 1.3, adaptiveConfig())
	s.run(5 * time.Minute)
	perMinute := func(i int) int { return median(s.limits[i*600 : (i+1)*600]) }
	first, last := perMinute(0), perMinute(4)
	maxLast := slices.Max(s.limits[1200:])
	u := s.busy / (s.cpus * float64(5*time.Minute/time.Microsecond))
	t.Logf("median limit by minute: %d %d %d; max in the last minute %d; mean stretch %.2f; utilization %.1f%%",
		first, perMinute(1), last, maxLast, s.stretchSum/float64(s.stretchN), 100*u)
	if last > first+1 {
		t.Errorf("the limit crept from %d to %d", first, last)
	}
	// Vegas's fixed point on 2 processors: 2 + between α and β queued (2..4).
	if maxLast > 8 {
		t.Errorf("limit reached %d in the last minute, far past 2 processors + β", maxLast)
	}
	if u < 0.95 {
		t.Errorf("utilization %.2f under overload: the limit is too low", u)
	}
}

// Re-measuring the baselines does not burst refusals: at full load the
// windows with a probe refuse about as much as those without.
//
// The second pair of runs has a queue whose bound is past what the
// server drains within MaxWait, so arrivals are refused at once on their
// predicted wait (wouldExpire): a probe must not make that burst either.
func TestAdaptiveProbeNoRefusalBurst(t *testing.T) {
	failFast := adaptiveConfig()
	failFast.MaxQueueCost, failFast.MaxWait = time.Second, 100*time.Millisecond
	for i, load := range []float64{0.9, 1.3, 1.3, 3} {
		c := adaptiveConfig()
		if i >= 2 {
			c = failFast
		}
		s := newSim(t, load, c)
		s.run(2 * time.Minute)
		var probeMax, probes, other []int
		for i := 20; i < len(s.refusals)-1; i++ { // after the first 2 s
			if s.probed[i] || s.probed[i-1] {
				probes = append(probes, s.refusals[i]+s.refusals[i+1])
			} else {
				other = append(other, s.refusals[i]+s.refusals[i+1])
			}
		}
		probeMax = append(probeMax, slices.Max(probes))
		slices.Sort(other)
		p99 := other[len(other)*99/100]
		t.Logf("load %.1f: %d probe windows, refusals per 200 ms around a probe max %d; elsewhere p99 %d max %d; %d on the predicted wait",
			load, len(probes), probeMax[0], p99, other[len(other)-1], s.early)
		if i >= 2 && s.early == 0 {
			t.Errorf("load %.1f: no refusal on the predicted wait: the run does not test it", load)
		}
		if probeMax[0] > max(3, 2*p99) {
			t.Errorf("load %.1f: a probe caused %d refusals in 200 ms; p99 elsewhere %d", load, probeMax[0], p99)
		}
	}
}

// The drain rate the queue's predicted wait divides by is the server's
// capacity, 2 processors here: measured only while requests wait, and
// not lowered by the probes (a probe runs below the limit for a moment;
// counted, each would shorten every wait budget for a while and refuse
// more at once). 40 s at 3× capacity, 3 to 4 probes.
func TestDrainRateIgnoresProbes(t *testing.T) {
	c := adaptiveConfig()
	c.MaxQueueCost, c.MaxWait = time.Second, 100*time.Millisecond
	s := newSim(t, 3, c)
	s.run(2 * time.Second)
	lo, hi, probes := 1e9, 0.0, 0
	for range 400 {
		s.run(100 * time.Millisecond)
		lo, hi = min(lo, s.th.drain.rate), max(hi, s.th.drain.rate)
		if s.probed[len(s.probed)-1] {
			probes++
		}
	}
	t.Logf("drain rate %.3f..%.3f over %d probe windows", lo, hi, probes)
	if probes == 0 {
		t.Fatal("no probe ran: the test tests nothing")
	}
	if lo < 0.975*s.cpus || hi > 1.025*s.cpus {
		t.Errorf("drain rate %.3f..%.3f, want within 2.5%% of %v processors", lo, hi, s.cpus)
	}
}

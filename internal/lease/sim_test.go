package lease

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/floodgate/floodgate/clock"
)

// The deterministic simulation: clients on a manual clock refresh their
// leases, shift their demand, join, leave, crash (a crashed client stops
// refreshing but keeps using its lease until it expires) and lose
// responses (the client stays on its old lease). After every step the
// capacity in the leases the clients really hold is checked against the
// resource's capacity: 0 over-grant, at every instant.

type simState int

const (
	absent  simState = iota // not started yet, or left
	active                  // refreshing
	crashed                 // no longer refreshing; uses its lease until it expires
)

type simClient struct {
	id    string
	prio  int64
	wants float64
	lease Lease // the newest lease it received
	next  int64 // its next refresh, µs
	state simState
}

type sim struct {
	t       testing.TB
	tb      *Table
	clk     *clock.Manual
	rng     *rand.Rand
	clients []*simClient
	loss    float64 // the share of responses lost
	count   bool    // count over-grants instead of failing (the control experiment)
	step    time.Duration
	incarn  int
	out     []Lease

	// figures
	steps, overSteps      int
	maxRatio              float64 // the most the clients held / capacity
	utilSum               float64 // the sum over saturated steps of in-use / capacity
	utilN                 int
	utilMin               float64
	gets, lost, tableMiss int
}

type simOpts struct {
	alg      Algorithm
	capacity float64
	clients  int // started at once
	spare    int // absent at first, to join later
	loss     float64
	seed     uint64
	step     time.Duration
	extra    string // more resource fields
	table    Options
}

func newSim(t testing.TB, o simOpts) *sim {
	extra := o.extra
	if o.alg == Static && extra == "" {
		extra = fmt.Sprintf("    static_capacity: %v\n", 3*o.capacity/float64(o.clients))
	}
	clk := clock.NewManual(t0)
	o.table.Clock = clk
	s := &sim{t: t, clk: clk, rng: rand.New(rand.NewPCG(o.seed, 7)), loss: o.loss, step: o.step, utilMin: math.Inf(1)}
	s.tb = New(mustConfig(t, oneResource(o.alg, o.capacity, extra)), o.table)
	if s.step == 0 {
		s.step = time.Second
	}
	for i := 0; i < o.clients+o.spare; i++ {
		c := s.newClient()
		if i < o.clients {
			s.start(c)
		}
	}
	return s
}

func (s *sim) newClient() *simClient {
	s.incarn++
	c := &simClient{id: fmt.Sprint("c", s.incarn)}
	s.clients = append(s.clients, c)
	return c
}

// start makes c active with a random demand and refresh phase.
func (s *sim) start(c *simClient) {
	c.state = active
	c.prio = int64(s.rng.IntN(3))
	c.wants = s.demand()
	c.lease = Lease{}
	c.next = s.clk.NowMicro() + s.rng.Int64N(5_000_000)
}

// demand draws a client's wants: mostly small, some large.
func (s *sim) demand() float64 {
	if s.rng.IntN(4) == 0 {
		return float64(20 + s.rng.IntN(200))
	}
	return float64(1 + s.rng.IntN(20))
}

// holds is what c really holds now: its newest lease while unexpired.
func (c *simClient) holds(now int64) Lease {
	if c.state == absent || c.lease.Expiry.UnixMicro() <= now {
		return Lease{}
	}
	return c.lease
}

// refresh runs every active client's due refresh.
func (s *sim) refresh() {
	now := s.clk.NowMicro()
	for _, c := range s.clients {
		if c.state != active || c.next > now {
			continue
		}
		var err error
		s.out, err = s.tb.Get(c.id, []Request{{Resource: "r", Priority: c.prio, Wants: c.wants, Has: c.holds(now)}}, s.out)
		if err != nil {
			s.t.Fatal(err)
		}
		s.gets++
		if s.rng.Float64() < s.loss {
			s.lost++ // the response is lost: c stays on its old lease
		} else {
			c.lease = s.out[0]
		}
		// refresh every interval, jittered by up to 10% early
		r := s.out[0].Refresh.Microseconds()
		c.next = now + r - s.rng.Int64N(r/10+1)
	}
}

// churn applies random events: demand shifts, joins, leaves, crashes.
func (s *sim) churn(shift, join, leave, crash float64) {
	for _, c := range s.clients {
		switch c.state {
		case active:
			switch x := s.rng.Float64(); {
			case x < crash:
				c.state = crashed
			case x < crash+leave:
				s.tb.Release(c.id, []string{"r"})
				c.state = absent
				c.lease = Lease{}
			case x < crash+leave+shift:
				c.wants = s.demand()
			}
		case absent, crashed:
			if s.rng.Float64() < join {
				// a new process: a new id (ids are unique per process)
				nc := s.newClient()
				s.start(nc)
				c.state = -1 // retired (a crashed one's lease still counts until it expires)
			}
		}
	}
}

// check asserts the invariant now and gathers the figures. limit is the
// capacity the clients may hold in all (in units).
func (s *sim) check(limit int64, what string) { s.checkAll(limit, what, true) }

// checkAll is check; bounded says whether the table has seen every lease
// held (not so after a failover, until the old master's leases expire).
func (s *sim) checkAll(limit int64, what string, bounded bool) {
	now := s.clk.NowMicro()
	var held, inUse, wants int64
	for _, c := range s.clients {
		h := units(c.holds(now).Capacity)
		held += h
		if c.state == active {
			inUse += min(h, units(c.wants))
			wants += units(c.wants)
		}
	}
	table := units(s.tb.Outstanding("r"))
	s.steps++
	if held > limit && s.count {
		s.overSteps++
		s.maxRatio = max(s.maxRatio, float64(held)/float64(limit))
		return
	}
	if held > limit || table > limit {
		s.overSteps++
		s.t.Fatalf("%s at %v: clients hold %v, the table counts %v: over the capacity %v",
			what, time.Duration((now-t0.UnixMicro())*1000), fromUnits(held), fromUnits(table), fromUnits(limit))
	}
	if bounded && held > table {
		s.t.Fatalf("%s at %v: clients hold %v but the table counts only %v", what,
			time.Duration((now-t0.UnixMicro())*1000), fromUnits(held), fromUnits(table))
	}
	if limit > 0 {
		s.maxRatio = max(s.maxRatio, float64(held)/float64(limit))
		if wants > limit {
			u := float64(inUse) / float64(limit)
			s.utilSum += u
			s.utilN++
			s.utilMin = min(s.utilMin, u)
		}
	}
}

func (s *sim) advance() { s.clk.Advance(s.step) }

// TestSimulationNoOverGrant: 120 clients (and 40 more joining) with
// shifting demand, joins, leaves, crashes and 5% lost responses, for every
// algorithm, 20 simulated minutes: at every step the clients hold at most
// the capacity, and the table's count bounds what they hold.
func TestSimulationNoOverGrant(t *testing.T) {
	for _, alg := range algorithms {
		t.Run(string(alg), func(t *testing.T) {
			s := newSim(t, simOpts{alg: alg, capacity: 1000, clients: 120, spare: 40, loss: 0.05, seed: 1})
			capU := toUnits(1000)
			for i := 0; i < 1200; i++ {
				s.churn(0.01, 0.01, 0.002, 0.002)
				s.refresh()
				s.check(capU, string(alg))
				s.advance()
			}
			if s.gets < 20000 || s.lost < 700 || s.incarn < 180 {
				t.Fatalf("only %d gets, %d lost: the simulation did not run", s.gets, s.lost)
			}
			t.Logf("%s: %d steps, %d gets, %d lost, most held %.4f of capacity, utilization while saturated %.2f%% (min %.2f%%, %d steps)",
				alg, s.steps, s.gets, s.lost, s.maxRatio, 100*s.utilSum/float64(max(1, s.utilN)), 100*s.utilMin, s.utilN)
		})
	}
}

// TestSimulationParentCeiling: an intermediate's capacity comes from its
// parent, which shrinks and grows it mid-run and at last stops answering.
// At every step the clients hold at most what the parent may consider the
// intermediate holds (the largest of its unexpired parent leases), at most
// the new capacity once the old parent lease has expired, and nothing once
// the parent's last lease has ended.
func TestSimulationParentCeiling(t *testing.T) {
	for _, alg := range []Algorithm{FairShare, ProportionalShare, None} {
		t.Run(string(alg), func(t *testing.T) {
			s := newSim(t, simOpts{alg: alg, capacity: 1e6, clients: 100, spare: 20, loss: 0.05, seed: 2, table: Options{Intermediate: true}})
			type please struct{ units, exp int64 }
			var parents []please
			schedule := []float64{1000, 1000, 1000, 300, 300, 300, 300, 800, 800, 50, 50, 50, 50, 600, 600, 600}
			for i := 0; i < 1200; i++ {
				now := s.clk.NowMicro()
				if i%20 == 0 && i/20 < len(schedule) { // the parent answers every 20 s, a 60 s lease
					capa := schedule[i/20]
					l := Lease{Capacity: capa, Expiry: s.clk.Now().Add(time.Minute)}
					s.tb.SetParent("r", l)
					parents = append(parents, please{toUnits(capa), l.Expiry.UnixMicro()})
				}
				var limit int64
				for _, p := range parents {
					if p.exp > now {
						limit = max(limit, p.units)
					}
				}
				s.churn(0.01, 0.01, 0.002, 0.002)
				s.refresh()
				s.check(limit, "parent "+string(alg))
				for _, c := range s.clients {
					if l := c.holds(now); l.Capacity > 0 && l.Expiry.UnixMicro() > parents[len(parents)-1].exp {
						t.Fatalf("a lease until %v outlives the parent's %v", l.Expiry, time.UnixMicro(parents[len(parents)-1].exp))
					}
				}
				s.advance()
			}
			if held := s.tb.Outstanding("r"); held != 0 {
				t.Fatalf("the parent's leases ended, yet %v is outstanding", held)
			}
		})
	}
}

// TestSimulationLearningFailover: a master serves 100 clients; it dies and
// a new master (an empty Table in learning mode) takes over. The clients
// keep the leases of the old master and report them. At every step the sum
// of what all clients hold, from either master, stays within the capacity;
// newcomers get nothing until learning ends; afterwards the new master
// serves the capacity in full again.
func TestSimulationLearningFailover(t *testing.T) {
	for _, alg := range []Algorithm{FairShare, ProportionalShare, Static, None} {
		t.Run(string(alg), func(t *testing.T) {
			s := newSim(t, simOpts{alg: alg, capacity: 1000, clients: 100, spare: 30, loss: 0.05, seed: 3})
			capU := toUnits(1000)
			for i := 0; i < 300; i++ {
				s.churn(0.01, 0, 0.001, 0.001)
				s.refresh()
				s.check(capU, "old master")
				s.advance()
			}
			// Failover: the new master's table, clients unaware of anything
			// but a new server.
			old := s.tb
			s.tb = New(mustConfig(t, oneResource(alg, 1000, simExtra(alg))), Options{Clock: s.clk})
			s.tb.StartLearning()
			learnEnd := s.clk.NowMicro() + time.Minute.Microseconds()
			for i := 0; i < 400; i++ {
				s.churn(0.01, 0.01, 0.001, 0.001)
				s.refresh()
				// the new master's count bounds what the clients it has seen
				// hold; all leases held, old master's included, stay within
				// the capacity (check does both).
				s.checkAll(capU, "after failover", s.clk.NowMicro() >= learnEnd)
				now := s.clk.NowMicro()
				if now < learnEnd {
					for _, c := range s.clients {
						if c.state == active && c.lease.Capacity > 0 && s.tb.known(c.id) && !old.known(c.id) {
							t.Fatalf("newcomer %s got %v in learning mode", c.id, c.lease.Capacity)
						}
					}
				}
				s.advance()
			}
			if s.utilN > 0 {
				t.Logf("%s: utilization while saturated over the run %.2f%%", alg, 100*s.utilSum/float64(s.utilN))
			}
			if o := s.tb.Outstanding("r"); o < 500 && alg != Static {
				t.Fatalf("after learning, only %v outstanding", o)
			}
		})
	}
}

// The control experiment of the failover: the same run with a new master
// that does not start learning mode over-grants. This shows that the test
// above can fail, and why learning mode is needed.
func TestSimulationFailoverWithoutLearningOverGrants(t *testing.T) {
	s := newSim(t, simOpts{alg: FairShare, capacity: 1000, clients: 100, loss: 0.05, seed: 3})
	s.count = true
	for i := 0; i < 300; i++ {
		s.churn(0.01, 0, 0.001, 0.001)
		s.refresh()
		s.checkAll(toUnits(1000), "old master", false)
		s.advance()
	}
	s.tb = New(mustConfig(t, oneResource(FairShare, 1000, "")), Options{Clock: s.clk}) // no StartLearning
	for i := 0; i < 100; i++ {
		s.churn(0.01, 0.01, 0.001, 0.001)
		s.refresh()
		s.checkAll(toUnits(1000), "after failover", false)
		s.advance()
	}
	if s.overSteps == 0 {
		t.Fatal("a new master without learning mode did not over-grant: the failover test proves nothing")
	}
	t.Logf("without learning mode: %d steps over-granted, at most %.0f%% of capacity held", s.overSteps, 100*s.maxRatio)
}

func simExtra(alg Algorithm) string {
	if alg == Static {
		return fmt.Sprintf("    static_capacity: %v\n", 3*1000/float64(100))
	}
	return ""
}

// known reports whether the table has client as a client of "r" (tests).
func (t *Table) known(client string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	rs := t.res["r"]
	return rs != nil && rs.clients[client] != nil
}

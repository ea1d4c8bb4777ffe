package lease

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/floodgate/floodgate/clock"
)

// A three-level tree on one manual clock: a root with the capacity, two
// regions and four leaves (intermediates: their capacity is their parent's
// grant), 100 clients on the leaves. Every server asks its parent every
// 5 s for its clients' demand (Demand → GetServer → SetParent), 5 % of
// those answers and of the clients' answers are lost, demand shifts, and
// the root's capacity is cut mid-run; later one region cannot reach the
// root for longer than a lease (its clients must then hold nothing, until
// it reaches the root again). At every step the leaves' clients
// hold in all at most what the root may consider handed out (the largest
// of its capacities whose leases may still be held), and each
// intermediate's clients at most the largest unexpired lease it got.
func TestTreeThreeLevels(t *testing.T) {
	clk := clock.NewManual(t0)
	rng := rand.New(rand.NewPCG(9, 9))
	cfg := func(capa float64) *Config { return mustConfig(t, oneResource(FairShare, capa, "")) }
	root := New(cfg(1000), Options{Clock: clk})
	type server struct {
		id      string
		tb      *Table
		parent  *server
		leases  []Lease // the parent's leases it got
		nextAsk int64
	}
	var servers []*server
	rootS := &server{id: "root", tb: root}
	for r := 0; r < 2; r++ {
		region := &server{id: fmt.Sprint("region", r), tb: New(cfg(1e9), Options{Clock: clk, Intermediate: true}), parent: rootS,
			nextAsk: clk.NowMicro() + rng.Int64N(5e6)}
		servers = append(servers, region)
		for l := 0; l < 2; l++ {
			servers = append(servers, &server{id: fmt.Sprintf("leaf%d%d", r, l), tb: New(cfg(1e9), Options{Clock: clk, Intermediate: true}),
				parent: region, nextAsk: clk.NowMicro() + rng.Int64N(5e6)})
		}
	}
	var leaves []*server
	for _, s := range servers {
		if s.id[:4] == "leaf" {
			leaves = append(leaves, s)
		}
	}
	type client struct {
		id    string
		leaf  *server
		wants float64
		lease Lease
		next  int64
	}
	clients := make([]*client, 100)
	for i := range clients {
		clients[i] = &client{id: fmt.Sprint("c", i), leaf: leaves[i%4], wants: float64(5 + rng.IntN(40)), next: clk.NowMicro() + rng.Int64N(5e6)}
	}
	rootCaps := []struct {
		capa float64
		exp  int64 // when the last lease granted under it expires
	}{{1000, 0}}
	held := func(now int64, on *server) (sum int64) {
		for _, c := range clients {
			if (on == nil || c.leaf == on || c.leaf.parent == on) && c.lease.Expiry.UnixMicro() > now {
				sum += units(c.lease.Capacity)
			}
		}
		return sum
	}
	var utilSum float64
	partitionChecked := 0
	var utilN int
	for step := 0; step < 1500; step++ { // 25 minutes in 1 s steps
		now := clk.NowMicro()
		if step == 600 { // the root's capacity is cut to 400
			rootCaps[len(rootCaps)-1].exp = now + time.Minute.Microseconds()
			rootCaps = append(rootCaps, struct {
				capa float64
				exp  int64
			}{400, 0})
			root.Reload(cfg(400))
		}
		if step%60 == 0 {
			for _, c := range clients {
				if rng.IntN(4) == 0 {
					c.wants = float64(5 + rng.IntN(40))
				}
			}
		}
		for _, s := range servers { // regions first, then leaves: the order of the slice
			if s.nextAsk > now {
				continue
			}
			d := s.tb.Demand()
			for i := range d {
				if len(s.leases) > 0 {
					d[i].Has = s.leases[len(s.leases)-1]
				}
			}
			out, err := s.parent.tb.GetServer(s.id, d, nil)
			if err != nil {
				t.Fatal(err)
			}
			s.nextAsk = now + 5e6 - rng.Int64N(5e5)
			partitioned := s.id == "region0" && step >= 1000 && step < 1150 // region0 cannot reach the root
			if len(out) == 0 || rng.Float64() < 0.05 || partitioned {
				continue // lost
			}
			s.tb.SetParent("r", out[0])
			s.leases = append(s.leases, out[0])
			if out[0].Refresh < 5*time.Second {
				s.nextAsk = now + out[0].Refresh.Microseconds()
			}
		}
		for _, c := range clients {
			if c.next > now {
				continue
			}
			has := c.lease
			if has.Expiry.UnixMicro() <= now {
				has = Lease{}
			}
			out, err := c.leaf.tb.Get(c.id, []Request{{Resource: "r", Wants: c.wants, Has: has}}, nil)
			if err != nil {
				t.Fatal(err)
			}
			c.next = now + out[0].Refresh.Microseconds() - rng.Int64N(out[0].Refresh.Microseconds()/10+1)
			if rng.Float64() >= 0.05 {
				c.lease = out[0]
			}
		}
		// The invariants.
		var limit int64
		for _, rc := range rootCaps {
			if rc.exp == 0 || rc.exp > now {
				limit = max(limit, toUnits(rc.capa))
			}
		}
		if h := held(now, nil); h > limit {
			t.Fatalf("step %d: the clients hold %v, over the root's capacity %v", step, fromUnits(h), fromUnits(limit))
		}
		for _, s := range servers {
			var got int64
			for _, l := range s.leases {
				if l.Expiry.UnixMicro() > now {
					got = max(got, units(l.Capacity))
				}
			}
			if h := held(now, s); h > got {
				t.Fatalf("step %d: %s's clients hold %v, over its largest unexpired lease %v", step, s.id, fromUnits(h), fromUnits(got))
			}
		}
		if step == 1140 { // 140 s into the partition: the region's last lease (60 s) has expired
			if h := held(now, servers[0]); h != 0 {
				t.Fatalf("the partitioned region's clients hold %v", fromUnits(h))
			}
			partitionChecked++
		}
		if step >= 120 && step < 600 || step >= 780 && step < 1000 || step >= 1300 {
			var wants float64
			for _, c := range clients {
				wants += c.wants
			}
			capa := rootCaps[len(rootCaps)-1].capa
			if wants > capa {
				var use float64
				for _, c := range clients {
					if c.lease.Expiry.UnixMicro() > now {
						use += min(c.lease.Capacity, c.wants)
					}
				}
				utilSum += use / capa
				utilN++
			}
		}
		clk.Advance(time.Second)
	}
	u := utilSum / float64(max(1, utilN))
	t.Logf("three levels: utilization while saturated %.2f%% over %d steps", 100*u, utilN)
	if partitionChecked == 0 {
		t.Fatal("the partitioned region's clients were never seen holding nothing")
	}
	if u < 0.8 {
		t.Fatalf("utilization %.2f%%: the tree does not pass the capacity down", 100*u)
	}
}

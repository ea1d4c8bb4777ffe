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
// the demand moves from one region to the other (twice), the root's
// capacity is cut mid-run; later one region cannot reach the
// root for longer than a lease (its clients must then hold nothing, until
// it reaches the root again). At every step the leaves' clients hold in
// all at most what the root may consider handed out (the largest of its
// capacities whose leases may still be held), and each intermediate's
// clients at most the largest unexpired lease it got.
func TestTreeThreeLevels(t *testing.T) {
	tr := newTree(t)
	var utilSum float64
	var utilN int
	for step := 0; step < 1500; step++ { // 25 minutes in 1 s steps
		if step == 600 {
			tr.cutRoot(400)
		}
		switch {
		case step == 300 || step == 420 || step == 1350:
			tr.swapRegions() // the demand moves from one region to the other
		case step%60 == 0:
			tr.shift()
		}
		tr.askParents(step)
		tr.refreshClients()
		tr.check(step)
		if step == 1140 { // 140 s into the partition: the region's last lease (60 s) has expired
			if h := tr.held(tr.servers[0]); h != 0 {
				t.Fatalf("the partitioned region's clients hold %v", fromUnits(h))
			}
			tr.partitionChecked = true
		}
		if step >= 120 && step < 600 || step >= 780 && step < 1000 || step >= 1300 {
			if u, ok := tr.utilization(); ok {
				utilSum += u
				utilN++
			}
		}
		tr.clk.Advance(time.Second)
	}
	u := utilSum / float64(max(1, utilN))
	t.Logf("three levels: utilization while saturated %.2f%% over %d steps", 100*u, utilN)
	if !tr.partitionChecked {
		t.Fatal("the partitioned region's clients were never checked")
	}
	if u < 0.8 {
		t.Fatalf("utilization %.2f%%: the tree does not pass the capacity down", 100*u)
	}
}

type treeServer struct {
	id      string
	tb      *Table
	parent  *treeServer
	leases  []Lease // the parent's leases it got
	nextAsk int64
}

type treeClient struct {
	id    string
	leaf  *treeServer
	prio  int64
	wants float64
	lease Lease
	next  int64
}

type rootCap struct {
	capa float64
	exp  int64 // when the last lease granted under it expires; 0: current
}

type tree struct {
	t                *testing.T
	clk              *clock.Manual
	rng              *rand.Rand
	root             *treeServer
	servers          []*treeServer // regions and leaves, each region before its leaves
	clients          []*treeClient
	caps             []rootCap
	partitionChecked bool
	swapped          bool
}

func treeConfig(t testing.TB, capa float64) *Config {
	return mustConfig(t, oneResource(FairShare, capa, ""))
}

func newTree(t *testing.T) *tree {
	clk := clock.NewManual(t0)
	tr := &tree{t: t, clk: clk, rng: rand.New(rand.NewPCG(9, 9)), caps: []rootCap{{1000, 0}}}
	tr.root = &treeServer{id: "root", tb: New(treeConfig(t, 1000), Options{Clock: clk})}
	server := func(id string, parent *treeServer) *treeServer {
		s := &treeServer{id: id, tb: New(treeConfig(t, 1e9), Options{Clock: clk, Intermediate: true}), parent: parent,
			nextAsk: clk.NowMicro() + tr.rng.Int64N(5e6)}
		tr.servers = append(tr.servers, s)
		return s
	}
	var leaves []*treeServer
	for r := 0; r < 2; r++ {
		region := server(fmt.Sprint("region", r), tr.root)
		for l := 0; l < 2; l++ {
			leaves = append(leaves, server(fmt.Sprintf("leaf%d%d", r, l), region))
		}
	}
	for i := 0; i < 100; i++ {
		tr.clients = append(tr.clients, &treeClient{id: fmt.Sprint("c", i), leaf: leaves[i%4],
			wants: float64(5 + tr.rng.IntN(40)), next: clk.NowMicro() + tr.rng.Int64N(5e6)})
	}
	return tr
}

// cutRoot reloads the root with a smaller capacity; the old one may be
// held for a lease length more.
func (tr *tree) cutRoot(capa float64) {
	tr.caps[len(tr.caps)-1].exp = tr.clk.NowMicro() + time.Minute.Microseconds()
	tr.caps = append(tr.caps, rootCap{capa, 0})
	tr.root.tb.Reload(treeConfig(tr.t, capa))
}

func (tr *tree) shift() {
	for _, c := range tr.clients {
		if tr.rng.IntN(4) == 0 {
			c.wants = float64(5 + tr.rng.IntN(40))
		}
	}
}

// swapRegions moves one region's clients to a higher priority band, then
// the other's: the other region's share shrinks while its clients still
// hold leases granted under its older, larger grant.
func (tr *tree) swapRegions() {
	tr.swapped = !tr.swapped
	for _, c := range tr.clients {
		inRegion0 := c.leaf.parent == tr.servers[0]
		c.prio = 0
		if inRegion0 != tr.swapped {
			c.prio = 5 // served first: the other region's share shrinks to what is left
		}
	}
}

// askParents runs the servers' due asks; region0 cannot reach the root
// from step 1000 to 1150.
func (tr *tree) askParents(step int) {
	now := tr.clk.NowMicro()
	for _, s := range tr.servers {
		if s.nextAsk > now {
			continue
		}
		out, err := s.parent.tb.GetServer(s.id, s.tb.Demand(), nil)
		if err != nil {
			tr.t.Fatal(err)
		}
		s.nextAsk = now + 5e6 - tr.rng.Int64N(5e5)
		partitioned := s.id == "region0" && step >= 1000 && step < 1150
		if len(out) == 0 || tr.rng.Float64() < 0.05 || partitioned {
			continue // lost
		}
		s.tb.SetParent("r", out[0])
		s.leases = append(s.leases, out[0])
		s.nextAsk = now + min(5e6, out[0].Refresh.Microseconds())
	}
}

func (tr *tree) refreshClients() {
	now := tr.clk.NowMicro()
	for _, c := range tr.clients {
		if c.next > now {
			continue
		}
		has := c.lease
		if has.Expiry.UnixMicro() <= now {
			has = Lease{}
		}
		out, err := c.leaf.tb.Get(c.id, []Request{{Resource: "r", Priority: c.prio, Wants: c.wants, Has: has}}, nil)
		if err != nil {
			tr.t.Fatal(err)
		}
		r := out[0].Refresh.Microseconds()
		c.next = now + r - tr.rng.Int64N(r/10+1)
		if tr.rng.Float64() >= 0.05 {
			c.lease = out[0]
		}
	}
}

// held sums the leases held now by the clients under on (nil: all).
func (tr *tree) held(on *treeServer) (sum int64) {
	now := tr.clk.NowMicro()
	for _, c := range tr.clients {
		if (on == nil || c.leaf == on || c.leaf.parent == on) && c.lease.Expiry.UnixMicro() > now {
			sum += units(c.lease.Capacity)
		}
	}
	return sum
}

func (tr *tree) check(step int) {
	now := tr.clk.NowMicro()
	var limit int64
	for _, rc := range tr.caps {
		if rc.exp == 0 || rc.exp > now {
			limit = max(limit, toUnits(rc.capa))
		}
	}
	if h := tr.held(nil); h > limit {
		tr.t.Fatalf("step %d: the clients hold %v, over the root's capacity %v", step, fromUnits(h), fromUnits(limit))
	}
	for _, s := range tr.servers {
		var got int64
		for _, l := range s.leases {
			if l.Expiry.UnixMicro() > now {
				got = max(got, units(l.Capacity))
			}
		}
		if h := tr.held(s); h > got {
			tr.t.Fatalf("step %d: %s's clients hold %v, over its largest unexpired lease %v", step, s.id, fromUnits(h), fromUnits(got))
		}
		// The parent's count of what s may hold bounds what s's clients hold:
		// else the parent would hand the difference to a sibling.
		if h, c := tr.held(s), s.parent.tb.counted(s.id, "r"); h > c {
			tr.t.Fatalf("step %d: %s's clients hold %v, but its parent counts only %v for it", step, s.id, fromUnits(h), fromUnits(c))
		}
	}
}

// utilization is the share of the root's capacity in use now, if demand
// exceeds it.
func (tr *tree) utilization() (float64, bool) {
	now := tr.clk.NowMicro()
	capa := tr.caps[len(tr.caps)-1].capa
	var wants, use float64
	for _, c := range tr.clients {
		wants += c.wants
		if c.lease.Expiry.UnixMicro() > now {
			use += min(c.lease.Capacity, c.wants)
		}
	}
	return use / capa, wants > capa
}

// counted is what the table counts client may hold of resource now (tests).
func (t *Table) counted(client, resource string) int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expire(t.clock.NowMicro())
	if rs := t.res[resource]; rs != nil && rs.clients[client] != nil {
		return rs.clients[client].counted
	}
	return 0
}

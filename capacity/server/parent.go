package server

import (
	"context"
	"time"

	"google.golang.org/grpc"

	pb "github.com/floodgate/floodgate/capacity/capacitypb"
	"github.com/floodgate/floodgate/internal/lease"
)

// ParentOptions configure RunParent.
type ParentOptions struct {
	// Address is the parent's (or any of its replicas') gRPC address.
	Address string
	// ID identifies this server to its parent (its server_id): unique and
	// stable, such as the address it advertises.
	ID string
	// Dial connects to a parent address; the connections are closed when
	// RunParent returns. Required.
	Dial func(addr string) (*grpc.ClientConn, error)
	// Poll is how often the loop looks for demand its parent has not been
	// asked about yet (a new resource, a first client); default 100ms. A
	// resource the parent leased is asked again at the lease's refresh
	// interval.
	Poll time.Duration
	// Timeout bounds each call; default 2s.
	Timeout time.Duration
}

// RunParent makes s an intermediate server under the parent (s must come
// from Options.Intermediate): until ctx ends it sends the parent its
// clients' demand, aggregated by priority band (GetServerCapacity), and
// puts each lease the parent grants into the table (lease.Table.SetParent),
// so that no grant of s exceeds the parent's grant to it and none ends
// after the parent's lease. It asks again at the parent lease's refresh
// interval, at once for demand the parent has not seen, and follows the
// parent's master redirects. When the parent cannot be reached its lease
// runs out, and so do the grants under it.
func (s *Server) RunParent(ctx context.Context, opts ParentOptions) {
	if opts.Poll <= 0 {
		opts.Poll = 100 * time.Millisecond
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 2 * time.Second
	}
	p := &parentLoop{s: s, opts: opts, addr: opts.Address, conns: map[string]*grpc.ClientConn{},
		next: map[string]time.Time{}}
	defer p.close()
	tick := time.NewTicker(opts.Poll)
	defer tick.Stop()
	for {
		if p.due() {
			p.ask(ctx)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

type parentLoop struct {
	s     *Server
	opts  ParentOptions
	addr  string // the parent replica asked now (its master, once redirected)
	conns map[string]*grpc.ClientConn
	next  map[string]time.Time // per resource, when to ask again
	retry time.Time            // after a failure, not before
}

func (p *parentLoop) now() time.Time { return time.UnixMicro(p.s.clock.NowMicro()) }

// due reports whether some resource's demand should go to the parent now.
func (p *parentLoop) due() bool {
	now := p.now()
	if now.Before(p.retry) {
		return false
	}
	for _, d := range p.s.table.Demand() {
		if at, ok := p.next[d.Resource]; !ok || !now.Before(at) {
			return true
		}
	}
	return false
}

func (p *parentLoop) client() (pb.CapacityClient, error) {
	c, ok := p.conns[p.addr]
	if !ok {
		var err error
		if c, err = p.opts.Dial(p.addr); err != nil {
			return nil, err
		}
		p.conns[p.addr] = c
	}
	return pb.NewCapacityClient(c), nil
}

func (p *parentLoop) close() {
	for _, c := range p.conns {
		c.Close()
	}
}

// ask sends all the demand to the parent and puts its leases live.
func (p *parentLoop) ask(ctx context.Context) {
	demand := p.s.table.Demand()
	req := &pb.GetServerCapacityRequest{ServerId: p.opts.ID}
	for _, d := range demand {
		r := &pb.ServerCapacityResourceRequest{ResourceId: d.Resource}
		// Has is what this server may still have out under the parent: its
		// newest parent lease, or more while its clients still hold leases
		// granted under an older, larger one. Reporting only the newest
		// would let the parent take the older one for superseded and grant
		// its capacity to a sibling while our clients still use it.
		has := d.Has
		if out := p.s.table.Outstanding(d.Resource); out > has.Capacity {
			has.Capacity = out
		}
		if has.Capacity > 0 || !has.Expiry.IsZero() {
			r.Has = toPB(has)
		}
		for _, b := range d.Bands {
			r.Wants = append(r.Wants, &pb.PriorityBandAggregate{Priority: b.Priority, NumClients: b.Clients, Wants: b.Wants})
		}
		req.Resource = append(req.Resource, r)
	}
	for len(req.Resource) > 0 {
		n := min(len(req.Resource), DefaultMaxResources)
		p.send(ctx, &pb.GetServerCapacityRequest{ServerId: req.ServerId, Resource: req.Resource[:n]})
		req.Resource = req.Resource[n:]
	}
}

func (p *parentLoop) send(ctx context.Context, req *pb.GetServerCapacityRequest) {
	c, err := p.client()
	if err == nil {
		cctx, cancel := context.WithTimeout(ctx, p.opts.Timeout)
		var resp *pb.GetServerCapacityResponse
		resp, err = c.GetServerCapacity(cctx, req)
		cancel()
		if err == nil {
			p.answer(resp)
			return
		}
	}
	if ctx.Err() != nil {
		return
	}
	p.s.log.Warn("parent unreachable", "parent", p.addr, "err", err)
	p.addr = p.opts.Address // the master it named may be the one gone
	p.retry = p.now().Add(time.Second)
}

func (p *parentLoop) answer(resp *pb.GetServerCapacityResponse) {
	if m := resp.Mastership; m != nil {
		if m.MasterAddress != "" && m.MasterAddress != p.addr {
			p.s.log.Info("parent redirects to its master", "from", p.addr, "to", m.MasterAddress)
			p.addr = m.MasterAddress // asked again at the next poll
		} else {
			p.addr = p.opts.Address
			p.retry = p.now().Add(time.Second) // an election under way
		}
		return
	}
	now := p.now()
	for _, r := range resp.Response {
		l := fromPB(r.Gets)
		p.s.table.SetParent(r.ResourceId, l)
		refresh := l.Refresh
		if refresh <= 0 {
			refresh = lease.DefaultRefreshInterval
		}
		p.next[r.ResourceId] = now.Add(refresh)
	}
	for id, at := range p.next { // forget resources nobody asks for
		if now.Sub(at) > time.Minute {
			delete(p.next, id)
		}
	}
}

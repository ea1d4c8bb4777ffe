package capacity

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	mrand "math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/capacity/capacitypb"
	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/memstore"
)

// ClientOptions configure a Client.
type ClientOptions struct {
	// Addrs are the capacity servers (host:port), replicas of one another:
	// the client asks any of them which is the master. At least one.
	Addrs []string
	// ID identifies the client to the servers, stable for its life and
	// unique. Default: host name, process id and 8 random bytes.
	ID string
	// Clock is the time source of refreshes, backoff, expiry and the
	// limiters (default clock.Coarse).
	Clock floodgate.Clock
	// Store keeps the limiters' buckets (default: a memstore of its own,
	// closed by Close). A memstore given here may warn of a request
	// decided under a newer policy of its name: a request racing a
	// re-rating, decided under the new capacity, as it should be.
	Store floodgate.Store
	// DialOptions are grpc.NewClient's options (default: plaintext).
	DialOptions []grpc.DialOption
	// RPCTimeout bounds each call to a server (default 5s).
	RPCTimeout time.Duration
	// Backoff is the wait after a refresh that no server answered,
	// doubled at each further failure up to MaxBackoff, less a random
	// jitter (defaults 250ms and 10s).
	Backoff, MaxBackoff time.Duration
	// Jitter is the fraction of the refresh interval by which a refresh
	// comes early at random, so that clients spread out (default 0.1;
	// between 0 and 0.5).
	Jitter float64
	// WantsChange is the change of a resource's wants, as a fraction of
	// the larger of the old and the new, beyond which SetWants refreshes
	// at once rather than at the next interval (default 0.2).
	WantsChange float64
	// MinInterval is the least time between two refreshes that SetWants
	// brings forward (default 1s).
	MinInterval time.Duration
	// Burst is how long the limiters' buckets hold at the capacity's rate:
	// capacity × Burst requests, at least one (default 1s).
	Burst time.Duration
	// MaxBatch is the most resources one call carries (default 1000, the
	// server's default limit): a client with more makes several calls per
	// refresh.
	MaxBatch int
	// Logger logs failed refreshes (default slog.Default()).
	Logger *slog.Logger
}

// validate checks what has no default.
func (o *ClientOptions) validate() error {
	if len(o.Addrs) == 0 {
		return errors.New("capacity: ClientOptions.Addrs: at least one server address is needed")
	}
	for i, a := range o.Addrs {
		if a == "" {
			return fmt.Errorf("capacity: ClientOptions.Addrs[%d]: empty address", i)
		}
	}
	if o.Jitter < 0 || o.Jitter > 0.5 || math.IsNaN(o.Jitter) {
		return fmt.Errorf("capacity: ClientOptions.Jitter: %v is not between 0 and 0.5", o.Jitter)
	}
	if o.WantsChange < 0 || math.IsNaN(o.WantsChange) {
		return fmt.Errorf("capacity: ClientOptions.WantsChange: %v is negative", o.WantsChange)
	}
	return nil
}

// defaults validates o and fills in the defaults.
func (o *ClientOptions) defaults() error {
	if err := o.validate(); err != nil {
		return err
	}
	setDefault(&o.RPCTimeout, 5*time.Second)
	setDefault(&o.Backoff, 250*time.Millisecond)
	setDefault(&o.MaxBackoff, 10*time.Second)
	setDefault(&o.MinInterval, time.Second)
	setDefault(&o.Burst, time.Second)
	if o.Jitter == 0 {
		o.Jitter = 0.1
	}
	if o.MaxBatch <= 0 {
		o.MaxBatch = 1000
	}
	if o.WantsChange == 0 {
		o.WantsChange = 0.2
	}
	if o.Clock == nil {
		o.Clock = clock.Coarse
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.DialOptions == nil {
		o.DialOptions = []grpc.DialOption{
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			// The client's own backoff paces its retries; grpc's must not
			// keep a restarted server unreachable for minutes.
			grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{
				BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second,
			}, MinConnectTimeout: 5 * time.Second}),
		}
	}
	if o.ID == "" {
		o.ID = defaultID()
	}
	return nil
}

func setDefault(d *time.Duration, v time.Duration) {
	if *d <= 0 {
		*d = v
	}
}

// defaultID is the host name, the process id and 8 random bytes.
func defaultID() string {
	host, _ := os.Hostname()
	var b [8]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}

// A Client holds leases on resources from the capacity servers: the
// bottom half of the library. It refreshes them in the background until
// Close. Make one with New; it is safe for concurrent use.
type Client struct {
	opts  ClientOptions
	clock floodgate.Clock
	store floodgate.Store
	owned *memstore.Store // the store New made, closed by Close

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}

	mu        sync.Mutex // guards what follows
	resources map[string]*Resource
	order     []*Resource
	conns     map[string]*grpc.ClientConn
	master    string             // the address asked first; "" unknown
	wakeSleep context.CancelFunc // ends the loop's sleep
	woken     bool               // a wake-up came while the loop was not asleep
	urgent    bool               // the wake-up does not wait for MinInterval
	last      int64              // µs: the last successful refresh; 0 none
	rng       *mrand.Rand
	closed    bool

	refreshMu   sync.Mutex    // one refresh at a time
	nextRefresh atomic.Int64  // µs: when the loop refreshes next
	refreshes   atomic.Int64  // successful refreshes, for tests
	attempts    atomic.Int64  // the loop's refreshes, failed or not, for tests
	event       chan struct{} // closed and replaced after each of the loop's attempts and as it goes to sleep, for tests
}

// New returns a client of the servers at opts.Addrs. It asks them for
// nothing until a resource is added.
func New(opts ClientOptions) (*Client, error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	c := &Client{
		opts: opts, clock: opts.Clock, store: opts.Store,
		resources: map[string]*Resource{}, conns: map[string]*grpc.ClientConn{},
		done: make(chan struct{}), event: make(chan struct{}),
		rng: mrand.New(mrand.NewPCG(seed(opts.ID))),
	}
	if c.store == nil {
		// Quiet: a request that read a resource's policy just before a
		// re-rating is decided under the new one, as it should be, and
		// the store would warn of it as of two live policies of a name.
		s, err := memstore.New(memstore.Options{Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			return nil, fmt.Errorf("capacity: the limiters' store: %w", err)
		}
		c.store, c.owned = s, s
	}
	for _, a := range opts.Addrs {
		if _, err := c.conn(a); err != nil {
			c.closeConns()
			return nil, err
		}
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	go c.run()
	return c, nil
}

// seed derives the jitter's seed from the id and the time, so clients
// started together spread out.
func seed(id string) (uint64, uint64) {
	var h uint64 = 14695981039346656037
	for i := 0; i < len(id); i++ {
		h = (h ^ uint64(id[i])) * 1099511628211
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	var r uint64
	for _, x := range b {
		r = r<<8 | uint64(x)
	}
	return h, r
}

// ID returns the client's id.
func (c *Client) ID() string { return c.opts.ID }

// Resource adds a resource to the client and returns its handle, and
// refreshes at once to get its first lease. Until then its capacity is
// what its mode gives. An id may be added once.
func (c *Client) Resource(id string, o Options) (*Resource, error) {
	if err := checkOptions(id, o); err != nil {
		return nil, err
	}
	if o.Mode == "" {
		o.Mode = Safe
	}
	r := &Resource{
		c: c, id: id, mode: o.Mode, prio: o.Priority, wants: o.Wants, safe: o.SafeCapacity,
		name:    "floodgate/capacity/" + c.opts.ID + "/" + id,
		changed: make(chan struct{}),
	}
	c.mu.Lock()
	switch {
	case c.closed:
		c.mu.Unlock()
		return nil, errClosed
	case c.resources[id] != nil:
		c.mu.Unlock()
		return nil, fmt.Errorf("capacity: resource %q: added already", id)
	}
	r.mu.Lock()
	r.rerate(c.clock.NowMicro())
	r.mu.Unlock()
	c.resources[id] = r
	c.order = append(c.order, r)
	c.mu.Unlock()
	c.wake(true)
	return r, nil
}

var errClosed = errors.New("capacity: the client is closed")

// Refresh asks the servers for leases on all the client's resources now,
// as the background refresh does, and returns its error.
func (c *Client) Refresh(ctx context.Context) error {
	c.refreshMu.Lock()
	defer c.refreshMu.Unlock()
	reqs, rs := c.requests()
	if len(reqs) == 0 {
		return nil
	}
	var interval time.Duration
	for lo := 0; lo < len(reqs); lo += c.opts.MaxBatch {
		hi := min(lo+c.opts.MaxBatch, len(reqs))
		req := &capacitypb.GetCapacityRequest{ClientId: c.opts.ID, Resource: reqs[lo:hi]}
		var resp *capacitypb.GetCapacityResponse
		err := c.call(ctx, func(ctx context.Context, cl capacitypb.CapacityClient) (*capacitypb.Mastership, error) {
			var err error
			resp, err = cl.GetCapacity(ctx, req)
			return resp.GetMastership(), err
		})
		if err != nil {
			return err
		}
		if iv := c.apply(resp, reqs[lo:hi], rs[lo:hi]); iv > 0 && (interval == 0 || iv < interval) {
			interval = iv
		}
	}
	c.schedule(interval)
	return nil
}

// requests returns each resource's request for a refresh.
func (c *Client) requests() ([]*capacitypb.ResourceRequest, []*Resource) {
	c.mu.Lock()
	rs := append([]*Resource(nil), c.order...)
	c.mu.Unlock()
	now := c.clock.NowMicro()
	reqs := make([]*capacitypb.ResourceRequest, len(rs))
	for i, r := range rs {
		wants, has, ok := r.request(now)
		reqs[i] = &capacitypb.ResourceRequest{ResourceId: r.id, Priority: r.prio, Wants: wants}
		if ok {
			reqs[i].Has = toPB(has)
		}
	}
	return reqs, rs
}

// apply gives each resource its new lease, and returns the shortest
// refresh interval of the answer (0: none).
func (c *Client) apply(resp *capacitypb.GetCapacityResponse, reqs []*capacitypb.ResourceRequest, rs []*Resource) time.Duration {
	now := c.clock.NowMicro()
	byID := make(map[string]int, len(rs))
	for i, r := range rs {
		byID[r.id] = i
	}
	var interval time.Duration
	for _, x := range resp.GetResponse() {
		i, ok := byID[x.GetResourceId()]
		if !ok || x.GetGets() == nil {
			continue
		}
		l := fromPB(x.GetGets())
		rs[i].setLease(l, reqs[i].GetWants(), now)
		if l.Refresh > 0 && (interval == 0 || l.Refresh < interval) {
			interval = l.Refresh
		}
	}
	return interval
}

// schedule sets the next refresh after a successful one: interval (or
// MaxBackoff when the answer gave none) less a random jitter.
func (c *Client) schedule(interval time.Duration) {
	now := c.clock.NowMicro()
	c.mu.Lock()
	c.last = now
	if interval <= 0 {
		interval = c.opts.MaxBackoff
	}
	jit := time.Duration(c.rng.Float64() * c.opts.Jitter * float64(interval))
	c.nextRefresh.Store(now + (interval - jit).Microseconds())
	c.mu.Unlock()
	c.refreshes.Add(1)
}

// signal tells the tests that the loop moved on. c.mu is held.
func (c *Client) signal() {
	close(c.event)
	c.event = make(chan struct{})
}

func toPB(l Lease) *capacitypb.Lease {
	return &capacitypb.Lease{
		Capacity: l.Capacity, SafeCapacity: l.Safe,
		Expiry:          timestampOf(l.Expiry),
		RefreshInterval: durationOf(l.Refresh),
	}
}

func fromPB(l *capacitypb.Lease) Lease {
	out := Lease{Capacity: max(0, l.GetCapacity()), Safe: max(0, l.GetSafeCapacity())}
	if l.GetExpiry() != nil {
		out.Expiry = l.GetExpiry().AsTime()
	}
	if l.GetRefreshInterval() != nil {
		out.Refresh = l.GetRefreshInterval().AsDuration()
	}
	return out
}

// Close stops refreshing, gives the client's leases back to the master so
// that others may have the capacity at once, and closes the connections.
// The resources then hold no lease: their capacity is what their modes
// give. It returns the release's error, if any.
func (c *Client) Close(ctx context.Context) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	ids := make([]string, len(c.order))
	for i, r := range c.order {
		ids[i] = r.id
	}
	c.mu.Unlock()
	c.cancel()
	<-c.done
	var errs []error
	for lo := 0; lo < len(ids); lo += c.opts.MaxBatch {
		req := &capacitypb.ReleaseCapacityRequest{ClientId: c.opts.ID, ResourceId: ids[lo:min(lo+c.opts.MaxBatch, len(ids))]}
		errs = append(errs, c.call(ctx, func(ctx context.Context, cl capacitypb.CapacityClient) (*capacitypb.Mastership, error) {
			resp, err := cl.ReleaseCapacity(ctx, req)
			return resp.GetMastership(), err
		}))
	}
	err := errors.Join(errs...)
	c.dropLeases()
	c.closeConns()
	if c.owned != nil {
		c.owned.Close()
	}
	return err
}

// dropLeases forgets every resource's lease.
func (c *Client) dropLeases() {
	c.mu.Lock()
	rs := append([]*Resource(nil), c.order...)
	c.mu.Unlock()
	now := c.clock.NowMicro()
	for _, r := range rs {
		r.mu.Lock()
		if r.has {
			r.lease.Expiry = time.UnixMicro(min(now, r.lease.Expiry.UnixMicro()))
		}
		r.rerate(now)
		r.mu.Unlock()
	}
}

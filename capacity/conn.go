package capacity

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/floodgate/floodgate/capacity/capacitypb"
)

// conn returns the connection to addr, making it on first use.
func (c *Client) conn(addr string) (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cc := c.conns[addr]; cc != nil {
		return cc, nil
	}
	cc, err := grpc.NewClient(addr, c.opts.DialOptions...)
	if err != nil {
		return nil, fmt.Errorf("capacity: server %q: %w", addr, err)
	}
	c.conns[addr] = cc
	return cc, nil
}

// dropConn closes cc, the connection to addr, after a call on it found the
// server unavailable: the next attempt dials afresh. grpc would keep the
// failed connection failing, every call refused without trying (or
// failing on a connection attempt begun before the server came back),
// until its own backoff ends; each of the client's attempts, paced by its
// backoff on its clock, should try the server.
func (c *Client) dropConn(addr string, cc *grpc.ClientConn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conns[addr] == cc {
		delete(c.conns, addr)
		cc.Close()
	}
}

func (c *Client) closeConns() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for a, cc := range c.conns {
		cc.Close()
		delete(c.conns, a)
	}
}

// ErrNoMaster is returned when no server could name the master.
var ErrNoMaster = errors.New("capacity: no server knows the master")

// maxRedirects bounds the redirects one call follows: a replica names the
// master, which should not name another.
const maxRedirects = 4

// call runs one RPC on the master: first on the server last known as the
// master, else on the one Discovery names. An answer with mastership set
// is a redirect, followed to the server it names; a server that fails or
// does not know the master is passed over for the next address.
func (c *Client) call(ctx context.Context, rpc func(context.Context, capacitypb.CapacityClient) (*capacitypb.Mastership, error)) error {
	addr := c.knownMaster()
	var errs []error
	if addr == "" {
		var err error
		if addr, err = c.discover(ctx); err != nil {
			return err
		}
	}
	tried := map[string]bool{}
	for hops := 0; addr != "" && hops <= maxRedirects+len(c.opts.Addrs); hops++ {
		tried[addr] = true
		m, err := c.try(ctx, addr, rpc)
		switch {
		case err == nil && m == nil:
			c.setMaster(addr)
			return nil
		case err == nil && m.GetMasterAddress() != "" && m.GetMasterAddress() != addr:
			addr = m.GetMasterAddress() // a redirect
			continue
		case err == nil:
			err = fmt.Errorf("capacity: server %s: not the master, and does not know which is", addr)
		}
		errs = append(errs, err)
		c.setMaster("")
		if ctx.Err() != nil {
			break
		}
		addr = c.next(tried)
	}
	if len(errs) == 0 {
		errs = append(errs, ErrNoMaster)
	}
	return errors.Join(errs...)
}

// try runs rpc on addr within the RPC timeout.
func (c *Client) try(ctx context.Context, addr string, rpc func(context.Context, capacitypb.CapacityClient) (*capacitypb.Mastership, error)) (*capacitypb.Mastership, error) {
	cc, err := c.conn(addr)
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithTimeout(ctx, c.opts.RPCTimeout)
	defer cancel()
	m, err := rpc(rctx, capacitypb.NewCapacityClient(cc))
	if status.Code(err) == codes.Unavailable {
		c.dropConn(addr, cc)
	}
	if err != nil {
		return nil, fmt.Errorf("capacity: server %s: %w", addr, err)
	}
	return m, nil
}

// next returns the first configured address not yet tried, or "".
func (c *Client) next(tried map[string]bool) string {
	for _, a := range c.opts.Addrs {
		if !tried[a] {
			return a
		}
	}
	return ""
}

func (c *Client) knownMaster() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.master
}

func (c *Client) setMaster(addr string) {
	c.mu.Lock()
	c.master = addr
	c.mu.Unlock()
}

// Master returns the address of the server the client last found to be
// the master, or "" when it does not know.
func (c *Client) Master() string { return c.knownMaster() }

// discover asks the configured servers in turn which one is the master,
// and returns the first answer: the answering server when it is the
// master, or the master it names. When none knows, it returns the first
// address that answered at all (which redirects, or says it does not
// know), or an error when none answered.
func (c *Client) discover(ctx context.Context) (string, error) {
	var errs []error
	for _, a := range c.opts.Addrs {
		var resp *capacitypb.DiscoveryResponse
		_, err := c.try(ctx, a, func(ctx context.Context, cl capacitypb.CapacityClient) (*capacitypb.Mastership, error) {
			var err error
			resp, err = cl.Discovery(ctx, &capacitypb.DiscoveryRequest{})
			return nil, err
		})
		switch {
		case err != nil:
			errs = append(errs, err)
		case resp.GetIsMaster():
			return a, nil
		case resp.GetMastership().GetMasterAddress() != "":
			return resp.GetMastership().GetMasterAddress(), nil
		default:
			errs = append(errs, fmt.Errorf("capacity: server %s: does not know the master", a))
		}
		if ctx.Err() != nil {
			break
		}
	}
	return "", errors.Join(append([]error{ErrNoMaster}, errs...)...)
}

func timestampOf(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

func durationOf(d time.Duration) *durationpb.Duration {
	if d == 0 {
		return nil
	}
	return durationpb.New(d)
}

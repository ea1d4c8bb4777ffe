// Package elect elects one master among a capacity server's replicas
// through etcd (go.etcd.io/etcd/client/v3/concurrency), as Doorman did:
// every replica campaigns with the address it advertises, the winner is
// the master for as long as its etcd session (a lease with a TTL, kept
// alive by the process) lives, and every replica observes who the master
// is, to redirect clients there.
//
// A master that dies (kill -9) stops renewing its session; etcd expires it
// after the TTL and the next candidate wins. A master that loses etcd
// steps down when its session ends, before etcd could have elected
// another (its client expires the lease no later than the server does),
// and campaigns again.
package elect

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
)

// Options configure an Elector.
type Options struct {
	// Endpoints are etcd's client URLs.
	Endpoints []string
	// Key is the election's key prefix in etcd; default
	// "/floodgate/capacity/master". Replicas of one service share it.
	Key string
	// Address is what this replica advertises: where clients reach it.
	Address string
	// TTL is the session's time to live, in seconds (default 5): how long
	// a dead master stays master.
	TTL int
	// OnChange is called, from one goroutine, each time this replica's
	// view changes: whether it is the master, and the master's address
	// ("" while unknown). Required.
	OnChange func(isMaster bool, master string)
	// Logger, default slog.Default().
	Logger *slog.Logger
}

// An Elector campaigns for mastership and observes the master.
type Elector struct {
	opts   Options
	cli    *clientv3.Client
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	isMaster bool
	master   string
	session  *concurrency.Session
	election *concurrency.Election
}

// Start connects to etcd and starts campaigning and observing. Close
// resigns and stops.
func Start(opts Options) (*Elector, error) {
	if len(opts.Endpoints) == 0 || opts.Address == "" || opts.OnChange == nil {
		return nil, errors.New("elect: Endpoints, Address and OnChange are required")
	}
	if opts.Key == "" {
		opts.Key = "/floodgate/capacity/master"
	}
	if opts.TTL <= 0 {
		opts.TTL = 5
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: opts.Endpoints, DialTimeout: 5 * time.Second,
		Logger: zap.NewNop()}) // this package logs what matters to opts.Logger
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	e := &Elector{opts: opts, cli: cli, cancel: cancel}
	e.wg.Go(func() { e.campaignLoop(ctx) })
	e.wg.Go(func() { e.observeLoop(ctx) })
	return e, nil
}

// State returns whether this replica is the master, and the master's
// address as last observed.
func (e *Elector) State() (isMaster bool, master string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.isMaster, e.master
}

func (e *Elector) set(isMaster bool, master string, setMaster bool) {
	e.mu.Lock()
	if !setMaster {
		master = e.master
	}
	if isMaster {
		master = e.opts.Address
	}
	changed := isMaster != e.isMaster || master != e.master
	e.isMaster, e.master = isMaster, master
	if changed {
		e.opts.OnChange(isMaster, master) // under mu: calls are serial and in order
	}
	e.mu.Unlock()
}

// observed notes the leader key's value. Only the campaign decides
// whether this replica is the master; what is observed names the master
// to the others.
func (e *Elector) observed(leader string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.isMaster || leader == e.opts.Address || leader == e.master {
		return // ours, or a stale key of ours after a session's end
	}
	e.master = leader
	e.opts.OnChange(false, leader)
}

// campaignLoop campaigns in a session; once elected it stays master until
// the session ends, then campaigns again in a new one.
func (e *Elector) campaignLoop(ctx context.Context) {
	for ctx.Err() == nil {
		sess, err := concurrency.NewSession(e.cli, concurrency.WithTTL(e.opts.TTL), concurrency.WithContext(ctx))
		if err != nil {
			e.opts.Logger.Warn("etcd session", "err", err)
			sleep(ctx, time.Second)
			continue
		}
		el := concurrency.NewElection(sess, e.opts.Key)
		e.mu.Lock()
		e.session, e.election = sess, el
		e.mu.Unlock()
		if err := el.Campaign(ctx, e.opts.Address); err != nil {
			e.opts.Logger.Warn("etcd campaign", "err", err)
			sess.Close()
			sleep(ctx, time.Second)
			continue
		}
		e.opts.Logger.Info("elected master", "address", e.opts.Address)
		e.set(true, "", false)
		select {
		case <-ctx.Done():
		case <-sess.Done():
			e.opts.Logger.Warn("etcd session ended: no longer master")
		}
		e.set(false, "", true)
	}
}

// observeLoop follows the election's leader key.
func (e *Elector) observeLoop(ctx context.Context) {
	for ctx.Err() == nil {
		e.mu.Lock()
		el := e.election
		e.mu.Unlock()
		if el == nil {
			sleep(ctx, 50*time.Millisecond)
			continue
		}
		octx, cancel := context.WithCancel(ctx)
		for resp := range el.Observe(octx) {
			if len(resp.Kvs) > 0 {
				e.observed(string(resp.Kvs[0].Value))
			}
		}
		cancel()
		sleep(ctx, 100*time.Millisecond)
	}
}

// Close resigns mastership (so another replica takes over at once, not
// after the TTL) and disconnects.
func (e *Elector) Close() error {
	e.mu.Lock()
	el, sess, was := e.election, e.session, e.isMaster
	if was { // step down first: never two masters, even for a moment
		e.isMaster, e.master = false, ""
		e.opts.OnChange(false, "")
	}
	e.mu.Unlock()
	if was && el != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		if err := el.Resign(ctx); err != nil {
			e.opts.Logger.Warn("etcd resign", "err", err)
		}
		cancel()
	}
	e.cancel()
	if sess != nil {
		sess.Close()
	}
	e.wg.Wait()
	return e.cli.Close()
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

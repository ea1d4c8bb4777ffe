package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/floodgate/floodgate/deferq"
	"github.com/floodgate/floodgate/gate"
	"github.com/floodgate/floodgate/rules"
)

// maxDeferredResult bounds the body of a deferred request's response kept
// for polling.
const maxDeferredResult = 1 << 20

// deferWorkers runs the proxy's defer routes: a deferq.Queue per defer
// limit, rebuilt on each rules load, and one worker per queue delivering
// to the upstream.
type deferWorkers struct {
	client   rueidis.Client // nil without --store redis
	upstream string
	// opts are the flags' options of every queue (deferConfig.options):
	// ClaimIdle, PollRate, PollConcurrency, MaxDeliveries, MaxDead.
	opts     deferq.Options
	log      *slog.Logger
	consumer string

	mu     sync.Mutex
	queues []*deferq.Queue // the running ones, for deferMetrics
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func newDeferWorkers(client rueidis.Client, upstream string, opts deferq.Options, log *slog.Logger) *deferWorkers {
	host, _ := os.Hostname()
	return &deferWorkers{client: client, upstream: upstream, opts: opts, log: log,
		consumer: fmt.Sprintf("%s-%d-%d", host, os.Getpid(), time.Now().UnixNano())}
}

// build makes the queues of cfg's defer limits; a defer route without a
// Redis store is an error at its line.
func (d *deferWorkers) build(cfg *rules.Config, limits []gate.Limit) (map[string]*deferq.Queue, error) {
	if d.client == nil {
		for _, dom := range cfg.Domains() {
			for _, rt := range dom.HTTP() {
				if rt.Action == "defer" {
					return nil, fmt.Errorf("%s:%d: http route %s: action defer needs --store redis (its queue is a Redis Stream)", rt.File, rt.Line, rt.Name)
				}
			}
		}
		return nil, nil
	}
	queues := map[string]*deferq.Queue{}
	for i := range limits {
		l := &limits[i]
		if l.Action != gate.Defer {
			continue
		}
		o := d.opts
		o.Name, o.Interval, o.MaxLen, o.MaxBody, o.ResultTTL = l.Name, l.DeferInterval(), l.Defer.MaxQueue, l.Defer.MaxBody, l.Defer.ResultTTL
		q, err := deferq.New(d.client, o)
		if err != nil {
			return nil, fmt.Errorf("http route %s: %w", l.Name, err)
		}
		queues[l.Name] = q
	}
	return queues, nil
}

// run stops the previous queues' workers and starts one per queue.
func (d *deferWorkers) run(queues map[string]*deferq.Queue) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stopLocked()
	d.queues = d.queues[:0:0]
	for _, q := range queues {
		d.queues = append(d.queues, q)
	}
	if len(queues) == 0 {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	d.cancel = cancel
	client := &http.Client{Timeout: d.opts.ClaimIdle}
	for _, q := range queues {
		d.wg.Go(func() {
			deliver := deferq.ToUpstream(client, d.upstream, maxDeferredResult)
			if err := q.Run(ctx, d.consumer, deliver); err != nil {
				d.log.Error("deferred queue worker", "queue", q.Name(), "err", err)
			}
		})
	}
}

// stop stops the workers (a delivery under way is left pending, for
// another worker to claim).
func (d *deferWorkers) stop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stopLocked()
}

func (d *deferWorkers) stopLocked() {
	if d.cancel != nil {
		d.cancel()
		d.wg.Wait()
		d.cancel = nil
	}
}

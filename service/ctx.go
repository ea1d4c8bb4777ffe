package service

import (
	"context"
	"sync"
	"time"
)

// lazyTimeout is context.WithTimeout without its cost where nobody waits:
// a lookup answered from memory (an overrides cache hit) never asks for Done
// or Err, and then no timer is made and nothing is linked to the parent.
// The first Done or Err makes the real context (with its deadline as set
// when lazyTimeout was made); stop cancels it.
type lazyTimeout struct {
	parent   context.Context
	deadline time.Time
	once     sync.Once
	ctx      context.Context
	cancel   context.CancelFunc
}

// withLazyTimeout returns ctx bounded by timeout from now: ctx itself when
// its own deadline comes first (nothing to stop), else a *lazyTimeout,
// which the caller must stop when done with it.
func withLazyTimeout(ctx context.Context, timeout time.Duration) context.Context {
	deadline := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && !d.After(deadline) {
		return ctx
	}
	return &lazyTimeout{parent: ctx, deadline: deadline}
}

func (c *lazyTimeout) start() {
	c.once.Do(func() { c.ctx, c.cancel = context.WithDeadline(c.parent, c.deadline) })
}

// stop releases the context's resources, if it made any; afterwards it is
// cancelled, as a context.WithTimeout whose cancel function was called.
func (c *lazyTimeout) stop() {
	c.once.Do(func() { c.ctx = canceledContext })
	if c.cancel != nil {
		c.cancel()
	}
}

var canceledContext = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

func (c *lazyTimeout) Deadline() (time.Time, bool) { return c.deadline, true }
func (c *lazyTimeout) Done() <-chan struct{}       { c.start(); return c.ctx.Done() }
func (c *lazyTimeout) Err() error                  { c.start(); return c.ctx.Err() }
func (c *lazyTimeout) Value(key any) any           { return c.parent.Value(key) }

package decide

import (
	"context"
	"sync"
	"time"
)

// lazyTimeout is context.WithTimeout without its cost where nobody waits:
// a lookup answered from memory (an overrides cache hit) never asks for
// Done, Err or Deadline, and then no clock is read, no timer made and
// nothing linked to the parent. The first of them makes the real context,
// whose deadline is timeout from then, or half-way to the parent's
// deadline if that comes first: a lookup (of an override, on a slow or
// silent Redis) leaves the decision after it half the caller's time, so
// that a failure mode can still answer in time; stop cancels it.
type lazyTimeout struct {
	parent  context.Context
	timeout time.Duration
	once    sync.Once
	ctx     context.Context
	cancel  context.CancelFunc
}

// withLazyTimeout returns ctx bounded by timeout, lazily. The caller must
// stop it when done with it.
func withLazyTimeout(ctx context.Context, timeout time.Duration) *lazyTimeout {
	return &lazyTimeout{parent: ctx, timeout: timeout}
}

func (c *lazyTimeout) start() {
	c.once.Do(func() {
		t := c.timeout
		if d, ok := c.parent.Deadline(); ok {
			t = min(t, time.Until(d)/2)
		}
		c.ctx, c.cancel = context.WithTimeout(c.parent, t)
	})
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

func (c *lazyTimeout) Deadline() (time.Time, bool) { c.start(); return c.ctx.Deadline() }
func (c *lazyTimeout) Done() <-chan struct{}       { c.start(); return c.ctx.Done() }
func (c *lazyTimeout) Err() error                  { c.start(); return c.ctx.Err() }
func (c *lazyTimeout) Value(key any) any           { return c.parent.Value(key) }

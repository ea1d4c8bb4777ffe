package proxy

import (
	"context"
	"errors"
	"time"

	"github.com/floodgate/floodgate"
)

// errClientGone ends a delay whose client closed its connection.
var errClientGone = errors.New("floodgate proxy: the client closed its connection while its request was delayed")

// watchingClock is the gate's clock in the proxy: base's time, and base's
// sleep (a delay action's wait) while the request's connection is
// watched, so that the sleep ends with errClientGone when the client goes
// away; the gate then gives the reserved slots back and the request is
// not forwarded, as httplimit's request context does under net/http.
type watchingClock struct{ base floodgate.Clock }

// NowMicro is base's.
func (c watchingClock) NowMicro() int64 { return c.base.NowMicro() }

// Sleep sleeps on base, watching the request's connection (the value of
// ctx for peerConnKey) meanwhile. A request the throttler admitted gives
// its slot back for the sleep and is admitted again after it, as any
// arrival (admission): an error then (shed, or the client left while it
// waited its turn) is Sleep's, and the gate gives back what it reserved.
func (c watchingClock) Sleep(ctx context.Context, d time.Duration) error {
	pc, _ := ctx.Value(peerConnKey{}).(*peerConn)
	if pc == nil || d <= 0 {
		return c.base.Sleep(ctx, d)
	}
	held := pc.adm.delayStarts()
	wctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := pc.watch(func() { cancel(errClientGone) })
	err := c.base.Sleep(wctx, d)
	stop()
	if err != nil && context.Cause(wctx) == errClientGone {
		return errClientGone
	}
	if err == nil && held {
		err = pc.adm.delayEnds(pc)
	}
	return err
}

// Clock returns the clock to give the proxy's gate: base's time, and
// base's sleep for a delay action, cut short when the delayed request's
// client closes its connection (the gate then gives the reserved slots
// back and the request is not forwarded).
func Clock(base floodgate.Clock) floodgate.Clock { return watchingClock{base} }

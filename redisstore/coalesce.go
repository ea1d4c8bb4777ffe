package redisstore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/floodgate/floodgate"
)

// Coalescing: on one Redis (standalone or Sentinel), the decisions of
// concurrent callers go to Redis together, many in one call of
// BatchFunction, instead of one FCALL each.
//
// Auto-pipelining already shares a round trip between concurrent calls,
// but each call is still a command of its own: Redis parses it, sets up a
// Lua call, reads TIME, and sends a reply; the client builds, writes,
// reads and hands back each one. On the service's benchmark machine a
// bare FCALL cost Redis 5 µs and a decision 25 µs. A batch pays the fixed
// part once, so Redis spends its time on the decisions themselves, and
// both sides make fewer system calls.
//
// How: at most Options.Batches batches are in flight. A caller that
// finds a slot free sends its own decisions at once, with whatever is
// queued (so a lone caller waits for nobody); one that finds every slot
// busy queues, and is sent with the queue as soon as a batch comes back,
// by the goroutine that sent that batch. A caller whose store context
// (Store.storeContext) ends while queued is dropped from the queue, never
// decided; one whose context ends once its batch is sent leaves at once,
// though Redis may still apply it (the caller sending a batch waits for its
// call, which its own context bounds).
// Decisions keep their order: a batch runs them one after the other, as
// separate calls would. In a Cluster each call is bound to one slot and
// keys rarely share one, so there every decision is a call of its own.
type coalescer struct {
	s        *Store
	slots    int // batches in flight at most
	maxOps   int // decisions per batch at most
	mu       sync.Mutex
	inflight int
	queue    []*waiter
	spare    []*waiter   // the slice the queue swaps with
	idle     []*slotConn // connections of free slots
	closed   bool
}

// A slotConn is a connection of the coalescer's own (rueidis's dedicated
// client), used by one slot's goroutine at a time. Called one command at
// a time by one goroutine, rueidis writes and reads it on that goroutine:
// none of the hand-offs to its writer and reader goroutines of the shared,
// auto-pipelined connections, one less wake-up each way per call.
type slotConn struct {
	dc      rueidis.DedicatedClient
	release func()
	broken  bool   // a call failed on it: give it back instead of reusing it
	gen     uint64 // the generation of the master it was made to (follow.go)
}

// retire closes sc, in a goroutine of its own (closing a connection to a
// silent server waits for it), and gives it back: a connection to a
// deposed master, which must not decide again.
func (sc *slotConn) retire() {
	go sc.dc.Close()
}

// getConn returns a connection for a slot just taken: an idle one to the
// current master, or a new one, made in a goroutine of its own so that ctx
// bounds the wait (a new connection to a Redis that accepts it and then
// says nothing — a paused or overloaded server — would hold its maker for
// the dial and handshake timeouts). A connection that comes after ctx has
// ended is kept for the next slot. An idle connection to a deposed
// master (follow.go) is retired.
func (c *coalescer) getConn(ctx context.Context) (*slotConn, error) {
	gen := c.s.following() // read before Dedicate: see follower.current
	c.mu.Lock()
	for n := len(c.idle); n > 0; n = len(c.idle) {
		sc := c.idle[n-1]
		c.idle[n-1] = nil
		c.idle = c.idle[:n-1]
		if sc.gen == gen {
			c.mu.Unlock()
			return sc, nil
		}
		sc.retire()
	}
	c.mu.Unlock()
	made := make(chan *slotConn, 1)
	go func() {
		dc, release := c.s.client.Dedicate()
		made <- &slotConn{dc: dc, release: release, gen: gen}
	}()
	select {
	case sc := <-made:
		return sc, nil
	case <-ctx.Done():
		go func() { c.putConn(<-made) }()
		return nil, ctx.Err()
	}
}

// putConn takes back a slot's connection. A connection a call failed on
// (a timeout, a broken socket, a server that became a replica) goes back
// to rueidis, which drops it if it is broken; the next slot gets another.
// One made to a deposed master is retired.
func (c *coalescer) putConn(sc *slotConn) {
	if sc == nil {
		return
	}
	if sc.gen != c.s.following() {
		sc.retire()
		return
	}
	c.mu.Lock()
	if !sc.broken && !c.closed && len(c.idle) < c.slots {
		c.idle = append(c.idle, sc)
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	sc.release()
}

// retireIdle retires the idle connections made to a master before
// generation gen (follow.go); those in a call are retired when it ends.
func (c *coalescer) retireIdle(gen uint64) {
	c.mu.Lock()
	kept := c.idle[:0]
	for _, sc := range c.idle {
		if sc.gen == gen {
			kept = append(kept, sc)
		} else {
			sc.retire()
		}
	}
	clear(c.idle[len(kept):])
	c.idle = kept
	c.mu.Unlock()
}

// close gives back the idle connections; those in use go back as their
// calls end.
func (c *coalescer) close() {
	c.mu.Lock()
	idle := c.idle
	c.idle, c.closed = nil, true
	c.mu.Unlock()
	for _, sc := range idle {
		sc.release()
	}
}

// A waiter is one caller's decisions on their way through a batch.
type waiter struct {
	keys []string
	nums []opNums // each decision's own numbers
	pas  []*policyArgs
	grp  []bool // all-or-nothing group members (Store.DoGroup); nil or all false for none
	dec  []floodgate.Decision
	errs []error

	done chan struct{} // receives one value when dec and errs are set
	gone atomic.Bool   // the caller has left: skip it if not yet sent
}

var waiterPool = sync.Pool{New: func() any { return &waiter{done: make(chan struct{}, 1)} }}

func getWaiter(n int) *waiter {
	w := waiterPool.Get().(*waiter)
	w.keys, w.nums, w.pas, w.grp = w.keys[:0], w.nums[:0], w.pas[:0], nil
	w.dec = append(w.dec[:0], make([]floodgate.Decision, n)...)
	w.errs = append(w.errs[:0], make([]error, n)...)
	return w
}

func putWaiter(w *waiter) {
	clear(w.nums[:cap(w.nums)])
	clear(w.keys[:cap(w.keys)])
	clear(w.pas[:cap(w.pas)])
	clear(w.errs)
	w.grp = nil
	waiterPool.Put(w)
}

// add appends one decision's call to w.
func (w *waiter) add(key string, pa *policyArgs, o opNums) {
	w.keys = append(w.keys, key)
	w.pas = append(w.pas, pa)
	w.nums = append(w.nums, o)
}

// submit decides w's calls in some batch, under sctx (the store's context
// for the caller: Store.storeContext). It returns once they are decided
// (w.dec and w.errs are set), or with ctx's error if the caller's ctx ends
// first, or sctx's if it does; w then belongs to the batch, and the caller
// must not reuse it. A caller that sends the batch waits for its call,
// which sctx bounds.
func (c *coalescer) submit(ctx, sctx context.Context, w *waiter) error {
	c.mu.Lock()
	if c.inflight < c.slots {
		c.inflight++
		batch := c.take(w)
		c.mu.Unlock()
		// sctx is never cancelled, so the batch goes on if this caller
		// leaves; it ends at the sender's store deadline at most (each of
		// the others leaves at its own, if earlier)
		sc, err := c.getConn(sctx)
		if err != nil {
			c.fail(batch, err)
		} else {
			c.send(sctx, batch, sc)
		}
		<-w.done // set by send or fail, as for every waiter
		c.release(sc)
		return nil
	}
	c.queue = append(c.queue, w)
	c.mu.Unlock()
	select {
	case <-w.done:
		return nil
	case <-ctx.Done():
		w.gone.Store(true)
		return ctx.Err()
	case <-sctx.Done():
		w.gone.Store(true)
		return sctx.Err()
	}
}

// take returns the next batch: first (if any) and then the queue's
// waiters, up to maxOps decisions. c.mu is held.
func (c *coalescer) take(first *waiter) []*waiter {
	var batch []*waiter
	n := 0
	if first != nil {
		batch = append(batch, first)
		n = len(first.keys)
	}
	i := 0
	for ; i < len(c.queue); i++ {
		w := c.queue[i]
		if w.gone.Load() {
			continue
		}
		if n > 0 && n+len(w.keys) > c.maxOps {
			break
		}
		batch = append(batch, w)
		n += len(w.keys)
	}
	rest := c.spare[:0]
	rest = append(rest, c.queue[i:]...)
	clear(c.queue)
	c.spare, c.queue = c.queue[:0], rest
	return batch
}

// release gives back a slot, or, when callers are queued, keeps it and
// sends them from a goroutine of its own until the queue is empty. sc is
// the slot's connection, nil if it got none.
func (c *coalescer) release(sc *slotConn) {
	if batch := c.next(sc); batch != nil {
		go c.drain(batch, sc)
	}
}

func (c *coalescer) drain(batch []*waiter, sc *slotConn) {
	for ; batch != nil; batch = c.next(sc) {
		ctx := c.s.timeoutContext(time.Now())
		if sc == nil || sc.broken || sc.gen != c.s.following() {
			c.putConn(sc)
			var err error
			if sc, err = c.getConn(ctx); err != nil {
				c.fail(batch, err)
				continue
			}
		}
		c.send(ctx, batch, sc)
	}
}

// fail sets err as the result of every decision of batch, and wakes its
// waiters.
func (c *coalescer) fail(batch []*waiter, err error) {
	for _, w := range batch {
		for j := range w.keys {
			w.dec[j], w.errs[j] = floodgate.Decision{}, err
		}
	}
	c.wake(batch)
}

// next returns the queue's next batch for the slot sc serves; when no one
// is queued it gives back the slot and sc, and returns nil.
func (c *coalescer) next(sc *slotConn) []*waiter {
	c.mu.Lock()
	for len(c.queue) > 0 {
		if batch := c.take(nil); len(batch) > 0 {
			c.mu.Unlock()
			return batch
		}
	}
	c.inflight--
	c.mu.Unlock()
	c.putConn(sc)
	return nil
}

// send decides batch in one call and wakes every waiter but the first
// when its results are set (the first is the caller of send, or the
// caller it was queued for).
func (c *coalescer) send(ctx context.Context, batch []*waiter, sc *slotConn) {
	n := 0
	for _, w := range batch {
		n += len(w.keys)
	}
	// a lone decision too: PackedFunction's two arguments cost Redis less
	// than Function's eleven
	if !c.s.batchAlways {
		if keys, args, ok := packedArgs(batch, n); ok {
			c.sendPacked(ctx, batch, sc, keys, args)
			return
		}
	}
	if n == 1 && !c.s.batchAlways { // a lone decision: the single call, no batch framing
		w := batch[0]
		r := c.s.callOn(ctx, sc.dc, w.keys[0], w.pas[0].singleArgs(w.nums[0]))
		sc.broken = r.Error() != nil
		w.dec[0], w.errs[0] = c.s.decideReply(w.pas[0], r)
		c.wake(batch)
		return
	}
	keys, args := batchArgs(batch, n)
	r := c.s.callBatch(ctx, sc.dc, keys, args)
	sc.broken = r.Error() != nil
	replies, err := r.ToArray()
	if err == nil && len(replies) != n {
		err = errShortBatch
	}
	i := 0
	for _, w := range batch {
		for j := range w.keys {
			if err != nil {
				w.dec[j], w.errs[j] = floodgate.Decision{}, err
			} else {
				w.dec[j], w.errs[j] = c.s.decideMessage(w.pas[j], &replies[i])
			}
			i++
		}
	}
	c.wake(batch)
}

// sendPacked is send through PackedFunction, with its keys and args.
func (c *coalescer) sendPacked(ctx context.Context, batch []*waiter, sc *slotConn, keys, args []string) {
	r := c.s.callFunction(ctx, sc.dc, PackedFunction, c.s.packedScript, keys, args)
	sc.broken = r.Error() != nil
	reply, err := r.AsBytes()
	for _, w := range batch {
		for j := range w.keys {
			if err != nil {
				w.dec[j], w.errs[j] = floodgate.Decision{}, err
				continue
			}
			var derr error
			w.dec[j], w.errs[j], reply, derr = packedDecision(w.pas[j], reply)
			if derr != nil { // the rest is unreadable: every decision fails
				err = derr
				w.dec[j], w.errs[j] = floodgate.Decision{}, err
			}
		}
	}
	if err == nil && len(reply) != 0 {
		err = errPackedReply
		c.fail(batch, err) // wakes every waiter
		return
	}
	c.wake(batch)
}

// batchArgs returns the keys and arguments of BatchFunction deciding the n
// decisions of batch: the policies of the batch, each sent once (usually
// one or two), then each decision packed in one string.
func batchArgs(batch []*waiter, n int) (keys, args []string) {
	var pols []*policyArgs
	keys = make([]string, 0, n)
	nargs := 1 + n
	for _, w := range batch {
		keys = append(keys, w.keys...)
		for _, pa := range w.pas {
			if !slices.Contains(pols, pa) {
				pols = append(pols, pa)
				nargs += 1 + 2*len(pa.rules)
			}
		}
	}
	args = make([]string, 0, nargs)
	args = append(args, strconv.Itoa(len(pols)))
	for _, pa := range pols {
		args = pa.batchStatic(args)
	}
	var buf []byte
	for wi, w := range batch {
		for j := range w.nums {
			var g byte
			if w.grp != nil && w.grp[j] {
				g = byte(1 + wi%250) // next waiters' groups differ
			}
			buf = appendPacked(buf[:0], 1+slices.Index(pols, w.pas[j]), g, &w.nums[j])
			args = append(args, string(buf))
		}
	}
	return keys, args
}

// wake tells every waiter of batch, the first (whose caller is sending,
// or which is queued) included, that its results are set.
func (c *coalescer) wake(batch []*waiter) {
	for _, w := range batch {
		w.done <- struct{}{}
	}
}

var errShortBatch = errors.New("redisstore: batch reply has the wrong number of decisions")

// callBatch makes several decisions in one call of BatchFunction on cc
// (the batch script, on the client, on servers without functions),
// loading the library first when needed, as call does.
func (s *Store) callBatch(ctx context.Context, cc rueidis.CoreClient, keys, args []string) rueidis.RedisResult {
	return s.callFunction(ctx, cc, BatchFunction, s.batchScript, keys, args)
}

// callFunction calls the library's function fn on cc with keys and args,
// loading the library first if this store has not yet (or Redis lost it: a
// restart without persistence, a new node); on servers without functions
// it runs script (EVALSHA, EVAL when Redis lacks it) on the client.
func (s *Store) callFunction(ctx context.Context, cc rueidis.CoreClient, fn string, script *rueidis.Lua, keys, args []string) rueidis.RedisResult {
	if s.scriptMode.Load() {
		return script.Exec(ctx, s.client, keys, args)
	}
	if !s.libLoaded.Load() {
		if err := s.loadLibrary(ctx); err != nil {
			return rueidis.NewErrorResult(err)
		}
		if s.scriptMode.Load() {
			return script.Exec(ctx, s.client, keys, args)
		}
	}
	build := func() rueidis.Completed {
		return s.client.B().Fcall().Function(fn).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
	}
	r := cc.Do(ctx, build())
	if notLoaded(r.Error()) {
		s.libLoaded.Store(false)
		if err := s.loadLibrary(ctx); err != nil {
			return rueidis.NewErrorResult(err)
		}
		r = s.explainMissing(cc.Do(ctx, build()))
	}
	return r
}

// decideReply turns one decision's reply into a decision.
func (s *Store) decideReply(pa *policyArgs, r rueidis.RedisResult) (floodgate.Decision, error) {
	v, err := r.AsIntSlice()
	if err != nil {
		return floodgate.Decision{}, err
	}
	return pa.result(v)
}

// decideMessage turns one decision's part of a batch reply into a
// decision: 52 bytes, big-endian, as 90_apply.lua packs them (four values
// of one byte, six of eight), or an error for that decision alone.
func (s *Store) decideMessage(pa *policyArgs, m *rueidis.RedisMessage) (floodgate.Decision, error) {
	b, err := m.ToString()
	if err != nil {
		return floodgate.Decision{}, err
	}
	if len(b) != batchReplySize {
		return floodgate.Decision{}, fmt.Errorf("redisstore: batch decision of %d bytes, want %d", len(b), batchReplySize)
	}
	var v [10]int64
	for k := range 4 {
		v[k] = int64(b[k])
	}
	for k := range 6 {
		v[4+k] = int64(binary.BigEndian.Uint64([]byte(b[4+8*k : 12+8*k])))
	}
	return pa.result(v[:])
}

// batchReplySize is the size of one decision in a batch reply.
const batchReplySize = 4 + 6*8

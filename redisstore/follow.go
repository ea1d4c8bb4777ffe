package redisstore

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
)

// Following Sentinel's master.
//
// rueidis's Sentinel client follows +switch-master: it connects to the
// new master and closes its connections to the old one at once. But a
// connection it has dedicated (the coalescer's, coalesce.go) belongs to
// its holder until given back, and stays on the node it was made to: the
// coalescer's went on deciding on the deposed master, which Sentinel
// leaves a master for about 10 s before making it a replica (whose resync
// then threw those decisions away), or for ever if the Sentinels cannot
// reach it. So the store watches the master rueidis reports, and at a
// change retires every dedicated connection made before it: the idle ones
// at once, those in a call when the call ends (within its timeout). The
// next call dials the new master.
//
// The check reads rueidis's current master, at most every followEvery,
// from the calls themselves (no goroutine; an idle store checks before its
// next call), so a switch reaches every connection within followEvery of
// rueidis's own switch, which is a connection and a ROLE after the event.

// followEvery is how often, at most, the store compares the master rueidis
// reports with the one its connections were made to.
const followEvery = 10 * time.Millisecond

// sentinelRefresh is how often rueidis asks the Sentinels for the master
// even without an event (SentinelOption.TopologyRefreshInterval): a missed
// +switch-master, which left a store on the old master for good, is set
// right within this. Meanwhile a node that answers as a replica
// (READONLY) has its decisions refused, decided by the failure modes, and
// its connection replaced.
const sentinelRefresh = time.Second

// A follower tracks the master rueidis's Sentinel client talks to.
type follower struct {
	client   rueidis.Client
	onSwitch func(from, to string) // called at each change, by the goroutine that saw it
	gen      atomic.Uint64         // bumped at each change of master
	next     atomic.Int64          // when the next check is due (Unix ns); 0: at once
	mu       sync.Mutex            // one check at a time
	addr     string                // the master last seen; mu
}

func newFollower(c rueidis.Client, onSwitch func(from, to string)) *follower {
	f := &follower{client: c, onSwitch: onSwitch}
	f.addr = f.master()
	return f
}

// master returns the address of the master rueidis talks to now.
func (f *follower) master() string {
	for addr := range f.client.Nodes() {
		return addr // a Sentinel client's Nodes is its master alone
	}
	return ""
}

// current returns the generation of the master, checking rueidis's when a
// check is due. A connection made to an earlier generation is on a
// deposed master. The generation must be read before a connection is
// dedicated: one made during a switch then counts as the old master's, at
// worst retired once too often.
func (f *follower) current(now time.Time) uint64 {
	if now.UnixNano() >= f.next.Load() && f.mu.TryLock() {
		f.next.Store(now.Add(followEvery).UnixNano())
		if addr := f.master(); addr != "" && addr != f.addr {
			from := f.addr
			f.addr = addr
			f.gen.Add(1)
			f.mu.Unlock()
			f.onSwitch(from, addr)
			return f.gen.Load()
		}
		f.mu.Unlock()
	}
	return f.gen.Load()
}

// following is the generation of the master for a connection about to be
// made or reused: the follower's, or 0 without one.
func (s *Store) following() uint64 {
	if s.follow == nil {
		return 0
	}
	return s.follow.current(time.Now())
}

// checkMaster checks, when a check is due, whether Sentinel has switched
// masters: before a call asks the breaker, so that a breaker the old
// master opened (it died) lets the next call try the new one at once,
// rather than at its next probe.
func (s *Store) checkMaster() { s.following() }

// switched is called once per change of master: every connection of the
// coalescer made to an earlier one is retired, and the breaker, which
// counted the old master's failures, starts afresh.
func (s *Store) switched(from, to string) {
	s.opts.Logger.Warn("redisstore: Sentinel switched master; following", "from", from, "to", to)
	if s.co != nil {
		s.co.retireIdle(s.follow.gen.Load())
	}
	s.brks[0].success()
}

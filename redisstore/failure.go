package redisstore

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/memstore"
	"github.com/floodgate/floodgate/storekit"
)

// breaker stops every call paying the timeout while Redis is down: after
// threshold failures in a row it opens; after cooldown one call probes
// Redis (half-open), and its success closes the breaker. A probe whose
// caller never reports (it left, or found no time to ask Redis) is given
// up after another cooldown, and the next call probes: the breaker cannot
// stay open for want of an answer.
type breaker struct {
	mu        sync.Mutex
	threshold int
	cooldown  time.Duration
	failures  int
	open      bool
	probing   bool
	openedAt  time.Time
	probeAt   time.Time        // when the probe in flight began
	clock     func() time.Time // time.Now; tests set their own
	// troubled is set while failures, open or probing is: the healthy
	// path (every call while Redis answers) reads it and takes no lock.
	troubled atomic.Bool
	opens    atomic.Int64 // times it opened (Stats.BreakerOpens)
}

func (b *breaker) allow() bool {
	if !b.troubled.Load() {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.open {
		return true
	}
	now := b.now()
	if b.probing && now.Sub(b.probeAt) < b.cooldown || !b.probing && now.Sub(b.openedAt) < b.cooldown {
		return false
	}
	b.probing, b.probeAt = true, now
	return true
}

func (b *breaker) now() time.Time {
	if b.clock != nil {
		return b.clock()
	}
	return time.Now()
}

func (b *breaker) success() {
	if !b.troubled.Load() {
		return
	}
	b.mu.Lock()
	b.failures, b.open, b.probing = 0, false, false
	b.troubled.Store(false)
	b.mu.Unlock()
}

func (b *breaker) failure() {
	b.mu.Lock()
	b.troubled.Store(true)
	b.failures++
	if b.probing || b.failures >= b.threshold {
		if !b.open {
			b.opens.Add(1)
		}
		b.open, b.probing, b.openedAt = true, false, b.now()
	}
	b.mu.Unlock()
}

func (b *breaker) isOpen() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.open
}

// A Cluster's keys are spread over clusterSlots hash slots, whose masters
// fail on their own: the store keeps a breaker for each run of
// clusterBreakerSlots slots (256 breakers), so a master that is down or
// silent opens the breakers of its slots only. Masters own runs of slots,
// usually a few long ones, so a breaker rarely covers two masters; where
// one does, a failing master sends the other's keys of those 64 slots to
// the failure modes too, never the rest of the cluster.
const (
	clusterSlots        = 16384
	clusterBreakerSlots = 64
)

// breakerFor returns the breaker of the Redis key key: the store's only
// one, or in a Cluster its slots'.
func (s *Store) breakerFor(key string) *breaker {
	if len(s.brks) == 1 {
		return &s.brks[0]
	}
	return &s.brks[int(keySlot(key))/clusterBreakerSlots]
}

// breakerOpen reports whether a breaker is open: some keys (in a Cluster,
// those of a master that is failing; else all) go to the failure modes.
func (s *Store) breakerOpen() bool {
	for i := range s.brks {
		if b := &s.brks[i]; b.troubled.Load() && b.isOpen() {
			return true
		}
	}
	return false
}

// keySlot is Redis Cluster's hash slot of key: CRC16 (XMODEM) of its hash
// tag, the bytes between its first '{' and the next '}' when there are
// some, else of the whole key, modulo 16384.
func keySlot(key string) uint16 {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for k := 0; k < len(key); k++ {
		crc = crc<<8 ^ crc16Table[byte(crc>>8)^key[k]]
	}
	return crc % clusterSlots
}

// crc16Table is CRC-16/XMODEM's table (polynomial 0x1021), Redis Cluster's.
var crc16Table = func() (t [256]uint16) {
	for i := range t {
		c := uint16(i) << 8
		for range 8 {
			if c&0x8000 != 0 {
				c = c<<1 ^ 0x1021
			} else {
				c <<= 1
			}
		}
		t[i] = c
	}
	return t
}()

// fallback decides by the rules' failure modes: a rule that fails closed
// denies; rules that fail to a local limit are enforced in process memory
// at their share; rules that fail open drop out.
type fallback struct {
	mem *memstore.Store
	ls  *localSync // seeds and charges back the local rules (localsync.go)
}

type plan struct {
	closed *floodgate.Rule   // the first rule failing closed
	local  *floodgate.Policy // the local-share rules, scaled
	index  []int             // local rule i is the policy's rule index[i]
	first  floodgate.Rule    // for reporting an open admission
}

func newFallback() (*fallback, error) {
	m, err := memstore.New(memstore.Options{MaxKeys: 1 << 20})
	if err != nil {
		return nil, err
	}
	return &fallback{mem: m}, nil
}

func (f *fallback) close() error { return f.mem.Close() }

func (f *fallback) plan(p *floodgate.Policy) *plan {
	return storekit.Attached(p, f, func() any { return f.newPlan(p) }).(*plan)
}

// newPlan builds p's plan (see plan).
func (f *fallback) newPlan(p *floodgate.Policy) *plan {
	rules := p.Rules()
	pl := &plan{first: rules[0]}
	var local []floodgate.Rule
	for i, r := range rules {
		switch r.OnStoreFailure {
		case floodgate.FailClosed:
			if pl.closed == nil {
				pl.closed = &rules[i]
			}
		case floodgate.FailLocal:
			scale := func(x int64) int64 {
				if x == 0 {
					return 0
				}
				return max(1, x*r.LocalPercent/100)
			}
			r.Limit, r.Burst, r.ElasticCeiling = scale(r.Limit), scale(r.Burst), scale(r.ElasticCeiling)
			if r.Mode == floodgate.Elastic && r.ElasticCeiling <= max(r.Burst, r.Limit) {
				r.Mode, r.ElasticCeiling, r.Spare = "", 0, nil
			}
			r.OnStoreFailure, r.LocalPercent = "", 0
			local = append(local, r)
			pl.index = append(pl.index, i)
		}
	}
	if len(local) > 0 {
		lp, err := floodgate.NewPolicy("floodgate-fallback:"+p.Name(), local...)
		if err == nil {
			pl.local = lp
		}
	}
	return pl
}

func (f *fallback) decide(ctx context.Context, now int64, op *floodgate.Op) floodgate.Decision {
	pl := f.plan(op.Policy)
	switch {
	case pl.closed != nil && op.Kind != floodgate.OpRefund && op.Kind != floodgate.OpReset:
		return floodgate.Decision{Limit: pl.closed.Limit, Rule: pl.closed.Name, Reason: floodgate.ReasonStoreUnavailable, RetryAfter: time.Second}
	case pl.local != nil:
		lop := *op
		lop.Policy, lop.Spare = pl.local, 0
		for j, i := range pl.index {
			if op.Spare&(1<<i) != 0 {
				lop.Spare |= 1 << j
			}
		}
		if d, err := f.local(ctx, now, op, pl, lop); err == nil {
			return d
		}
	}
	return floodgate.Decision{Allowed: true, Limit: pl.first.Limit, Remaining: pl.first.Limit, Rule: pl.first.Name}
}

func sha1hex(s string) string {
	h := sha1.Sum([]byte(s))
	return hex.EncodeToString(h[:])
}

// failed counts and logs a failed call, which started at start (µs) under
// sctx, and feeds its breaker unless the failure is this process's
// starvation (excused, starve.go).
func (s *Store) failed(brk *breaker, err error, sctx context.Context, start int64) {
	s.errs.Add(1)
	if errors.Is(err, context.DeadlineExceeded) {
		s.timeouts.Add(1)
	}
	excused, lag := s.excused(err, sctx, start)
	if excused {
		s.starved.Add(1)
		// not a failure, but calls go through within until Redis answers
		// again: a caller that finds a connection being made again must
		// not wait for it past its deadline (see within)
		brk.troubled.Store(true)
		if s.adapt != nil {
			// its latency is at least this long: a busy host's calls
			// raise the timeout even when none of them comes back in time
			s.adapt.observe(time.Now().UnixMicro() - start)
		}
	} else {
		brk.failure()
	}
	now := time.Now().Unix()
	if last := s.lastLog.Load(); now != last && s.lastLog.CompareAndSwap(last, now) {
		if excused {
			s.opts.Logger.Warn("redisstore: call timed out while this process was starved of CPU; not held against Redis; rules' failure modes decide",
				"lag", lag, "timeouts_excused", s.starved.Load())
			return
		}
		s.opts.Logger.Error("redisstore: call failed; rules' failure modes decide", "err", err,
			"errors", s.errs.Load(), "breaker_open", brk.isOpen())
	}
}

// degrade decides op by its rules' failure modes.
func (s *Store) degrade(ctx context.Context, now int64, op *floodgate.Op, cause error) floodgate.Decision {
	s.degraded.Add(1)
	d := s.fallback.decide(ctx, now, op)
	d.Degraded = true
	return d
}

package service

import (
	"cmp"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/floodgate/floodgate/internal/decide"
	"github.com/floodgate/floodgate/rules"
)

// Recording's defaults and bounds (Options.Record).
const (
	DefaultRecordWindow     = 5 * time.Minute // serve's --record-window
	DefaultRecordMaxEntries = 200_000         // RecordOptions.MaxEntries's default
	DefaultRecordMaxBytes   = 64 << 20        // RecordOptions.MaxBytes's default
	// MaxRecordWindow bounds Record.Window: a what-if replays at most
	// this much of the past.
	MaxRecordWindow = time.Hour
)

// RecordOptions configure the traffic recorder that POST /v1/whatif
// replays. The zero value records nothing: the decision path then costs
// one nil check more.
type RecordOptions struct {
	// Window is how much of the past is kept (0: no recording; at most
	// MaxRecordWindow).
	Window time.Duration
	// MaxEntries caps the requests kept (default DefaultRecordMaxEntries)
	// and MaxBytes their estimated size (default DefaultRecordMaxBytes).
	// When either binds, the oldest requests are dropped: the newest are
	// kept whole, and a what-if says it covers less than the window asked.
	MaxEntries int
	MaxBytes   int64
	// Rules are the options the rules files of a what-if are read with
	// (serve's --calendar-month).
	Rules rules.Options
}

// record is one recorded request.
type record struct {
	at     int64  // the service clock's time (Unix µs)
	seq    uint64 // arrival order
	domain string
	descs  []decide.Descriptor // entries copied; their strings shared with the request (nil: one)
	one    decide.Descriptor   // the request's one descriptor, when descs is nil
	size   int64               // estimated bytes held
}

// descriptors returns the request's descriptors; buf holds a request's
// one descriptor.
func (r *record) descriptors(buf *[1]decide.Descriptor) []decide.Descriptor {
	if r.descs != nil {
		return r.descs
	}
	buf[0] = r.one
	return buf[:]
}

// recordOverhead is a record's estimated bytes besides its strings: the
// record, a descriptor, an entry (their headers and slices).
const (
	recordOverhead = 64
	descOverhead   = 56
	entryOverhead  = 32
)

// requestLog keeps the newest requests of the last window, bounded by
// entries and bytes, in shards (a request goes to the next shard in turn,
// so that concurrent requests seldom wait for one lock); each shard a ring
// that grows to its share of the caps.
type requestLog struct {
	window int64 // µs
	seq    atomic.Uint64
	shards []recShard
}

// recShard is one shard of a requestLog.
type recShard struct {
	maxEntries int
	maxBytes   int64

	mu      sync.Mutex
	ring    []record
	head, n int
	bytes   int64
	// cutAt is the time of the newest request dropped for a cap (not for
	// age), 0 if none: a window starting at or before it is incomplete.
	cutAt int64
	_     [64]byte // each shard's lock on cache lines of its own
}

// recordShards is how many shards a recorder of maxEntries has: one a
// 4,096 entries, a power of two from 1 to 8 (a small recorder keeps
// exactly its newest maxEntries).
func recordShards(maxEntries int) int {
	n := 1
	for n < 8 && n*2*4096 <= maxEntries {
		n *= 2
	}
	return n
}

func newRequestLog(o RecordOptions) *requestLog {
	if o.Window <= 0 {
		return nil
	}
	if o.MaxEntries <= 0 {
		o.MaxEntries = DefaultRecordMaxEntries
	}
	if o.MaxBytes <= 0 {
		o.MaxBytes = DefaultRecordMaxBytes
	}
	n := recordShards(o.MaxEntries)
	r := &requestLog{window: min(o.Window, MaxRecordWindow).Microseconds(), shards: make([]recShard, n)}
	for i := range r.shards {
		r.shards[i].maxEntries, r.shards[i].maxBytes = o.MaxEntries/n, o.MaxBytes/int64(n)
	}
	return r
}

// record records req for what-ifs, as Decide reads it (cfg: the rules it
// is decided under, for a descriptor's own limit). Its descriptors are
// built again here, on the heap: handing the recorder Decide's
// stack-allocated ones would move them to the heap for every request,
// recording or not.
func (s *Service) record(cfg *rules.Config, req *rlsv3.RateLimitRequest) {
	n := 0
	for _, d := range req.Descriptors {
		if len(d.GetEntries()) > MaxEntries {
			return // refused as malformed: nothing a replay could decide, and no room taken
		}
		n += len(d.GetEntries())
	}
	entries := make([]rules.Entry, 0, n)
	rec := record{at: s.opts.Clock.NowMicro(), domain: req.Domain, size: int64(recordOverhead + len(req.Domain))}
	if len(req.Descriptors) > 1 {
		rec.descs = make([]decide.Descriptor, len(req.Descriptors))
	}
	for i, d := range req.Descriptors {
		start := len(entries)
		entries = appendEntries(entries, d)
		desc := s.descriptor(cfg, req, d, entries[start:len(entries):len(entries)])
		if rec.descs == nil {
			rec.one = desc // most requests: one descriptor, kept in the record (one allocation less)
		} else {
			rec.descs[i] = desc
		}
		rec.size += descOverhead
		for _, e := range entries[start:] {
			rec.size += entryOverhead + int64(len(e.Key)+len(e.Value))
		}
	}
	rec.seq = s.reqLog.seq.Add(1)
	sh := &s.reqLog.shards[rec.seq&uint64(len(s.reqLog.shards)-1)]
	sh.mu.Lock()
	sh.push(rec, s.reqLog.window)
	sh.mu.Unlock()
}

// push appends rec, dropping the requests older than the window and, while
// a cap binds, the oldest. r.mu is held.
func (r *recShard) push(rec record, window int64) {
	for r.n > 0 && r.ring[r.head].at < rec.at-window {
		r.drop()
	}
	for r.n > 0 && (r.n >= r.maxEntries || r.bytes+rec.size > r.maxBytes) {
		r.cutAt = max(r.cutAt, r.ring[r.head].at)
		r.drop()
	}
	if r.n == len(r.ring) {
		r.grow()
	}
	r.ring[(r.head+r.n)%len(r.ring)] = rec
	r.n++
	r.bytes += rec.size
}

// drop forgets the oldest request.
func (r *recShard) drop() {
	r.bytes -= r.ring[r.head].size
	r.ring[r.head] = record{}
	r.head = (r.head + 1) % len(r.ring)
	r.n--
}

// grow doubles the ring, up to maxEntries.
func (r *recShard) grow() {
	size := min(max(2*len(r.ring), 1024), r.maxEntries)
	ring := make([]record, size)
	for i := 0; i < r.n; i++ {
		ring[i] = r.ring[(r.head+i)%len(r.ring)]
	}
	r.ring, r.head = ring, 0
}

// recording is what a what-if replays: the requests of a window, in time
// order.
type recording struct {
	records []record
	from    int64 // the window asked for starts here (Unix µs)
	to      int64 // and ends here
	// truncated: requests of the window were dropped for the recorder's
	// caps; the recording starts at its first request, not at from.
	truncated bool
	// coversFrom is when the recording kept whole starts: from, or just
	// after the newest request dropped for a cap.
	coversFrom int64
}

// snapshot copies the records of the last d before now (the records
// themselves are never changed after they are pushed, so they are
// shared), sorted by time, then arrival.
func (r *requestLog) snapshot(now int64, d time.Duration) recording {
	from := now - d.Microseconds()
	var out []record
	var cutAt int64
	for i := range r.shards {
		sh := &r.shards[i]
		sh.mu.Lock()
		out = slices.Grow(out, sh.n)
		for j := 0; j < sh.n; j++ {
			if rec := sh.ring[(sh.head+j)%len(sh.ring)]; rec.at >= from {
				out = append(out, rec)
			}
		}
		cutAt = max(cutAt, sh.cutAt)
		sh.mu.Unlock()
	}
	slices.SortFunc(out, func(a, b record) int {
		if c := cmp.Compare(a.at, b.at); c != 0 {
			return c
		}
		return cmp.Compare(a.seq, b.seq)
	})
	rec := recording{records: out, from: from, to: now, coversFrom: from}
	if cutAt >= from {
		rec.truncated, rec.coversFrom = true, cutAt+1
	}
	return rec
}

package service

import (
	"slices"
	"sync"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/floodgate/floodgate/internal/decide"
	"github.com/floodgate/floodgate/rules"
)

// Recording's defaults and bounds (Options.Record).
const (
	DefaultRecordWindow     = 5 * time.Minute
	DefaultRecordMaxEntries = 200_000
	DefaultRecordMaxBytes   = 64 << 20
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
	at     int64 // the service clock's time (Unix µs)
	domain string
	descs  []decide.Descriptor // entries copied; their strings shared with the request
	size   int64               // estimated bytes held
}

// recordOverhead is a record's estimated bytes besides its strings: the
// record, a descriptor, an entry (their headers and slices).
const (
	recordOverhead = 64
	descOverhead   = 56
	entryOverhead  = 32
)

// recorder keeps the newest requests of the last window, in arrival
// order, bounded by entries and bytes: a ring that grows to its cap.
type recorder struct {
	window     int64 // µs
	maxEntries int
	maxBytes   int64

	mu      sync.Mutex
	ring    []record
	head, n int
	bytes   int64
	// cutAt is the time of the newest request dropped for a cap (not for
	// age), 0 if none: a window starting at or before it is incomplete.
	cutAt int64
	cut   int64 // requests dropped for a cap, ever
}

func newRecorder(o RecordOptions) *recorder {
	if o.Window <= 0 {
		return nil
	}
	if o.MaxEntries <= 0 {
		o.MaxEntries = DefaultRecordMaxEntries
	}
	if o.MaxBytes <= 0 {
		o.MaxBytes = DefaultRecordMaxBytes
	}
	return &recorder{window: min(o.Window, MaxRecordWindow).Microseconds(), maxEntries: o.MaxEntries, maxBytes: o.MaxBytes}
}

// record records req for what-ifs, as Decide reads it (cfg: the rules it
// is decided under, for a descriptor's own limit). Its descriptors are
// built again here, on the heap: handing the recorder Decide's
// stack-allocated ones would move them to the heap for every request,
// recording or not.
func (s *Service) record(cfg *rules.Config, req *rlsv3.RateLimitRequest) {
	var entries []rules.Entry
	descs := make([]decide.Descriptor, len(req.Descriptors))
	size := int64(recordOverhead + len(req.Domain))
	for i, d := range req.Descriptors {
		start := len(entries)
		entries = appendEntries(entries, d)
		descs[i] = s.descriptor(cfg, req, d, entries[start:len(entries):len(entries)])
		size += descOverhead
		for _, e := range entries[start:] {
			size += entryOverhead + int64(len(e.Key)+len(e.Value))
		}
	}
	rec := record{at: s.opts.Clock.NowMicro(), domain: req.Domain, descs: descs, size: size}
	s.rec.mu.Lock()
	s.rec.push(rec)
	s.rec.mu.Unlock()
}

// push appends rec, dropping the requests older than the window and, while
// a cap binds, the oldest. r.mu is held.
func (r *recorder) push(rec record) {
	for r.n > 0 && r.ring[r.head].at < rec.at-r.window {
		r.drop()
	}
	for r.n > 0 && (r.n >= r.maxEntries || r.bytes+rec.size > r.maxBytes) {
		r.cutAt = max(r.cutAt, r.ring[r.head].at)
		r.cut++
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
func (r *recorder) drop() {
	r.bytes -= r.ring[r.head].size
	r.ring[r.head] = record{}
	r.head = (r.head + 1) % len(r.ring)
	r.n--
}

// grow doubles the ring, up to maxEntries.
func (r *recorder) grow() {
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
// themselves are never changed after add, so they are shared), sorted by
// time (stable: requests of one microsecond keep their arrival order).
func (r *recorder) snapshot(now int64, d time.Duration) recording {
	from := now - d.Microseconds()
	r.mu.Lock()
	out := make([]record, 0, r.n)
	for i := 0; i < r.n; i++ {
		if rec := r.ring[(r.head+i)%len(r.ring)]; rec.at >= from {
			out = append(out, rec)
		}
	}
	cutAt := r.cutAt
	r.mu.Unlock()
	slices.SortStableFunc(out, func(a, b record) int {
		switch {
		case a.at < b.at:
			return -1
		case a.at > b.at:
			return 1
		}
		return 0
	})
	rec := recording{records: out, from: from, to: now, coversFrom: from}
	if cutAt >= from {
		rec.truncated, rec.coversFrom = true, cutAt+1
	}
	return rec
}

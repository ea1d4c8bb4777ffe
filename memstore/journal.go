package memstore

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/storekit"
)

// The journal keeps what the snapshot does not: every state change since
// the last snapshot, so that a crash (kill -9, an OOM kill, a power loss)
// does not forgive everything counted since the last snapshot.
//
// Each change appends a record with the key's hash, its whole new state
// and the policy it is under (the identity the snapshot keeps: the
// policy's name and rules), to a buffer in memory, under the key's shard
// lock, so that a key's records are in the order of its changes. A record
// is a whole state, not the operation, so replaying a record twice, or
// over a snapshot that already holds it, changes nothing.
//
// The buffer reaches the segment file by write(2) (then it is in the
// kernel: a crash of the process cannot lose it) and the disk by fsync
// (then a power loss cannot either), in a group commit:
//
//   - a flusher writes the buffer every Options.JournalSync, or as soon as
//     JournalSyncRecords records wait, and has another goroutine fsync the
//     segment after each write (a slow fsync holds up no write);
//   - with JournalWriteThrough, a change returns only once its record is
//     written: the first change to wait writes the whole buffer, those
//     made meanwhile with it, so a process crash loses no change that was
//     returned.
//
// So a process crash loses the changes of the last JournalSync (none that
// returned, writing through), a power loss those since the last fsync:
// one JournalSync and the fsync's own duration.
//
// Segments are files named JournalPath.<16 hex digits>, numbered in order.
// A snapshot of SnapshotPath first starts a new segment (the old one is
// written and fsynced), then writes the snapshot, renames it into place,
// fsyncs the directory and only then deletes the older segments: a crash
// at any point leaves a snapshot and every segment written after it. The
// snapshot names the first segment it does not hold (a trailer), so that
// older segments a crash left (between the rename and the deletion) are
// passed over, not replayed over newer states.
//
// Segment layout, little-endian:
//
//	magic "floodgate-journal\x00\x01", hash key k0, k1 (uint64 each),
//	segment number (uint64), CRC-32C of the preceding 44 bytes (uint32)
//	records: length n (uint32), CRC-32C of the n bytes that follow
//	(uint32), then n bytes: a type byte and its payload
//	    'P' policy id (uint32), words per key w (uint32), JSON header
//	        (the snapshot's: policy name and rules)
//	    'K' policy id (uint32), key hash (uint64), w-1 state words (int64)
//	        (all zero: the key is gone, its state fresh)
//
// A policy's 'P' record comes before its keys' records in each segment.
const journalMagic = "floodgate-journal\x00\x01"

const (
	journalHeaderLen = len(journalMagic) + 28
	recPolicy        = 'P'
	recKey           = 'K'
	maxRecord        = 1 << 26 // a record's bytes at most (a sliding log of 8 M)
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// journal is a store's journal.
type journal struct {
	s     *Store
	base  string // segment paths: base.%016x
	syncN int
	kick  chan struct{} // the flusher's wake-up at syncN records
	// syncReq asks syncer for an fsync
	syncReq chan struct{}

	mu       sync.Mutex // guards what follows up to wmu
	buf      []byte     // records not yet written
	pending  int        // records in buf
	appended uint64     // records appended in all
	pols     map[*floodgate.Policy]uint32
	f        *os.File // the current segment
	seq      uint64   // its number
	closed   bool

	wmu     sync.Mutex    // one writer at a time (flush, rotate, close)
	spare   []byte        // under wmu: the buffer the next swap hands out
	written atomic.Uint64 // records handed to write(2) (appended, when taken)
	dirty   atomic.Bool   // records written since the last fsync began
	syncMu  sync.Mutex    // held over an fsync and a segment's closing

	// through: a change waits until its record is written (Options.JournalWriteThrough)
	through bool

	snapMu sync.Mutex // one journaled snapshot at a time

	records, writes, syncs, errs atomic.Int64
	dropped                      atomic.Int64 // records lost to write errors
}

// JournalStats are a journal's counters.
type JournalStats struct {
	Records int64  // records appended
	Writes  int64  // write(2) calls that wrote records
	Syncs   int64  // fsyncs of the journal (group commits)
	Errors  int64  // write or fsync errors (each logged)
	Lost    int64  // records lost to those errors
	Segment uint64 // the current segment's number
}

// JournalStats returns the journal's counters (zero without a journal).
func (s *Store) JournalStats() JournalStats {
	j := s.jr
	if j == nil {
		return JournalStats{}
	}
	j.mu.Lock()
	seq := j.seq
	j.mu.Unlock()
	return JournalStats{Records: j.records.Load(), Writes: j.writes.Load(), Syncs: j.syncs.Load(), Errors: j.errs.Load(), Lost: j.dropped.Load(), Segment: seq}
}

// SyncJournal writes every record appended so far to the journal and
// fsyncs it, as the background flusher does every JournalSync.
func (s *Store) SyncJournal() error {
	if s.jr == nil {
		return nil
	}
	return s.jr.flush()
}

// openJournal replays the journal's segments over the restored snapshot
// (keyed: the snapshot set the hash key), from segment from on (the
// snapshot holds those before: a crash after its rename left them), and
// starts a new segment. It runs in New, before the store is shared.
func (s *Store) openJournal(base string, keyed bool, from uint64) (*journal, error) {
	j := &journal{s: s, base: base, syncN: s.opts.JournalSyncRecords, kick: make(chan struct{}, 1), syncReq: make(chan struct{}, 1),
		pols: map[*floodgate.Policy]uint32{}, through: s.opts.JournalWriteThrough}
	if j.syncN <= 0 {
		j.syncN = defaultJournalSyncRecords
	}
	seqs, err := j.segments()
	if err != nil {
		return nil, err
	}
	now := s.opts.Clock.NowMicro()
	for _, seq := range seqs {
		j.seq = seq
		path := j.path(seq)
		if seq < from {
			// replayed, its older states would be undone by the newer
			// segments, but a policy's older layout would convert the
			// table back and forth, clamping what it held
			s.opts.Logger.Info("memstore: journal segment older than the snapshot: passed over", "path", path)
			continue
		}
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("memstore: journal: %w", err)
		}
		rep := s.replay(bufio.NewReaderSize(f, 1<<16), &keyed, now)
		f.Close()
		if rep.err != nil {
			return nil, fmt.Errorf("memstore: journal %s: %w", path, rep.err)
		}
		if rep.bad != "" {
			s.opts.Logger.Warn("memstore: journal segment damaged: the records before the damage were replayed, the rest of the segment is dropped",
				"path", path, "offset", rep.off, "records", rep.n, "damage", rep.bad)
		} else {
			s.opts.Logger.Info("memstore: journal replayed", "path", path, "records", rep.n)
		}
	}
	if from > 0 && j.seq < from-1 {
		// no segment from the snapshot's on (the journal moved, or was
		// deleted): the new one must not be numbered below it
		j.seq = from - 1
	}
	f, err := j.create(j.seq + 1)
	if err != nil {
		return nil, err
	}
	j.f, j.seq = f, j.seq+1
	return j, nil
}

// segments lists the journal's segment numbers, in order.
func (j *journal) segments() ([]uint64, error) {
	dir, prefix := filepath.Dir(j.base), filepath.Base(j.base)+"."
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("memstore: journal: %w", err)
	}
	var seqs []uint64
	for _, e := range ents {
		name := e.Name()
		if !strings.HasPrefix(name, prefix) || len(name) != len(prefix)+16 || !e.Type().IsRegular() {
			continue
		}
		if seq, err := strconv.ParseUint(name[len(prefix):], 16, 64); err == nil {
			seqs = append(seqs, seq)
		}
	}
	slices.Sort(seqs)
	return seqs, nil
}

func (j *journal) path(seq uint64) string { return fmt.Sprintf("%s.%016x", j.base, seq) }

// create makes segment seq with its header, fsynced with its directory.
func (j *journal) create(seq uint64) (*os.File, error) {
	f, err := os.OpenFile(j.path(seq), os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("memstore: journal: %w", err)
	}
	_, err = f.Write(journalHeader(j.s.k0, j.s.k1, seq))
	if err == nil {
		err = f.Sync()
	}
	if err == nil {
		err = syncDir(filepath.Dir(j.base))
	}
	if err != nil {
		f.Close()
		os.Remove(f.Name())
		return nil, fmt.Errorf("memstore: journal: %w", err)
	}
	return f, nil
}

func journalHeader(k0, k1, seq uint64) []byte {
	le := binary.LittleEndian
	b := []byte(journalMagic)
	b = le.AppendUint64(b, k0)
	b = le.AppendUint64(b, k1)
	b = le.AppendUint64(b, seq)
	return le.AppendUint32(b, crc32.Checksum(b, crcTable))
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	d.Close()
	return err
}

// key appends a record of key h's state in shard sh of t (absent: a
// fresh, zero state) and returns its number, for wait. The shard is
// locked.
func (j *journal) key(t *table, sh *shard, h uint64) uint64 {
	var state []int64
	if i := sh.find(h); i >= 0 {
		state = sh.state(i)
	}
	return j.record(t.policy.Load(), h, state)
}

// record appends a record of key h's state under p (nil: zero) and
// returns its number (0: the journal is closed).
func (j *journal) record(p *floodgate.Policy, h uint64, state []int64) uint64 {
	le := binary.LittleEndian
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		return 0
	}
	id, ok := j.pols[p]
	if !ok {
		id = j.declare(p)
	}
	w := storekit.Width(p)
	start := len(j.buf)
	j.buf = slices.Grow(j.buf, 8+13+8*w)
	j.buf = append(j.buf, 0, 0, 0, 0, 0, 0, 0, 0, recKey)
	j.buf = le.AppendUint32(j.buf, id)
	j.buf = le.AppendUint64(j.buf, h)
	if state == nil {
		j.buf = append(j.buf, make([]byte, 8*w)...)
	} else {
		for _, x := range state[:w] {
			j.buf = le.AppendUint64(j.buf, uint64(x))
		}
	}
	seal(j.buf[start:])
	j.pending++
	j.appended++
	seq := j.appended
	j.records.Add(1)
	if j.pending >= j.syncN {
		select {
		case j.kick <- struct{}{}:
		default:
		}
	}
	j.mu.Unlock()
	return seq
}

// wait returns once record seq is written to the segment (write(2): in
// the kernel, where a kill -9 of the process cannot lose it), when the
// journal writes through; at once otherwise. Callers waiting together
// are written together: the first to take wmu writes every record
// appended so far (a group commit without the fsync, which the flusher
// does).
func (j *journal) wait(seq uint64) {
	if !j.through || seq == 0 || j.written.Load() >= seq {
		return
	}
	j.wmu.Lock()
	if j.written.Load() < seq {
		b, n, f, upto := j.take()
		j.write(f, b, n)
		j.written.Store(upto)
		j.spare = b[:0]
	}
	j.wmu.Unlock()
}

// declare appends p's 'P' record and returns its id in this segment.
// j.mu is held.
func (j *journal) declare(p *floodgate.Policy) uint32 {
	le := binary.LittleEndian
	id := uint32(len(j.pols))
	j.pols[p] = id
	hdr, err := json.Marshal(header(p))
	if err != nil { // plain values: cannot happen
		panic(err)
	}
	start := len(j.buf)
	j.buf = append(j.buf, 0, 0, 0, 0, 0, 0, 0, 0, recPolicy)
	j.buf = le.AppendUint32(j.buf, id)
	j.buf = le.AppendUint32(j.buf, uint32(1+storekit.Width(p)))
	j.buf = append(j.buf, hdr...)
	seal(j.buf[start:])
	return id
}

// seal fills in a record's length and checksum.
func seal(rec []byte) {
	body := rec[8:]
	binary.LittleEndian.PutUint32(rec, uint32(len(body)))
	binary.LittleEndian.PutUint32(rec[4:], crc32.Checksum(body, crcTable))
}

// Journal defaults (Options.JournalSync, JournalSyncRecords).
const (
	defaultJournalSync        = 10 * time.Millisecond
	defaultJournalSyncRecords = 1000
)

// startJournal starts the journal's flusher, if there is a journal.
func (s *Store) startJournal() {
	if s.jr == nil {
		return
	}
	var tick <-chan time.Time
	d := s.opts.JournalSync
	if d == 0 {
		d = defaultJournalSync
	}
	var ticker *time.Ticker
	switch {
	case s.opts.journalTick != nil:
		tick = s.opts.journalTick // a test's
	case d > 0:
		ticker = time.NewTicker(d)
		tick = ticker.C
	}
	s.wg.Add(2)
	go func() {
		if ticker != nil {
			defer ticker.Stop()
		}
		s.jr.run(s.stop, tick)
	}()
	go s.jr.syncer(s.stop)
}

// run is the flusher: every tick (nil: none) and whenever syncN records
// wait, until stop, it writes the records waiting and asks syncer for an
// fsync. The fsync is syncer's, so that a slow one (a busy disk: 200 ms
// was seen) does not hold up the writes: a process crash loses only what
// is not written, a power loss what is not fsynced.
func (j *journal) run(stop <-chan struct{}, tick <-chan time.Time) {
	defer j.s.wg.Done()
	for {
		select {
		case <-stop:
			return
		case <-tick:
		case <-j.kick:
		}
		// written by wait (write-through) or here: not yet fsynced
		if j.writeOut(); j.dirty.Load() {
			select {
			case j.syncReq <- struct{}{}:
			default: // one is asked for already: it will have these too
			}
		}
	}
}

// syncer fsyncs the segment whenever run asks, until stop.
func (j *journal) syncer(stop <-chan struct{}) {
	defer j.s.wg.Done()
	for {
		select {
		case <-stop:
			return
		case <-j.syncReq:
			j.syncCurrent()
		}
	}
}

// take hands out the records buffered so far, the segment they go to
// and the number of the last. wmu is held.
func (j *journal) take() ([]byte, int, *os.File, uint64) {
	j.mu.Lock()
	b, n, f, upto := j.buf, j.pending, j.f, j.appended
	j.buf, j.pending = j.spare[:0], 0
	j.mu.Unlock()
	return b, n, f, upto
}

// flush writes the buffered records and fsyncs the segment.
func (j *journal) flush() error {
	if _, err := j.writeOut(); err != nil {
		return err
	}
	return j.syncCurrent()
}

// writeOut writes the buffered records, if any, and says whether it did.
func (j *journal) writeOut() (bool, error) {
	j.wmu.Lock()
	defer j.wmu.Unlock()
	b, n, f, upto := j.take()
	err := j.write(f, b, n)
	j.written.Store(upto)
	j.spare = b[:0]
	return len(b) > 0, err
}

// syncCurrent fsyncs the current segment, outside wmu: writers (wait, run)
// are not held up by it. A segment rotated or closed meanwhile was
// fsynced then.
func (j *journal) syncCurrent() error {
	j.syncMu.Lock()
	defer j.syncMu.Unlock()
	j.mu.Lock()
	f := j.f
	j.mu.Unlock()
	if f == nil {
		return nil
	}
	j.dirty.Store(false) // a write from now on asks for another
	return j.sync(f)
}

// sync fsyncs f; an error is logged and counted.
func (j *journal) sync(f *os.File) error {
	if err := f.Sync(); err != nil {
		j.errs.Add(1)
		j.s.opts.Logger.Error("memstore: journal fsync failed: changes since the last one may be lost in a power loss", "path", f.Name(), "err", err)
		return fmt.Errorf("memstore: journal: %w", err)
	}
	j.syncs.Add(1)
	return nil
}

// write writes n records (b) to f. An error is logged and counted; its
// records are lost. wmu is held.
func (j *journal) write(f *os.File, b []byte, n int) error {
	if len(b) == 0 || f == nil {
		return nil
	}
	if _, err := f.Write(b); err != nil {
		j.errs.Add(1)
		j.dropped.Add(int64(n))
		j.s.opts.Logger.Error("memstore: journal write failed: these changes would be lost in a crash before the next snapshot",
			"path", f.Name(), "records", n, "err", err)
		return fmt.Errorf("memstore: journal: %w", err)
	}
	j.writes.Add(1)
	j.dirty.Store(true)
	return nil
}

// rotate starts a new segment, then writes and fsyncs the records left
// for the old one and closes it. It returns the new segment's number:
// every change made before rotate returned is in a segment before it.
func (j *journal) rotate() (uint64, error) {
	j.wmu.Lock()
	defer j.wmu.Unlock()
	j.mu.Lock()
	seq, closed := j.seq+1, j.closed
	j.mu.Unlock()
	if closed {
		return 0, errors.New("memstore: journal closed")
	}
	nf, err := j.create(seq)
	if err != nil {
		return 0, err
	}
	j.mu.Lock()
	b, n, of, upto := j.buf, j.pending, j.f, j.appended
	j.buf, j.pending, j.f, j.seq = j.spare[:0], 0, nf, seq
	clear(j.pols)
	j.mu.Unlock()
	err = j.write(of, b, n)
	j.written.Store(upto)
	j.spare = b[:0]
	j.syncMu.Lock()
	defer j.syncMu.Unlock()
	if err == nil {
		err = j.sync(of)
	}
	if cerr := of.Close(); err == nil && cerr != nil {
		err = cerr
	}
	return seq, err
}

// snapshot writes a snapshot to path in step with the journal: a new
// segment first, the snapshot, then the segments before the new one go.
func (j *journal) snapshot(path string) error {
	j.snapMu.Lock()
	defer j.snapMu.Unlock()
	seq, rerr := j.rotate()
	from := seq
	if rerr != nil {
		from = 0 // the old segment may miss records the snapshot holds
	}
	if err := j.s.snapshotFrom(path, from); err != nil {
		return err
	}
	if err := syncDir(filepath.Dir(path)); err != nil {
		return fmt.Errorf("memstore: snapshot %s: %w", path, err)
	}
	if rerr != nil {
		return rerr // keep the old segments
	}
	seqs, err := j.segments()
	if err != nil {
		return err
	}
	for _, old := range seqs {
		if old < seq {
			if err := os.Remove(j.path(old)); err != nil {
				return fmt.Errorf("memstore: journal: %w", err)
			}
		}
	}
	return nil
}

// close writes what is buffered and closes the segment; records appended
// afterwards are dropped.
func (j *journal) close() error {
	j.wmu.Lock()
	defer j.wmu.Unlock()
	b, n, f, upto := j.take()
	err := j.write(f, b, n)
	j.written.Store(upto)
	j.mu.Lock()
	j.closed, j.f = true, nil
	j.mu.Unlock()
	if f != nil {
		j.syncMu.Lock()
		defer j.syncMu.Unlock()
		if err == nil {
			err = j.sync(f)
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	return err
}

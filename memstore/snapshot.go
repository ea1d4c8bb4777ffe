package memstore

import (
	"bufio"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/compiled"
	"github.com/floodgate/floodgate/storekit"
)

// Snapshot file layout, little-endian:
//
//	magic "floodgate-memstore\x00" version byte 1
//	hash key k0, k1 (uint64 each)
//	table count (uint32), then per table:
//	    header length (uint32) and JSON header (policy name and rules)
//	    words per slot w (uint32), key count (uint64)
//	    count × w int64 words: the key's hash, then its state
//	optionally, a trailer: "floodgate-journal-from\x00" and a uint64, the
//	first journal segment the snapshot does not hold (readers before the
//	journal ignore it, as any bytes after the tables)
//
// The file holds the hash key, so it is written with mode 0600.
const (
	snapMagic   = "floodgate-memstore\x00\x01"
	snapTrailer = "floodgate-journal-from\x00"
)

type snapRule struct {
	Name           string              `json:"name"`
	Algorithm      floodgate.Algorithm `json:"algorithm"`
	Limit          int64               `json:"limit"`
	Period         time.Duration       `json:"period"`
	Burst          int64               `json:"burst,omitempty"`
	Refill         floodgate.Refill    `json:"refill,omitempty"`
	Granularity    time.Duration       `json:"granularity,omitempty"`
	Calendar       floodgate.Calendar  `json:"calendar,omitempty"`
	Location       string              `json:"location,omitempty"`
	WeekStart      time.Weekday        `json:"week_start,omitempty"`
	CountRejected  bool                `json:"count_rejected,omitempty"`
	Mode           floodgate.Mode      `json:"mode,omitempty"`
	SoftPercent    int64               `json:"soft_percent,omitempty"`
	ElasticCeiling int64               `json:"elastic_ceiling,omitempty"`
}

type snapHeader struct {
	Policy string     `json:"policy"`
	Rules  []snapRule `json:"rules"`
}

// Snapshot writes every key to path, atomically (a temporary file renamed
// over path). A snapshot of the store's SnapshotPath with a journal
// starts a new journal segment first and deletes the older ones once the
// snapshot is in place.
func (s *Store) Snapshot(path string) error {
	if s.jr != nil && path == s.opts.SnapshotPath {
		return s.jr.snapshot(path)
	}
	return s.snapshot(path)
}

func (s *Store) snapshot(path string) error { return s.snapshotFrom(path, 0) }

// snapshotFrom writes a snapshot that holds every journal segment before
// segment from (0: no trailer).
func (s *Store) snapshotFrom(path string, from uint64) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".floodgate-snapshot-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	err = s.writeSnapshot(tmp)
	if err == nil && from != 0 {
		_, err = tmp.Write(binary.LittleEndian.AppendUint64([]byte(snapTrailer), from))
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("memstore: snapshot %s: %w", path, err)
	}
	return os.Rename(tmp.Name(), path)
}

// snapFile is what a snapshot is written to: in order, but for the key
// counts, filled in at the end (WriteAt).
type snapFile interface {
	io.Writer
	io.WriterAt
}

// writeSnapshot streams every table to f through one small buffer. Each
// shard's live slots are encoded and written under the shard's lock (where
// they were once copied into one slice of every key, then written: about
// five times the tables in allocations, 6 GB at the 1 GiB memory cap), so a
// snapshot takes a buffer's worth of memory whatever the tables hold. A
// table's key count comes before its keys in the file but is known only
// once its last shard is written: it is written as 0, then filled in once
// everything else is flushed.
func (s *Store) writeSnapshot(f snapFile) error {
	s.mu.Lock()
	tables := make([]*table, 0, len(s.byName))
	for _, t := range s.byName {
		tables = append(tables, t)
	}
	s.mu.Unlock()

	le := binary.LittleEndian
	sw := &snapWriter{bw: bufio.NewWriterSize(f, 1<<16)}
	buf := []byte(snapMagic)
	buf = le.AppendUint64(buf, s.k0)
	buf = le.AppendUint64(buf, s.k1)
	buf = le.AppendUint32(buf, uint32(len(tables)))
	if err := sw.write(buf); err != nil {
		return err
	}
	counts := make([]keyCount, 0, len(tables))
	for _, t := range tables {
		c, err := sw.table(t)
		if err != nil {
			return err
		}
		counts = append(counts, c)
	}
	if err := sw.bw.Flush(); err != nil {
		return err
	}
	var b [8]byte
	for _, c := range counts {
		le.PutUint64(b[:], c.n)
		if _, err := f.WriteAt(b[:], c.at); err != nil {
			return err
		}
	}
	return nil
}

// keyCount is a table's key count, to be written at offset at of the file.
type keyCount struct {
	at int64
	n  uint64
}

// table writes t's header and keys, each shard under its lock, the policy
// and slot width as shard 0 has them (a shard converted meanwhile is
// passed over), and returns its key count and where the count goes.
func (w *snapWriter) table(t *table) (keyCount, error) {
	var c keyCount
	wps := 0
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		var err error
		if i == 0 {
			wps = sh.w
			c.at, err = w.header(t.policy.Load(), wps, 0)
		}
		if err == nil && sh.w == wps {
			var k int
			k, err = w.slots(sh.words, wps)
			c.n += uint64(k)
		}
		sh.mu.Unlock()
		if err != nil {
			return c, err
		}
	}
	return c, nil
}

// header writes a table's header with count keys and returns where the
// count is.
func (w *snapWriter) header(p *floodgate.Policy, wps int, count uint64) (int64, error) {
	le := binary.LittleEndian
	hdr, err := json.Marshal(header(p))
	if err != nil {
		return 0, err
	}
	b := le.AppendUint32(nil, uint32(len(hdr)))
	b = append(b, hdr...)
	b = le.AppendUint32(b, uint32(wps))
	if err := w.write(b); err != nil {
		return 0, err
	}
	at := w.off
	return at, w.write(le.AppendUint64(b[:0], count))
}

// snapWriter writes a snapshot through bw, counting the bytes.
type snapWriter struct {
	bw  *bufio.Writer
	off int64 // bytes written so far
}

func (w *snapWriter) write(b []byte) error {
	n, err := w.bw.Write(b)
	w.off += int64(n)
	return err
}

// words writes ws, little-endian, encoded straight into bw's buffer.
func (w *snapWriter) words(ws []int64) error {
	for len(ws) > 0 {
		b := w.bw.AvailableBuffer()
		n := min(len(ws), cap(b)/8)
		if n == 0 {
			if err := w.bw.Flush(); err != nil {
				return err
			}
			continue
		}
		for _, x := range ws[:n] {
			b = binary.LittleEndian.AppendUint64(b, uint64(x))
		}
		if err := w.write(b); err != nil {
			return err
		}
		ws = ws[n:]
	}
	return nil
}

// slots writes the live slots (hash not 0) of a shard's words, wps words
// each, and returns how many.
func (w *snapWriter) slots(words []int64, wps int) (int, error) {
	n := 0
	for j := 0; j+wps <= len(words); {
		if words[j] == 0 {
			j += wps
			continue
		}
		k := j // a run of live slots, written at once
		for ; k+wps <= len(words) && words[k] != 0; k += wps {
			n++
		}
		if err := w.words(words[j:k]); err != nil {
			return n, err
		}
		j = k
	}
	return n, nil
}

func header(p *floodgate.Policy) snapHeader {
	h := snapHeader{Policy: p.Name()}
	for _, r := range p.Rules() {
		sr := snapRule{
			Name: r.Name, Algorithm: r.Algorithm, Limit: r.Limit, Period: r.Period, Burst: r.Burst,
			Refill: r.Refill, Granularity: r.Granularity, Calendar: r.Calendar, WeekStart: r.WeekStart,
			CountRejected: r.CountRejected, Mode: r.Mode, SoftPercent: r.SoftPercent, ElasticCeiling: r.ElasticCeiling,
		}
		if r.Location != nil {
			sr.Location = r.Location.String()
		}
		h.Rules = append(h.Rules, sr)
	}
	return h
}

func (h snapHeader) policy() (*floodgate.Policy, error) {
	rules := make([]floodgate.Rule, len(h.Rules))
	for i, sr := range h.Rules {
		r := floodgate.Rule{
			Name: sr.Name, Algorithm: sr.Algorithm, Limit: sr.Limit, Period: sr.Period, Burst: sr.Burst,
			Refill: sr.Refill, Granularity: sr.Granularity, Calendar: sr.Calendar, WeekStart: sr.WeekStart,
			CountRejected: sr.CountRejected, Mode: sr.Mode, SoftPercent: sr.SoftPercent, ElasticCeiling: sr.ElasticCeiling,
		}
		if sr.Location != "" {
			loc, err := time.LoadLocation(sr.Location)
			if err != nil {
				return nil, err
			}
			r.Location = loc
		}
		if r.Mode == floodgate.Elastic {
			r.Spare = func() bool { return false }
		}
		rules[i] = r
	}
	return floodgate.NewPolicy(h.Policy, rules...)
}

// restore reads a snapshot and says whether there was one (whose hash key
// the store now has), and the first journal segment it does not hold (0:
// not said); a missing file is no error.
func (s *Store) restore(path string) (bool, uint64, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, 0, nil
	}
	if err != nil {
		return false, 0, err
	}
	defer f.Close()
	r := bufio.NewReaderSize(f, 1<<16)
	if err := s.readSnapshot(r); err != nil {
		return false, 0, fmt.Errorf("memstore: restore %s: %w", path, err)
	}
	var from uint64
	tr := make([]byte, len(snapTrailer)+8)
	if _, err := io.ReadFull(r, tr); err == nil && string(tr[:len(snapTrailer)]) == snapTrailer {
		from = le64(tr[len(snapTrailer):])
	}
	return true, from, nil
}

// compiledOf returns a policy's compiled rules: an older snapshot's or
// journal's states are widened to them.
var compiledOf = compiled.Of.(func(*floodgate.Policy) *compiled.Policy)

// readSnapshot reads a snapshot into the store's tables, a key at a time:
// each table is filled as it is read (keys with nothing consumed left out), marked
// restored for its policy to take over, so that a restart holds the tables
// and a buffer, not a copy of the whole file besides. It runs in New,
// before the store is shared.
func (s *Store) readSnapshot(r io.Reader) error {
	le := binary.LittleEndian
	head := make([]byte, len(snapMagic)+20)
	if _, err := io.ReadFull(r, head); err != nil {
		return fmt.Errorf("reading header: %w", err)
	}
	if string(head[:len(snapMagic)]) != snapMagic {
		return errors.New("not a floodgate memstore snapshot (or another version)")
	}
	b := head[len(snapMagic):]
	n := le.Uint32(b[16:])
	// the keys' hashes are under the snapshot's hash key
	s.k0, s.k1 = le.Uint64(b), le.Uint64(b[8:])
	now := s.opts.Clock.NowMicro()
	for ti := range n {
		st, err := s.readTableHead(r, ti)
		if err != nil {
			return err
		}
		t, err := s.readKeys(r, ti, &st, now)
		if err != nil {
			return err
		}
		t.restored = true
		if old := s.byName[st.name]; old != nil {
			s.discard(old) // a name twice: the last table holds, as it did
		}
		s.byName[st.name] = t
	}
	return nil
}

// snapTable is a table's header in a snapshot.
type snapTable struct {
	name   string
	p      *floodgate.Policy
	w      int // words per key: the hash, then the state
	count  uint64
	legacy bool // states as written before issue 18: widened to p's
}

// readTableHead reads table ti's header.
func (s *Store) readTableHead(r io.Reader, ti uint32) (snapTable, error) {
	le := binary.LittleEndian
	var lb [4]byte
	if _, err := io.ReadFull(r, lb[:]); err != nil {
		return snapTable{}, fmt.Errorf("table %d: %w", ti, err)
	}
	hl := le.Uint32(lb[:])
	if hl > 1<<24 {
		return snapTable{}, fmt.Errorf("table %d: header of %d bytes", ti, hl)
	}
	hb := make([]byte, hl+12)
	if _, err := io.ReadFull(r, hb); err != nil {
		return snapTable{}, fmt.Errorf("table %d: %w", ti, err)
	}
	var h snapHeader
	if err := json.Unmarshal(hb[:hl], &h); err != nil {
		return snapTable{}, fmt.Errorf("table %d: %w", ti, err)
	}
	p, err := h.policy()
	if err != nil {
		return snapTable{}, fmt.Errorf("table %d (policy %q): %w", ti, h.Policy, err)
	}
	st := snapTable{name: h.Policy, p: p, w: int(le.Uint32(hb[hl:])), count: le.Uint64(hb[hl+4:])}
	width := 1 + storekit.Width(p)
	st.legacy = st.w != width && st.w == 1+compiledOf(p).LegacyWidth()
	if st.w != width && !st.legacy {
		return st, fmt.Errorf("table %d (policy %q): %d words per key, want %d", ti, h.Policy, st.w, width)
	}
	if st.count > uint64(s.opts.MaxKeys)*2 || st.count*uint64(st.w) > 1<<34 {
		return st, fmt.Errorf("table %d (policy %q): %d keys, more than twice the cap of %d keys (MaxKeys) or 128 GiB", ti, h.Policy, st.count, s.opts.MaxKeys)
	}
	return st, nil
}

// readKeys reads table ti's keys, described by st, into a new table,
// leaving out those with nothing consumed.
func (s *Store) readKeys(r io.Reader, ti uint32, st *snapTable, now int64) (*table, error) {
	le := binary.LittleEndian
	p := st.p
	t := s.newTable(p)
	wb := make([]byte, 8*st.w)
	state, wide := make([]int64, st.w-1), make([]int64, storekit.Width(p))
	for i := range int(st.count) {
		if _, err := io.ReadFull(r, wb); err != nil {
			return nil, fmt.Errorf("table %d (policy %q): key %d: %w", ti, st.name, i, err)
		}
		hash := le.Uint64(wb)
		if hash == 0 {
			continue
		}
		for j := range state {
			state[j] = int64(le.Uint64(wb[8*(j+1):]))
		}
		state := state
		if st.legacy {
			compiledOf(p).Widen(state, wide)
			state = wide
		}
		if !storekit.Valid(p, state) {
			return nil, fmt.Errorf("table %d (policy %q): key %d: a state no rule of the policy could have written (the file is damaged)", ti, st.name, i)
		}
		if storekit.Consumption(p, state, now) == 0 {
			continue
		}
		sh := &t.shards[hash>>t.shift]
		copy(sh.state(sh.insert(t, p, hash, now)), state)
	}
	return t, nil
}

// discard takes table t's keys and bytes off the store's counts. t is
// unpublished.
func (s *Store) discard(t *table) {
	for i := range t.shards {
		sh := &t.shards[i]
		s.keys.Add(-int64(sh.n))
		s.bytes.Add(-int64(len(sh.words)) * 8)
	}
}

func randRead(b []byte) error {
	_, err := rand.Read(b)
	return err
}

func le64(b []byte) uint64 { return binary.LittleEndian.Uint64(b) }

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
)

// Snapshot file layout, little-endian:
//
//	magic "floodgate-memstore\x00" version byte 1
//	hash key k0, k1 (uint64 each)
//	table count (uint32), then per table:
//	    header length (uint32) and JSON header (policy name and rules)
//	    words per slot w (uint32), key count (uint64)
//	    count × w int64 words: the key's hash, then its state
//
// The file holds the hash key, so it is written with mode 0600.
const snapMagic = "floodgate-memstore\x00\x01"

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

// snapTable is a table read from a snapshot, waiting for its policy.
type snapTable struct {
	policy *floodgate.Policy
	w      int
	words  []int64
}

// Snapshot writes every key to path, atomically (a temporary file renamed
// over path).
func (s *Store) Snapshot(path string) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".floodgate-snapshot-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	bw := bufio.NewWriterSize(tmp, 1<<16)
	err = s.writeSnapshot(bw)
	if err == nil {
		err = bw.Flush()
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

func (s *Store) writeSnapshot(w io.Writer) error {
	s.mu.Lock()
	tables := make([]*table, 0, len(s.byName))
	for _, t := range s.byName {
		tables = append(tables, t)
	}
	pending := make([]*snapTable, 0, len(s.pending))
	for _, p := range s.pending {
		pending = append(pending, p)
	}
	s.mu.Unlock()

	le := binary.LittleEndian
	buf := []byte(snapMagic)
	buf = le.AppendUint64(buf, s.k0)
	buf = le.AppendUint64(buf, s.k1)
	buf = le.AppendUint32(buf, uint32(len(tables)+len(pending)))
	if _, err := w.Write(buf); err != nil {
		return err
	}
	writeTable := func(p *floodgate.Policy, wps int, words []int64, count int) error {
		hdr, err := json.Marshal(header(p))
		if err != nil {
			return err
		}
		b := le.AppendUint32(nil, uint32(len(hdr)))
		b = append(b, hdr...)
		b = le.AppendUint32(b, uint32(wps))
		b = le.AppendUint64(b, uint64(count))
		if _, err := w.Write(b); err != nil {
			return err
		}
		return writeWords(w, wps, words)
	}
	for _, pt := range pending {
		if err := writeTable(pt.policy, pt.w, pt.words, len(pt.words)/pt.w); err != nil {
			return err
		}
	}
	for _, t := range tables {
		// Copy each shard under its lock; write without holding it.
		p, wps := t.policy.Load(), 0
		var words []int64
		for i := range t.shards {
			sh := &t.shards[i]
			sh.mu.Lock()
			if i == 0 {
				p, wps = t.policy.Load(), sh.w
			}
			if sh.w == wps {
				for j := 0; j+sh.w <= len(sh.words); j += sh.w {
					if sh.words[j] != 0 {
						words = append(words, sh.words[j:j+sh.w]...)
					}
				}
			}
			sh.mu.Unlock()
		}
		if err := writeTable(p, wps, words, len(words)/max(wps, 1)); err != nil {
			return err
		}
	}
	return nil
}

func writeWords(w io.Writer, wps int, words []int64) error {
	b := make([]byte, 0, 1<<15)
	for _, x := range words {
		b = binary.LittleEndian.AppendUint64(b, uint64(x))
		if len(b) == cap(b) {
			if _, err := w.Write(b); err != nil {
				return err
			}
			b = b[:0]
		}
	}
	_, err := w.Write(b)
	return err
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

// restore reads a snapshot; a missing file is no error.
func (s *Store) restore(path string) error {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	if err := s.readSnapshot(bufio.NewReaderSize(f, 1<<16)); err != nil {
		return fmt.Errorf("memstore: restore %s: %w", path, err)
	}
	return nil
}

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
	k0, k1, n := le.Uint64(b), le.Uint64(b[8:]), le.Uint32(b[16:])
	pending := map[string]*snapTable{}
	for ti := range n {
		var lb [4]byte
		if _, err := io.ReadFull(r, lb[:]); err != nil {
			return fmt.Errorf("table %d: %w", ti, err)
		}
		hl := le.Uint32(lb[:])
		if hl > 1<<24 {
			return fmt.Errorf("table %d: header of %d bytes", ti, hl)
		}
		hb := make([]byte, hl+12)
		if _, err := io.ReadFull(r, hb); err != nil {
			return fmt.Errorf("table %d: %w", ti, err)
		}
		var h snapHeader
		if err := json.Unmarshal(hb[:hl], &h); err != nil {
			return fmt.Errorf("table %d: %w", ti, err)
		}
		p, err := h.policy()
		if err != nil {
			return fmt.Errorf("table %d (policy %q): %w", ti, h.Policy, err)
		}
		w, count := int(le.Uint32(hb[hl:])), le.Uint64(hb[hl+4:])
		if w != 1+p.Width() {
			return fmt.Errorf("table %d (policy %q): %d words per key, want %d", ti, h.Policy, w, 1+p.Width())
		}
		if count > uint64(s.opts.MaxKeys)*2 || count*uint64(w) > 1<<34 {
			return fmt.Errorf("table %d (policy %q): %d keys", ti, h.Policy, count)
		}
		words := make([]int64, int(count)*w)
		wb := make([]byte, 8*w)
		for i := range int(count) {
			if _, err := io.ReadFull(r, wb); err != nil {
				return fmt.Errorf("table %d (policy %q): key %d: %w", ti, h.Policy, i, err)
			}
			for j := range w {
				words[i*w+j] = int64(le.Uint64(wb[8*j:]))
			}
		}
		pending[h.Policy] = &snapTable{policy: p, w: w, words: words}
	}
	s.k0, s.k1, s.pending = k0, k1, pending
	return nil
}

// adopt fills table t (new, unpublished) with a restored snapshot's keys,
// converting them to t's policy if it changed meanwhile.
func (s *Store) adopt(t *table, snap *snapTable, now int64) {
	p := t.policy.Load()
	same := snap.policy.SameLayout(p)
	state := make([]int64, p.Width())
	for j := 0; j+snap.w <= len(snap.words); j += snap.w {
		h := uint64(snap.words[j])
		if h == 0 {
			continue
		}
		if same {
			copy(state, snap.words[j+1:j+snap.w])
		} else {
			p.Migrate(snap.policy, snap.words[j+1:j+snap.w], state, now)
		}
		if p.Consumption(state, now) == 0 {
			continue
		}
		sh := &t.shards[h>>t.shift]
		i := sh.insert(t, p, h, now)
		copy(sh.state(i), state)
	}
}

func randRead(b []byte) error {
	_, err := rand.Read(b)
	return err
}

func le64(b []byte) uint64 { return binary.LittleEndian.Uint64(b) }

package memstore

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"slices"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/storekit"
)

// Replaying the journal (journal.go) over the restored snapshot, at New.

// replayed is what replay found in a segment.
type replayed struct {
	n   int    // records replayed
	off int64  // where the damage starts
	bad string // what the damage is ("" none)
	err error  // a segment that cannot be used (another hash key)
}

// replay applies one segment's records to the store's tables. It stops at
// the first record that is not whole and valid (a torn tail: the crash
// came in the middle of a write; or damage), reporting it: the records
// before it are applied, nothing of it or after it. keyed says whether
// the store's hash key is known (from the snapshot or a segment before);
// if not, the segment's is taken.
func (s *Store) replay(r io.Reader, keyed *bool, now int64) (rep replayed) {
	rep, ok := s.replayHead(r, keyed)
	if !ok {
		return rep
	}
	pols := map[uint32]*floodgate.Policy{}
	var body []byte
	var state []int64
	for {
		var bad string
		var end bool
		body, bad, end = readRecord(r, body)
		if end {
			return rep
		}
		if bad == "" {
			bad = s.replayRecord(body, pols, &state, now)
		}
		if bad != "" {
			rep.bad = bad
			return rep
		}
		rep.n++
		rep.off += 8 + int64(len(body))
	}
}

// replayHead reads a segment's header, taking its hash key when the store
// has none yet (keyed). False: the segment ends there, rep says why.
func (s *Store) replayHead(r io.Reader, keyed *bool) (rep replayed, ok bool) {
	le := binary.LittleEndian
	head := make([]byte, journalHeaderLen)
	if n, err := io.ReadFull(r, head); err != nil {
		rep.bad = fmt.Sprintf("a segment header cut short at %d of %d bytes", n, journalHeaderLen)
		if n == 0 {
			rep.bad = "" // created, nothing written: nothing lost
		}
		return rep, false
	}
	if string(head[:len(journalMagic)]) != journalMagic {
		rep.bad = "not a floodgate journal segment (or another version)"
		return rep, false
	}
	if crc32.Checksum(head[:journalHeaderLen-4], crcTable) != le.Uint32(head[journalHeaderLen-4:]) {
		rep.bad = "the segment header's checksum does not match"
		return rep, false
	}
	k0, k1 := le.Uint64(head[len(journalMagic):]), le.Uint64(head[len(journalMagic)+8:])
	switch {
	case !*keyed:
		s.k0, s.k1, *keyed = k0, k1, true
	case k0 != s.k0 || k1 != s.k1:
		rep.err = errors.New("the segment was written under another hash key than the snapshot's (a journal from another store?): move it away to start from the snapshot alone")
		return rep, false
	}
	rep.off = int64(journalHeaderLen)
	return rep, true
}

// readRecord reads the next record's body into buf (grown as needed) and
// returns it, or what is wrong with it (a torn or damaged record), or end
// at the segment's clean end.
func readRecord(r io.Reader, buf []byte) (body []byte, bad string, end bool) {
	le := binary.LittleEndian
	var lb [8]byte
	n, err := io.ReadFull(r, lb[:])
	if err == io.EOF {
		return buf, "", true
	}
	if err != nil {
		return buf, fmt.Sprintf("a torn record: %d bytes of its 8-byte head", n), false
	}
	size := le.Uint32(lb[:])
	if size < 1 || size > maxRecord {
		return buf, fmt.Sprintf("a record of %d bytes", size), false
	}
	if cap(buf) < int(size) {
		buf = make([]byte, size)
	}
	body = buf[:size]
	if n, err := io.ReadFull(r, body); err != nil {
		return body, fmt.Sprintf("a torn record: %d of its %d bytes", n, size), false
	}
	if crc32.Checksum(body, crcTable) != le.Uint32(lb[4:]) {
		return body, "a record whose checksum does not match", false
	}
	return body, "", false
}

// replayRecord applies one whole record, or says what is wrong with it.
func (s *Store) replayRecord(body []byte, pols map[uint32]*floodgate.Policy, state *[]int64, now int64) string {
	switch body[0] {
	case recPolicy:
		return replayPolicy(body, pols)
	case recKey:
		return s.replayKeyRecord(body, pols, state, now)
	}
	return fmt.Sprintf("a record of unknown type %q", body[0])
}

// replayPolicy declares a policy record's policy under its id in pols.
func replayPolicy(body []byte, pols map[uint32]*floodgate.Policy) string {
	le := binary.LittleEndian
	if len(body) < 9 {
		return "a policy record cut short"
	}
	id, w := le.Uint32(body[1:]), le.Uint32(body[5:])
	var h snapHeader
	if err := json.Unmarshal(body[9:], &h); err != nil {
		return fmt.Sprintf("a policy record: %v", err)
	}
	p, err := h.policy()
	if err != nil {
		return fmt.Sprintf("a policy record (policy %q): %v", h.Policy, err)
	}
	if int(w) != 1+storekit.Width(p) && int(w) != 1+compiledOf(p).LegacyWidth() {
		return fmt.Sprintf("a policy record (policy %q): %d words per key, want %d", h.Policy, w, 1+storekit.Width(p))
	}
	pols[id] = p
	return ""
}

// replayKeyRecord sets a key record's key to its state, read into *state
// (widened if it was written before a sliding log counting rejections
// kept one more entry).
func (s *Store) replayKeyRecord(body []byte, pols map[uint32]*floodgate.Policy, state *[]int64, now int64) string {
	le := binary.LittleEndian
	if len(body) < 13 {
		return "a key record cut short"
	}
	p := pols[le.Uint32(body[1:])]
	if p == nil {
		return fmt.Sprintf("a key record under policy id %d, not declared before it", le.Uint32(body[1:]))
	}
	h, w, legacy := le.Uint64(body[5:]), storekit.Width(p), compiledOf(p).LegacyWidth()
	if h == 0 || len(body) != 13+8*w && len(body) != 13+8*legacy {
		return fmt.Sprintf("a key record of policy %q with %d bytes of state, want %d", p.Name(), len(body)-13, 8*w)
	}
	n := (len(body) - 13) / 8
	st := slices.Grow((*state)[:0], w+n)[:w+n]
	*state = st
	for i := range n {
		st[w+i] = int64(le.Uint64(body[13+8*i:]))
	}
	if n == w {
		copy(st, st[w:])
	} else { // written before a sliding log counting rejections kept one more entry
		compiledOf(p).Widen(st[w:], st[:w])
	}
	st = st[:w]
	if !storekit.Valid(p, st) {
		return fmt.Sprintf("a key record of policy %q: a state no rule of the policy could have written", p.Name())
	}
	s.replayKey(p, h, st, now)
	return ""
}

// replayKey sets key h of policy p to state (fresh: drops the key). A
// table under another layout of the name is converted to p first, as the
// live store did when p came.
func (s *Store) replayKey(p *floodgate.Policy, h uint64, state []int64, now int64) {
	t := s.byName[p.Name()]
	switch {
	case t == nil:
		t = s.newTable(p)
		t.restored = true
		s.byName[p.Name()] = t
	case !storekit.SameLayout(t.policy.Load(), p):
		t.migrate(p, now)
	}
	sh := &t.shards[h>>t.shift]
	i := sh.find(h)
	if storekit.Consumption(p, state, now) == 0 {
		if i >= 0 {
			sh.deleteAt(t, i)
		}
		return
	}
	if i < 0 {
		i = sh.insert(t, p, h, now)
	}
	copy(sh.state(i), state)
}

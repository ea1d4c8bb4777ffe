package memstore

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"unsafe"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/storekit"
)

// DoGroup performs ops as DoBatch does, except that those whose index is
// set in group are decided together, all or nothing, while the shards of
// their keys are held (floodgate.GroupStore): every OpAllow member is
// first checked as OpPeek; if all fit they are admitted, and if not, only
// those that do not fit on their own are decided (denied), the others
// keeping their check. The other ops are performed one by one, those
// before the group's first member before it.
func (s *Store) DoGroup(ctx context.Context, now int64, ops []floodgate.Op, group []bool, out []floodgate.Decision) error {
	if len(out) < len(ops) || len(group) < len(ops) {
		return errors.New("memstore: out or group is shorter than ops")
	}
	first := -1
	for i := range ops {
		if ops[i].Policy == nil {
			return errNoPolicy
		}
		if group[i] && first < 0 {
			first = i
		}
	}
	for i := range ops {
		if i == first {
			s.doGroup(now, ops, group, out)
		}
		if group[i] {
			continue
		}
		d, _ := s.Do(ctx, now, ops[i])
		out[i] = d
	}
	return nil
}

// doGroup decides the members of group holding the shards of their keys.
func (s *Store) doGroup(now int64, ops []floodgate.Op, group []bool, out []floodgate.Decision) {
	var mbuf [8]groupMember
	var lbuf [8]*shard
	ms, locked := s.lockGroup(now, ops, group, mbuf[:0], lbuf[:0])
	var rec uint64 // the last journal record
	all := true
	for _, m := range ms {
		s.peek(now, ops, m, out)
		if ops[m.i].Kind == floodgate.OpAllow {
			all = all && out[m.i].Allowed
		}
	}
	if all && !s.admitGroup(now, ops, ms, out) {
		all = false // a member refused for want of room, by a rule failing closed
	}
	if !all {
		for _, m := range ms {
			if op := &ops[m.i]; op.Kind == floodgate.OpAllow && !out[m.i].Allowed && !out[m.i].Degraded {
				m.sh.do(m.t, m.h, now, op, &out[m.i])
			}
		}
	}
	if s.jr != nil {
		// Every member that may have changed, once its state is final (a
		// key admitGroup placed and dropped again is recorded as zero).
		for _, m := range ms {
			if ops[m.i].Kind == floodgate.OpAllow {
				rec = s.jr.key(m.t, m.sh, m.h)
			}
		}
	}
	for _, sh := range locked {
		sh.mu.Unlock()
	}
	if rec != 0 {
		s.jr.wait(rec)
	}
	for _, m := range ms {
		if out[m.i].Degraded {
			s.logRefused(now)
			break
		}
	}
}

// peek decides member m as OpPeek.
func (s *Store) peek(now int64, ops []floodgate.Op, m groupMember, out []floodgate.Decision) {
	op := ops[m.i]
	op.Kind = floodgate.OpPeek
	m.sh.do(m.t, m.h, now, &op, &out[m.i])
}

// admitGroup admits every OpAllow member of a group that fits whole, and
// reports false, having consumed nothing, if the store had no room for a
// member's key and a rule failing closed refused it. The members that may
// need room, those whose key the store does not hold or holds fresh, go
// first; if one is refused so, the keys of those before it are dropped
// again (they were absent or fresh: dropping them restores what was) and
// peeked anew. The others' keys are held and constrain, so making room
// drops none of them, and they are admitted last, when nothing can fail.
func (s *Store) admitGroup(now int64, ops []floodgate.Op, ms []groupMember, out []floodgate.Decision) bool {
	var nbuf [8]bool
	newcomer := nbuf[:0]
	for _, m := range ms {
		i := m.sh.find(m.h)
		newcomer = append(newcomer, i < 0 || storekit.Consumption(m.t.policy.Load(), m.sh.state(i), now) == 0)
	}
	for j, m := range ms {
		if ops[m.i].Kind != floodgate.OpAllow || !newcomer[j] {
			continue
		}
		m.sh.do(m.t, m.h, now, &ops[m.i], &out[m.i])
		if d := &out[m.i]; !d.Degraded || d.Allowed {
			continue
		}
		for k, b := range ms[:j] {
			if ops[b.i].Kind == floodgate.OpAllow && newcomer[k] {
				if i := b.sh.find(b.h); i >= 0 {
					b.sh.deleteAt(b.t, i)
				}
				s.peek(now, ops, b, out)
			}
		}
		return false
	}
	for j, m := range ms {
		if ops[m.i].Kind == floodgate.OpAllow && !newcomer[j] {
			m.sh.do(m.t, m.h, now, &ops[m.i], &out[m.i])
		}
	}
	return true
}

// A groupMember is a member of a group and where its key lives.
type groupMember struct {
	i  int // index into ops
	t  *table
	h  uint64
	sh *shard
}

// lockGroup finds the members' tables and shards and locks each shard
// once, in address order (a table's shards are in index order, as migrate
// takes them), so that groups never deadlock. A table that Sweep dropped
// meanwhile is bound again and the whole is tried anew. It returns the
// members and the locked shards (appended to ms and locked).
func (s *Store) lockGroup(now int64, ops []floodgate.Op, group []bool, ms []groupMember, locked []*shard) ([]groupMember, []*shard) {
	for {
		ms, locked = ms[:0], locked[:0]
		for i := range ops {
			if !group[i] {
				continue
			}
			// tables first: making one takes s.mu, which migrate holds
			// while it takes a table's shards
			t := s.table(ops[i].Policy, now)
			h := s.hash(ops[i].Key)
			ms = append(ms, groupMember{i, t, h, &t.shards[h>>t.shift]})
			locked = append(locked, &t.shards[h>>t.shift])
		}
		slices.SortFunc(locked, func(a, b *shard) int {
			return cmp.Compare(uintptr(unsafe.Pointer(a)), uintptr(unsafe.Pointer(b)))
		})
		locked = slices.Compact(locked)
		for _, sh := range locked {
			sh.mu.Lock()
		}
		dropped := -1
		for _, m := range ms {
			if m.t.dropped {
				dropped = m.i
				break
			}
		}
		if dropped < 0 {
			return ms, locked
		}
		for _, sh := range locked {
			sh.mu.Unlock()
		}
		s.rebind(ops[dropped].Policy, now) // by Sweep, after table: bind again
	}
}

package floodgate

import (
	"context"
	"errors"
)

// A GroupStore is a Store that can decide a batch holding an
// all-or-nothing group of operations in one atomic step: a request limited
// per IP and per user, say, that must be admitted by both or consume from
// neither. The in-memory store is one, and so is a Redis store on one
// server (standalone or Sentinel); Use DoGroup rather than calling it, so
// that duplicate keys and stores that cannot are taken care of.
type GroupStore interface {
	Store
	// DoGroup is DoBatch, except that the operations whose index is set in
	// group are decided together, at the place of the first of them:
	//
	//   - if every OpAllow among them fits, each is admitted and consumes,
	//     as OpAllow does;
	//   - otherwise none consumes: a member that does not fit on its own
	//     is decided as OpAllow (denied; rules that count rejected requests
	//     count it), and the others are decided as OpPeek (Allowed says
	//     they would fit, and nothing is taken).
	//
	// No other operation sees part of the group applied. Members must be
	// OpAllow or OpPeek, and the OpAllow members must be on distinct keys
	// (policy name and key); DoGroup merges duplicates first. A store
	// returns errors.ErrUnsupported, having done nothing, when it cannot
	// decide this batch's group atomically (its keys in several Redis
	// Cluster slots).
	DoGroup(ctx context.Context, now int64, ops []Op, group []bool, out []Decision) error
}

// DoGroup decides ops on store in one batch, those whose index is set in
// group all or nothing (see GroupStore), and reports whether the group was
// admitted: every OpAllow member allowed. out[i] is ops[i]'s decision.
// OpAllow members on one key (policy name and key) are decided as one
// operation of their summed cost, admitted only if the sum fits, and each
// gets its decision.
//
// On a GroupStore that can, the group is atomic. On any other store it is
// compensation: the batch is decided as DoBatch does, and if a member was
// denied, what the admitted members consumed is refunded in a second call,
// so between the two a concurrent request may see that capacity as taken.
// Either way a member that would have fitted reports Allowed, with what is
// left once nothing is taken from it.
func DoGroup(ctx context.Context, store Store, now int64, ops []Op, group []bool, out []Decision) (admitted bool, err error) {
	if len(out) < len(ops) || len(group) < len(ops) {
		return false, &ParamError{Field: "out", Msg: "out or group is shorter than ops"}
	}
	for i := range ops {
		if group[i] && ops[i].Kind != OpAllow && ops[i].Kind != OpPeek {
			return false, &ParamError{Field: "ops", Msg: "a group member must be OpAllow or OpPeek, got " + ops[i].Kind.String()}
		}
	}
	into := duplicates(ops, group)
	if into == nil {
		return doGroup(ctx, store, now, ops, group, out)
	}
	merged := make([]Op, 0, len(ops))
	mgroup := make([]bool, 0, len(ops))
	at := make([]int, len(ops)) // ops[i]'s index in merged
	for i := range ops {
		if into[i] >= 0 {
			m := &merged[at[into[i]]]
			m.Cost = addCost(m.Cost, ops[i].Cost)
			continue
		}
		at[i] = len(merged)
		merged = append(merged, ops[i])
		mgroup = append(mgroup, group[i])
	}
	mout := make([]Decision, len(merged))
	admitted, err = doGroup(ctx, store, now, merged, mgroup, mout)
	for i := range ops {
		k := i
		if into[i] >= 0 {
			k = into[i]
		}
		out[i] = mout[at[k]]
	}
	return admitted, err
}

// duplicates returns, for each OpAllow member of group on the key of an
// earlier one, the index of the first; -1 for the others; nil if there are
// none.
func duplicates(ops []Op, group []bool) []int {
	var into []int
	for i := range ops {
		if !group[i] || ops[i].Kind != OpAllow {
			continue
		}
		for j := range i {
			if group[j] && ops[j].Kind == OpAllow && ops[j].Key == ops[i].Key && ops[j].Policy.Name() == ops[i].Policy.Name() {
				if into == nil {
					into = make([]int, len(ops))
					for k := range into {
						into[k] = -1
					}
				}
				into[i] = j
				if into[j] >= 0 {
					into[i] = into[j]
				}
				break
			}
		}
	}
	return into
}

// doGroup is DoGroup on distinct keys.
func doGroup(ctx context.Context, store Store, now int64, ops []Op, group []bool, out []Decision) (bool, error) {
	if gs, ok := store.(GroupStore); ok {
		err := gs.DoGroup(ctx, now, ops, group, out)
		if err == nil {
			return groupAdmitted(ops, group, out), nil
		}
		if !errors.Is(err, errors.ErrUnsupported) {
			return false, err
		}
	}
	if err := store.DoBatch(ctx, now, ops, out); err != nil {
		return false, err
	}
	if groupAdmitted(ops, group, out) {
		return true, nil
	}
	var refunds []Op
	var refunded []int
	for i := range ops {
		if group[i] && ops[i].Kind == OpAllow && out[i].Allowed && ops[i].Cost > 0 && !out[i].Degraded {
			refunds = append(refunds, Op{Policy: ops[i].Policy, Key: ops[i].Key, Kind: OpRefund, Cost: ops[i].Cost})
			refunded = append(refunded, i)
		}
	}
	if len(refunds) == 0 {
		return false, nil
	}
	after := make([]Decision, len(refunds))
	// The admitted members consumed whatever the caller's context does
	// now: the refund is owed even to a caller that has left (its deadline
	// passed during the first call), else those keys stay charged for a
	// request refused whole. The store still bounds the call by its own
	// timeout.
	if err := store.DoBatch(context.WithoutCancel(ctx), now, refunds, after); err != nil {
		return false, err
	}
	for j, i := range refunded {
		if a := &after[j]; !a.Degraded {
			out[i].Remaining, out[i].ResetAfter = a.Remaining, a.ResetAfter
		}
	}
	return false, nil
}

// groupAdmitted reports whether every OpAllow member of group was allowed.
func groupAdmitted(ops []Op, group []bool, out []Decision) bool {
	for i := range ops {
		if group[i] && ops[i].Kind == OpAllow && !out[i].Allowed {
			return false
		}
	}
	return true
}

// addCost adds costs without overflowing.
func addCost(a, b int64) int64 {
	if s := a + b; s >= a {
		return s
	}
	return 1<<63 - 1
}

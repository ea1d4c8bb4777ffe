package gate

import (
	"context"
	"slices"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/decide"
	"github.com/floodgate/floodgate/internal/ratehdr"
	"github.com/floodgate/floodgate/rules"
)

// local decides the outcomes on the store: in one call of at most maxOps
// operations, or, for a request matching more limits, in as many as it
// takes (see Config).
func (g *Gate) local(ctx context.Context, v *Verdict) {
	now := g.clock.NowMicro()
	nops := g.resolve(ctx, v, now)
	var opBuf [4]floodgate.Op
	var callBuf [1]opCall
	ops, calls := opBuf[:0], callBuf[:0]
	if nops > len(opBuf) {
		ops = make([]floodgate.Op, 0, nops)
	}
	ops, calls = g.layOut(v, ops, calls)
	var one [1]floodgate.Decision
	var start time.Time
	if g.tracer != nil {
		start = time.Now()
	}
	decs, err := g.call(ctx, now, v, ops, calls, one[:])
	if g.tracer != nil {
		v.storeTook += time.Since(start)
	}
	if err != nil {
		v.Err = err
		g.logf("floodgate: the store failed; the gate's failure policy decides meanwhile", "err", err)
		g.storeFailed(v, false)
		return
	}
	g.apply(ctx, now, v, ops, decs)
	if !v.Allowed {
		// All or nothing: give back what the admitted limits took (a group
		// refused took nothing; one admitted did, if a ban, a blocked rule,
		// a delay or another call's group refuses the request).
		g.refund(ctx, now, ops, v.Outcomes, calls, decs)
	}
	v.Deciding = deciding(v.Outcomes)
	if v.Allowed {
		g.delay(ctx, v, ops)
	}
}

// resolve sets what each outcome asks of the store: its policy and key
// (a rules file's, through the decider), o.op opPending for a decision
// (and a ban's two operations), -1 for none; a blocked limit is decided
// here. It returns how many operations the outcomes take.
func (g *Gate) resolve(ctx context.Context, v *Verdict, now int64) int {
	g.planRules(ctx, v, now)
	nops := 0
	for i := range v.Outcomes {
		o := &v.Outcomes[i]
		l := o.l
		o.policy, o.name, o.skey = l.Policy, "", o.Key
		if l.Blocked {
			o.ruleLm = l.blockedLm
			o.Decision = blockedDecision(l.blockedLm, now)
			continue
		}
		if l.Policy == nil {
			// A rules domain decides, through the decider.
			r := &v.rs.res[i]
			if !r.Decided() {
				continue // no limit, unlimited, or replaced
			}
			o.ruleLm, o.name = r.Limit, sfName(r.Limit.Name)
			if r.Op < 0 { // blocked: decided already
				o.Decision = r.Decision
				continue
			}
			op := &v.rs.ops[r.Op]
			o.policy, o.skey = op.Policy, op.Key
		}
		o.op = opPending
		nops += opsOf(o)
	}
	return nops
}

// layOut appends the operations to ops, call by call: the outcomes in
// order, as many as fit in maxOps; in each call the all-or-nothing
// members (the decisions that can refuse) come last, side by side, as a
// Redis batch needs a group's members to be.
func (g *Gate) layOut(v *Verdict, ops []floodgate.Op, calls []opCall) ([]floodgate.Op, []opCall) {
	for i := 0; i < len(v.Outcomes); {
		j, n := i, 0
		for ; j < len(v.Outcomes); j++ {
			k := opsOf(&v.Outcomes[j])
			if n+k > maxOps {
				break
			}
			n += k
		}
		c := opCall{start: len(ops)}
		for k := i; k < j; k++ {
			if o := &v.Outcomes[k]; o.op == opPending {
				ops = appendOthers(ops, o)
			}
		}
		c.members = len(ops)
		for k := i; k < j; k++ {
			if o := &v.Outcomes[k]; o.op == opPending { // the others have theirs
				o.op = len(ops)
				ops = append(ops, o.policy.Op(floodgate.OpAllow, o.skey, o.l.Cost, 0))
			}
		}
		c.end = len(ops)
		if c.end > c.start {
			calls = append(calls, c)
		}
		i = j
	}
	if len(calls) > 1 && g.split.CompareAndSwap(false, true) {
		g.cfg.Logger.Warn("floodgate: a request matched more limits than one store call takes; they are decided in several calls, each atomic, all or nothing across them by giving back (logged once)",
			"limits", len(v.Outcomes), "calls", len(calls))
	}
	return ops, calls
}

// appendOthers appends an outcome's operations that are no group's
// members: a ban's marker peek and threshold charge, and a decision that
// cannot refuse the request (a delay's reservation, a shadow limit's).
func appendOthers(ops []floodgate.Op, o *Outcome) []floodgate.Op {
	l := o.l
	if l.banMarker != nil {
		o.banOp = len(ops)
		ops = append(ops, l.banMarker.Op(floodgate.OpPeek, o.skey, l.banBurst, 0))
		o.thrOp = len(ops)
		ops = append(ops, l.banThresh.Op(floodgate.OpCharge, o.skey, 1, 0))
	}
	switch {
	case l.Action == Delay:
		o.op = len(ops)
		ops = append(ops, o.policy.Op(floodgate.OpReserve, o.skey, l.Cost, l.MaxDelay))
	case o.shadow():
		o.op = len(ops)
		ops = append(ops, o.policy.Op(floodgate.OpAllow, o.skey, l.Cost, 0))
	}
	return ops
}

// call makes the store calls, returning ops[i]'s decision in decs[i]
// (one, for a single operation, is the caller's buffer).
func (g *Gate) call(ctx context.Context, now int64, v *Verdict, ops []floodgate.Op, calls []opCall, one []floodgate.Decision) ([]floodgate.Decision, error) {
	switch len(ops) {
	case 0:
		return nil, nil
	case 1:
		var err error
		one[0], err = g.store.Do(ctx, now, ops[0])
		return one[:1], err
	}
	// The store keeps neither slice, but escape analysis cannot see
	// through the interface: give it heap copies.
	batch, out := make([]floodgate.Op, len(ops)), make([]floodgate.Decision, len(ops))
	copy(batch, ops)
	for ci := range calls {
		if err := g.decide(ctx, now, batch, out, &calls[ci]); err != nil {
			// The store failed: what the earlier calls took stands if
			// the request passes, and is given back if it does not.
			if g.cfg.FailClosed {
				g.refund(ctx, now, ops, v.Outcomes, calls[:ci], out)
			}
			return out, err
		}
	}
	return out, nil
}

// apply sets each outcome's decision from decs, records the bans a
// request's threshold crossing starts, and settles v.Allowed.
func (g *Gate) apply(ctx context.Context, now int64, v *Verdict, ops []floodgate.Op, decs []floodgate.Decision) {
	var banOps []floodgate.Op
	for i := range v.Outcomes {
		o := &v.Outcomes[i]
		if o.op >= 0 {
			o.Decision = decs[o.op]
			if o.ents != nil {
				// the decider reads its limit's decision (quota_mode)
				r := &v.rs.res[i]
				r.Op = o.op
				g.dec.Finish(now, v.rs.res[i:i+1], decs)
				o.Decision = r.Decision
			}
		}
		if o.banOp >= 0 {
			banOps = o.applyBan(decs, ops, banOps)
		}
		if !o.Decided() {
			continue
		}
		if o.Decision.Excess {
			v.Soft = true
		}
		shadow := o.shadow()
		o.Over = !o.Decision.Allowed && !shadow
		if !o.Decision.Allowed && shadow && !o.quota() {
			g.logf("floodgate: a shadow limit would refuse a request", "limit", o.l.Name)
		}
		if o.Over {
			v.Allowed = false
		}
	}
	if len(banOps) > 0 {
		if err := g.store.DoBatch(context.WithoutCancel(ctx), now, banOps, make([]floodgate.Decision, len(banOps))); err != nil {
			g.logf("floodgate: recording a ban failed", "err", err)
		}
	}
}

// applyBan reads a ban's marker and threshold: a banned key is refused;
// a request that fills the threshold window bans its key, and the charge
// that records the ban is appended to banOps.
func (o *Outcome) applyBan(decs []floodgate.Decision, ops, banOps []floodgate.Op) []floodgate.Op {
	l := o.l
	marker, thr := &decs[o.banOp], &decs[o.thrOp]
	if !marker.Allowed {
		o.Banned = true
		o.Decision.Allowed = false
		o.Decision.RetryAfter = max(o.Decision.RetryAfter, marker.RetryAfter)
	}
	if thr.Allowed && thr.Remaining == 0 {
		// This request filled the threshold window: ban until its end
		// plus the duration, beyond any ban in force.
		until := thr.ResetAfter + l.Ban.Duration
		held := time.Duration(0)
		if !marker.Allowed {
			held = marker.RetryAfter
		}
		if until > held {
			grains := int64((until - held + banGrain - 1) / banGrain)
			banOps = append(banOps, l.banMarker.Op(floodgate.OpCharge, ops[o.banOp].Key, grains, 0))
		}
		o.Banned = true
		o.Decision.Allowed = false
		o.Decision.RetryAfter = max(o.Decision.RetryAfter, until)
	}
	if o.Banned {
		// The ban decides: its quota is spent, whatever the limit's.
		d := &o.Decision
		d.Limit, d.Remaining, d.Reason, d.ResetAfter = l.Ban.Threshold, 0, floodgate.ReasonLimited, d.RetryAfter
	}
	return banOps
}

// delay waits for the slots the Delay actions reserved; a client that
// leaves meanwhile gives them back and is refused (v.Err).
func (g *Gate) delay(ctx context.Context, v *Verdict, ops []floodgate.Op) {
	var wait time.Duration
	for i := range v.Outcomes {
		if o := &v.Outcomes[i]; o.op >= 0 && o.l.Action == Delay && o.Decision.Delay > wait {
			wait = o.Decision.Delay
		}
	}
	if wait <= 0 {
		return
	}
	if err := g.clock.Sleep(ctx, wait); err != nil {
		// The client went away: give the slots back.
		var refunds []floodgate.Op
		for i := range v.Outcomes {
			if o := &v.Outcomes[i]; o.op >= 0 && ops[o.op].Cost > 0 {
				refunds = append(refunds, floodgate.Op{Policy: ops[o.op].Policy, Key: ops[o.op].Key, Kind: floodgate.OpRefund, Cost: ops[o.op].Cost})
			}
		}
		g.store.DoBatch(context.WithoutCancel(ctx), g.clock.NowMicro(), refunds, make([]floodgate.Decision, len(refunds))) //nolint:errcheck // best effort
		v.Allowed, v.Err, v.Deciding = false, err, nil
		return
	}
	v.Delayed = wait
}

// planRules plans the outcomes of the limits that name a Domain through
// the decider: one plan per domain (a request's descriptors of one domain
// together, as serve takes them, so that replaces applies among them),
// the blocked limits decided. v.rs.res[i] is outcome i's result.
func (g *Gate) planRules(ctx context.Context, v *Verdict, now int64) {
	if v.rs == nil {
		v.rs = new(rulesScratch)
	}
	rs := v.rs
	rs.ops, rs.idx = rs.ops[:0], rs.idx[:0]
	for i := range v.Outcomes {
		if o := &v.Outcomes[i]; o.l.Policy == nil && !o.l.Blocked {
			rs.idx = append(rs.idx, i)
		}
	}
	if len(rs.idx) == 0 {
		return
	}
	rs.res = slices.Grow(rs.res[:0], len(v.Outcomes))[:len(v.Outcomes)]
	for i := range rs.res {
		rs.res[i] = decide.Result{Op: -1}
	}
	for len(rs.idx) > 0 {
		// the first domain's outcomes, at most a request's descriptors
		dom, rest, n := v.Outcomes[rs.idx[0]].l.Domain, rs.idx[:0], 0
		rs.descs = rs.descs[:0]
		for _, i := range rs.idx {
			if o := &v.Outcomes[i]; o.l.Domain == dom && n < decide.MaxDescriptors {
				rs.descs = append(rs.descs, decide.Descriptor{Entries: o.ents, Hits: o.l.Cost})
				n++
			}
		}
		rs.chunk = slices.Grow(rs.chunk[:0], n)[:n]
		var err error
		if rs.ops, err = g.dec.Plan(ctx, g.cfg.Rules, dom, rs.descs, rs.chunk, rs.ops); err != nil {
			g.logf("floodgate: a rules-file limit's descriptor is refused; it does not apply", "err", err)
		}
		g.dec.Finish(now, rs.chunk, nil) // the blocked ones
		k := 0
		for _, i := range rs.idx {
			if o := &v.Outcomes[i]; o.l.Domain == dom && k < n {
				if err == nil {
					rs.res[i] = rs.chunk[k]
				}
				k++
				continue
			}
			rest = append(rest, i)
		}
		rs.idx = rest
	}
}

// blockedDecision is a blocked limit's refusal (requests_per_unit: 0) at
// now: remaining 0 until its window's end (a fixed window's, aligned to
// the epoch, as the service says it), or for a whole window.
func blockedDecision(lm *rules.Limit, now int64) floodgate.Decision {
	d := floodgate.Decision{Rule: lm.Name, Reason: floodgate.ReasonLimited, RetryAfter: time.Second, ResetAfter: time.Second}
	if lm.Policy == nil {
		return d // a Limit made Blocked in Go states no window
	}
	r := lm.Policy.Rules()[0]
	wait := ratehdr.Window(r)
	if pm := r.Period.Microseconds(); r.Algorithm == floodgate.FixedWindow && r.Calendar == "" && pm > 0 {
		wait = time.Duration(pm-now%pm) * time.Microsecond
	}
	d.RetryAfter, d.ResetAfter = wait, wait
	return d
}

// storeFailed completes v, decided by the gate's failure policy because
// the store (remote: the rate limit service) failed: the request passes,
// or, with Config.FailClosed, is refused for ReasonStoreUnavailable, the
// first outcome deciding, as it always has. Each limit that asked (remote:
// every one) gets that decision, marked Degraded, rather than the zero
// Decision (a refusal that never happened) its failed call left it.
func (g *Gate) storeFailed(v *Verdict, remote bool) {
	closed := g.cfg.FailClosed
	d := floodgate.Decision{Allowed: true, Degraded: true}
	if closed {
		d = floodgate.Decision{Reason: floodgate.ReasonStoreUnavailable, RetryAfter: time.Second, Degraded: true}
	}
	for i := range v.Outcomes {
		if o := &v.Outcomes[i]; remote || o.op >= 0 {
			o.Decision, o.Over = d, closed && !o.shadow()
		}
	}
	v.Allowed, v.Deciding = !closed, nil
	// a blocked limit (requests_per_unit: 0) asks no store: it refuses
	// still, as a limit, not as the store's failure
	if !remote {
		for i := range v.Outcomes {
			if o := &v.Outcomes[i]; o.op < 0 && o.ruleLm != nil && o.ruleLm.Blocked && !o.shadow() {
				o.Over = true
				v.Allowed, v.Deciding = false, o
				return
			}
		}
	}
	if closed {
		v.Deciding = &v.Outcomes[0]
		v.Deciding.Over = true
		v.Deciding.Decision = d
	}
}

// opPending marks, while local lays out the operations, an outcome whose
// decision has no place yet.
const opPending = -2

// opsOf is the number of store operations an outcome takes while local
// lays them out: one for its decision if it is pending and, for a ban,
// two more.
func opsOf(o *Outcome) int {
	switch {
	case o.op != opPending:
		return 0
	case o.l.banMarker != nil:
		return 3
	}
	return 1
}

// An opCall is one store call: the operations ops[start:end], those from
// members on the all-or-nothing group's.
type opCall struct {
	start, members, end int
	admitted            bool // the group was admitted: every member allowed
}

// grouped reports whether the call's members are a group: two or more.
func (c *opCall) grouped() bool { return c.end-c.members >= 2 }

// decide makes call c, putting ops[i]'s decision in decs[i].
func (g *Gate) decide(ctx context.Context, now int64, ops []floodgate.Op, decs []floodgate.Decision, c *opCall) error {
	batch, out := ops[c.start:c.end], decs[c.start:c.end]
	switch {
	case len(batch) == 1:
		var err error
		out[0], err = g.store.Do(ctx, now, batch[0])
		return err
	case c.grouped():
		// The limits that can refuse are all or nothing, in one atomic
		// step where the store can (floodgate.DoGroup): a request refused
		// by one never holds the others' capacity, even for a moment.
		group := make([]bool, len(batch))
		for k := c.members - c.start; k < len(group); k++ {
			group[k] = true
		}
		var err error
		c.admitted, err = floodgate.DoGroup(ctx, g.store, now, batch, group, out)
		return err
	}
	return g.store.DoBatch(ctx, now, batch, out)
}

// refund gives back what the outcomes' decisions in calls took, for a
// request refused: each admitted decision but those of a refused group
// (which took nothing), a banned key's included: a refused request spends
// no quota. decs[i] is ops[i]'s decision, as the store made it (a ban
// refuses what its limit admitted). It is best effort, as a refund can
// only be.
func (g *Gate) refund(ctx context.Context, now int64, ops []floodgate.Op, outcomes []Outcome, calls []opCall, decs []floodgate.Decision) {
	var refunds []floodgate.Op
	for i := range outcomes {
		o := &outcomes[i]
		if o.op < 0 || ops[o.op].Cost <= 0 {
			continue
		}
		c := callOf(calls, o.op)
		if c == nil || c.grouped() && o.op >= c.members && !c.admitted {
			continue
		}
		if decs[o.op].Allowed {
			refunds = append(refunds, floodgate.Op{Policy: ops[o.op].Policy, Key: ops[o.op].Key, Kind: floodgate.OpRefund, Cost: ops[o.op].Cost})
		}
	}
	if len(refunds) > 0 {
		if err := g.store.DoBatch(context.WithoutCancel(ctx), now, refunds, make([]floodgate.Decision, len(refunds))); err != nil {
			g.logf("floodgate: a refund failed", "err", err)
		}
	}
}

// callOf returns the call of calls that made ops[k], or nil.
func callOf(calls []opCall, k int) *opCall {
	for i := range calls {
		if c := &calls[i]; c.start <= k && k < c.end {
			return c
		}
	}
	return nil
}

// deciding picks the outcome the response describes: over with the
// longest wait, else the fewest remaining.
func deciding(os []Outcome) *Outcome {
	var best *Outcome
	for i := range os {
		o := &os[i]
		if !o.Decided() || o.quota() {
			continue
		}
		switch {
		case best == nil:
			best = o
		case o.Over != best.Over:
			if o.Over {
				best = o
			}
		case o.Over:
			if o.Decision.RetryAfter > best.Decision.RetryAfter {
				best = o
			}
		case o.Decision.Remaining < best.Decision.Remaining:
			best = o
		}
	}
	return best
}

package gate

import (
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/decide"
	"github.com/floodgate/floodgate/rules"
)

// Outcome is one limit's part of a verdict.
type Outcome struct {
	Limit *Limit // the limit that applied
	Key   string // the key: the parts' values joined by '|'
	// Decision is the store's (or a failure mode's) answer. It is the zero
	// Decision, Allowed false, when nothing was decided: a rules-file limit
	// whose entries match no limit of its domain (an exempt value
	// included), or an unlimited one.
	// Read Over, not Decision.Allowed, for whether the limit refused.
	Decision floodgate.Decision
	// Banned: the key is banned (or was just banned by this request).
	Banned bool
	// Over: the limit refuses the request (shadow limits never do, but
	// their Decision says what they would have done).
	Over bool

	l      *limit
	ents   []rules.Entry // the descriptor entries of a limit without a Policy
	policy *floodgate.Policy
	skey   string // the store's key
	name   string // the rule's name as a structured-field string
	ruleLm *rules.Limit
	op     int // index of the main op, or -1
	banOp  int // index of the ban marker's peek, or -1
	thrOp  int // index of the threshold's charge, or -1
}

// Decided reports whether the limit decided the request: false when
// nothing was (a rules-file limit whose entries match no limit of its
// domain, an exempt value included, or an unlimited one), and Decision is
// then the zero Decision.
func (o *Outcome) Decided() bool {
	return o.op >= 0 || o.ruleLm != nil || o.Banned
}

// shadow reports whether the outcome's limit never refuses: a Shadow
// action, or a rule in shadow mode or quota mode (admitted over its
// quota).
func (o *Outcome) shadow() bool {
	return o.l.Action == Shadow || o.ruleLm != nil && (o.ruleLm.ShadowMode || o.ruleLm.QuotaMode)
}

// quota reports whether the outcome's limit is a rule in quota mode,
// which the headers do not describe (as the service's do not).
func (o *Outcome) quota() bool { return o.ruleLm != nil && o.ruleLm.QuotaMode }

// Verdict is what the gate decided for a request.
type Verdict struct {
	// Allowed: let the request through (after Delayed, already waited).
	Allowed bool
	// Deciding is the outcome that refused the request, or that the
	// headers describe when it passes (the one with the fewest remaining).
	Deciding *Outcome
	// Outcomes are the matching limits' outcomes.
	Outcomes []Outcome
	// Delayed is how long a Delay action held the request.
	Delayed time.Duration
	// Soft: a limit in soft or elastic mode let the request past its
	// soft line (with a remote service: it sent Floodgate-Warning).
	Soft bool
	// Err is a store or remote failure (the request passed unless
	// Config.FailClosed; either way each limit that asked has the failure
	// policy's Decision, marked Degraded), or the context's error when the
	// client left while a Delay held it (Allowed false and Deciding nil).
	Err error
	// Headers from a remote service (RateLimit fields it computed).
	RemoteHeaders [][2]string

	buf       [4]Outcome
	storeTook time.Duration // time in the store's (or service's) calls, when traced
	rs        *rulesScratch // the rules-file outcomes' plan, kept for the next request
}

// rulesScratch is what a verdict keeps of its rules-file outcomes' plan:
// res[i] is outcome i's result, its Op an index of ops (the decider's
// operations) until local places it.
type rulesScratch struct {
	res   []decide.Result
	ops   []floodgate.Op
	descs []decide.Descriptor
	chunk []decide.Result
	idx   []int
}

// StoreUnavailable reports whether the request was refused because the
// store (or the remote service) could not be asked, not because a limit
// was reached: the gate failing closed on a store error
// (Config.FailClosed), or a rule failing closed
// (floodgate.Rule.OnStoreFailure) while its store could not answer.
// Deciding's Decision then has ReasonStoreUnavailable. Such a refusal is
// answered 503 Service Unavailable (gRPC UNAVAILABLE), whatever the
// limit's Status or Action, and Headers gives it Retry-After alone.
func (v *Verdict) StoreUnavailable() bool {
	return !v.Allowed && v.Deciding != nil && v.Deciding.Decision.Reason == floodgate.ReasonStoreUnavailable
}

// Degraded reports whether a failure mode rather than the store decided
// the request, or one of its limits: the store (or the remote service)
// failed and the gate's failure policy decided (Err), or a rule's
// OnStoreFailure did while its store could not answer (an outcome's
// Decision.Degraded). The request may have passed (failing open or
// local) or been refused; for metrics, a count of decisions made without
// the store.
func (v *Verdict) Degraded() bool {
	if v.Err != nil && (v.Allowed || v.Deciding != nil) {
		return true
	}
	for i := range v.Outcomes {
		if v.Outcomes[i].Decision.Degraded {
			return true
		}
	}
	return false
}

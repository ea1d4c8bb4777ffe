package floodgate

import (
	"context"
	"time"
)

// Reason says why a request was denied.
type Reason uint8

// Reasons.
const (
	ReasonNone             Reason = iota // admitted
	ReasonLimited                        // a rule's limit is reached; retry after RetryAfter
	ReasonCostTooLarge                   // the cost exceeds a rule's capacity (an elastic rule without spare capacity: its limit); waiting does not help
	ReasonStoreUnavailable               // the store could not answer and a rule fails closed
)

// String returns the reason's name: "none", "limited", "cost_too_large" or
// "store_unavailable".
func (r Reason) String() string {
	switch r {
	case ReasonNone:
		return "none"
	case ReasonLimited:
		return "limited"
	case ReasonCostTooLarge:
		return "cost_too_large"
	case ReasonStoreUnavailable:
		return "store_unavailable"
	}
	return "unknown"
}

// A Decision is the answer for one key: whether the request is admitted and
// everything needed to tell the client. For a policy of several rules, the
// numbers are those of the deciding rule: for a denial, the denying rule
// with the longest RetryAfter; for an admission, the rule with the fewest
// Remaining. docs/ALGORITHMS.md defines each field per algorithm.
type Decision struct {
	// Allowed reports whether the request may proceed: every rule admitted
	// it (or a rule's failure mode did, when the store could not be asked:
	// see Degraded).
	Allowed bool
	// Limit is the deciding rule's limit: requests per period.
	Limit int64
	// Remaining is how many more requests of cost 1 the deciding rule
	// admits right now (up to its burst for bucket algorithms), not counting
	// any soft or elastic allowance.
	Remaining int64
	// ResetAfter is the time until the key's state under the deciding rule
	// is fully fresh again, if no more requests arrive.
	ResetAfter time.Duration
	// RetryAfter is, for a denial, the time until a request of the same cost
	// would be admitted if no other request arrives; 0 when admitted, and 0
	// with ReasonCostTooLarge, when no wait helps.
	RetryAfter time.Duration
	// Delay is a reservation's wait (Reserve, Wait) before the request may
	// proceed; 0 otherwise.
	Delay time.Duration
	// Rule is the deciding rule's name.
	Rule string
	// Reason says why the request was denied.
	Reason Reason
	// Excess marks an admission beyond a rule's limit under soft or elastic
	// throttling: past the soft line.
	Excess bool
	// Degraded marks a decision made by the rules' failure modes because the
	// store could not answer (see Rule.OnStoreFailure).
	Degraded bool
}

// OpKind is what an operation asks of a key.
type OpKind uint8

// The operations a store performs.
const (
	OpAllow   OpKind = iota // admit and consume if every rule fits, else consume nothing
	OpPeek                  // report whether Cost would be admitted; consume nothing
	OpReserve               // admit against capacity freeing within MaxDelay (bucket rules)
	OpCharge                // record Cost whether or not it fits, clamped at capacity
	OpRefund                // give back Cost, newest consumption first
	OpReset                 // forget the key
)

var opNames = [...]string{"allow", "peek", "reserve", "charge", "refund", "reset"}

// String returns the operation's name: "allow", "peek", "reserve",
// "charge", "refund" or "reset".
func (k OpKind) String() string {
	if int(k) < len(opNames) {
		return opNames[k]
	}
	return "unknown"
}

// An Op is one operation on one key under one policy.
type Op struct {
	Policy   *Policy       // the rules that decide, and the name the key's state is kept under
	Key      string        // the key (user, address, API key)
	Kind     OpKind        // what is asked
	Cost     int64         // how many requests the operation counts as (OpPeek: would count as)
	MaxDelay time.Duration // OpReserve: the longest acceptable Delay
	Spare    uint64        // bit i: rule i's elastic signal reports spare capacity
}

// A Store keeps the state of every key and applies operations to it
// atomically. Each key's rules are decided all or nothing. A batch decides
// several keys (per IP and per user, say) in one call, one round trip for
// a remote store; each key is atomic on its own, and each gets its decision.
//
// now is the caller's time in microseconds since the epoch. Package
// storekit has what an implementation needs of a Policy.
type Store interface {
	// Do applies op to its key at now and returns the decision.
	Do(ctx context.Context, now int64, op Op) (Decision, error)
	// DoBatch applies ops[i] at now and writes its decision to out[i],
	// in one call (one round trip for a remote store).
	DoBatch(ctx context.Context, now int64, ops []Op, out []Decision) error
}

// RetryAfterSeconds is RetryAfter in whole seconds, rounded up, as an
// HTTP Retry-After header says it: a wait of 1 ms is 1, not 0 (a client
// told 0 would retry at once and be refused again).
func (d Decision) RetryAfterSeconds() int64 {
	if d.RetryAfter <= 0 {
		return 0
	}
	return int64((d.RetryAfter + time.Second - 1) / time.Second)
}

// A Mover is a Store that can carry a key's state from one policy to
// another (the in-memory store and the Redis store are): when a key's limit
// changes to a policy of another name (a per-key override set, changed or
// removed), what the key has used so far stays used.
type Mover interface {
	// Move carries key's state under from to to, atomically, rule by rule
	// matched by name and converted as a new version of a policy converts
	// it (storekit.Migrate: what each rule consumed, in requests, clamped to
	// the new capacity; rules new to to start fresh), and added to what key
	// already had under to (storekit.MigrateOnto: requests decided under to
	// in the moment before the move, while the change that made to the
	// key's policy was already visible, are kept, within to's capacity);
	// key's state under from is forgotten. A key with no state under from
	// keeps what it has under to.
	Move(ctx context.Context, now int64, from, to *Policy, key string) error
}

// Package lease is the engine of Floodgate's capacity leases: the
// resources configuration, the sharing algorithms and the grant table a
// capacity server keeps. It is pure and clock-injected: no network, no
// goroutines, no wall clock of its own.
//
// A client asks a Table for a share of a resource's capacity (its wants, at
// a priority) and gets a Lease: a capacity, an expiry and a refresh
// interval. The Table never grants more than the resource's capacity in
// unexpired leases, counting a lease whose response may have been lost, so
// the sum of capacity every client may hold at any instant is at most the
// capacity: 0 over-grant by construction (see Table.Get).
package lease

import (
	"time"

	"github.com/floodgate/floodgate"
)

// Algorithm names how a resource's capacity is shared among its clients.
type Algorithm string

// The algorithms.
const (
	// None grants each client what it wants (gets = wants), still capped
	// so that the sum stays within the capacity.
	None Algorithm = "none"
	// Static grants each client min(wants, StaticCapacity).
	Static Algorithm = "static"
	// ProportionalShare gives clients under the equal share their wants and
	// splits the leftover among the others in proportion to their excess
	// over the equal share.
	ProportionalShare Algorithm = "proportional_share"
	// FairShare gives every client the same share, capped at its wants,
	// redistributing the leftovers until none remain (max-min fairness).
	FairShare Algorithm = "fair_share"
)

// Defaults of a resource's durations.
const (
	DefaultLeaseLength     = 60 * time.Second
	DefaultRefreshInterval = 5 * time.Second
)

// A Resource is one entry of the resources file: how a resource's capacity
// is shared and leased.
type Resource struct {
	ID              string        // exact, or a glob (path.Match syntax); "*" matches all and must be last (mandatory)
	Capacity        float64       // total, in the resource's units (per second for a rate)
	SafeCapacity    float64       // per client in safe mode; 0: Capacity / clients, computed by the server
	Algorithm       Algorithm     // how Capacity is shared
	StaticCapacity  float64       // "static": each client's cap
	LeaseLength     time.Duration // default 60s
	RefreshInterval time.Duration // default 5s; < LeaseLength
	LearningMode    time.Duration // default = LeaseLength
	Pos             string        // "file:line", for messages
}

// Config is a resources file: its resources in order, the mandatory "*"
// default last.
type Config struct {
	Resources []Resource
}

// Find returns the first resource whose ID matches id (exactly or as a
// glob), or nil if none does (a Config from ParseConfig always has the
// "*" default, so it never returns nil).
func (c *Config) Find(id string) *Resource {
	if c == nil {
		return nil
	}
	for i := range c.Resources {
		if match(c.Resources[i].ID, id) {
			return &c.Resources[i]
		}
	}
	return nil
}

// A Lease is a grant of capacity: Capacity until Expiry, to be refreshed
// every Refresh; Safe is the per-client capacity to use in safe mode when
// no server can be reached. The zero Lease is no lease.
type Lease struct {
	Capacity float64
	Expiry   time.Time
	Refresh  time.Duration
	Safe     float64
}

// A Request is a client's ask for one resource: what it wants, at which
// priority (a higher band is served first), and the lease it holds now
// (the zero Lease: none), exactly as it was granted (Capacity and Expiry
// to the microsecond): that is how the table knows the client received its
// newest lease, and stops counting the older ones.
type Request struct {
	Resource string
	Priority int64
	Wants    float64
	Has      Lease
}

// Options configure a Table.
type Options struct {
	// Clock is the time source (NowMicro); clock.Manual in tests. Nil: the
	// package clock's coarse system clock.
	Clock floodgate.Clock
	// MaxClients bounds the clients the Table tracks, counting a client
	// once per resource it asks for (the table's memory is proportional to
	// it); a new one beyond it gets ErrTooManyClients. Clients whose leases
	// have all expired are forgotten. 0: DefaultMaxClients.
	MaxClients int
	// Intermediate makes the Table an intermediate server's: a resource's
	// capacity is what SetParent last gave for it (while that lease lasts),
	// and 0 before the parent has answered, never the configured Capacity.
	Intermediate bool
	// NoFastRefresh keeps every lease's refresh interval at the resource's
	// refresh_interval, even in transition (see Table.Get); convergence
	// after a demand shift then takes about one refresh interval more.
	NoFastRefresh bool
}

// DefaultMaxClients is the client bound of a Table whose Options give none.
const DefaultMaxClients = 100_000

// A Demand is a resource's demand as an intermediate server reports it to
// its parent: the lease it holds from the parent and its clients' wants
// by priority band.
type Demand struct {
	Resource string
	Has      Lease
	Bands    []Band
}

// A Band is the demand of one priority band: how many clients, wanting how
// much in all.
type Band struct {
	Priority int64
	Clients  int64
	Wants    float64
}

// Stats describe one resource of a Table now.
type Stats struct {
	Resource string  // the resource's id (as clients ask for it)
	Capacity float64 // its capacity now (the parent's grant, for an intermediate)
	Granted  float64 // the capacity in unexpired leases (Outstanding)
	Wanted   float64 // the sum of its clients' wants
	Clients  int64   // clients holding or asking for it
	Learning bool    // in learning mode
}

package lease

import (
	"errors"
	"sync"
)

// ErrTooManyClients is Get's error when a new client (a new client and
// resource pair) would take the Table beyond Options.MaxClients.
var ErrTooManyClients = errors.New("lease: too many clients")

// A Table is a capacity server's grant table: per resource, its clients,
// their wants and priorities, and the leases granted to them. It is safe
// for concurrent use.
type Table struct {
	mu sync.Mutex
}

// New returns a Table serving the resources of cfg (a Config from
// ParseConfig or LoadConfig).
func New(cfg *Config, opts Options) *Table {
	return &Table{}
}

// Get grants client one lease per request, appended to out[:0] in the
// requests' order. A client's target comes from the resource's algorithm
// over all its clients' current wants (the highest priority band served
// first); its grant is min(target, Capacity − what every other client may
// still hold now), so the capacity in unexpired leases never exceeds the
// resource's capacity. Bad requests, an unknown resource or too many
// clients fail the whole call, changing nothing.
func (t *Table) Get(client string, reqs []Request, out []Lease) ([]Lease, error) {
	return out[:0], errors.New("lease: not implemented yet")
}

// GetServer grants an intermediate server one lease per demand, appended
// to out[:0] in order: the server is one client of each resource whose
// wants are its own clients' (Demand.Bands, as its Table.Demand reports
// them), each band weighing as many clients as it counts, so that fair and
// proportional share treat the server's clients like direct ones. Demand.Has
// is the lease the server holds now. Errors as Get's.
func (t *Table) GetServer(server string, reqs []Demand, out []Lease) ([]Lease, error) {
	return out[:0], errors.New("lease: not implemented yet")
}

// Release drops client's leases of resources: the client has stopped
// using them, and their capacity is free for others at once.
func (t *Table) Release(client string, resources []string) {}

// Reload replaces the resources configuration, whole or nothing: leases
// already granted stand until they expire; new grants follow cfg.
func (t *Table) Reload(cfg *Config) {}

// SetParent makes the Table an intermediate server's for resource: its
// capacity for resource is l.Capacity, and no lease it grants ends after
// l.Expiry.
func (t *Table) SetParent(resource string, l Lease) {}

// Demand returns, per resource, its clients' wants by priority band
// (highest first) and the lease held from the parent: what an intermediate
// server asks its parent for.
func (t *Table) Demand() []Demand { return nil }

// StartLearning puts every resource in learning mode for its LearningMode
// duration, from now: called on becoming master. In learning mode a client
// gets back what it reports holding (Request.Has, capped so that the sum
// stays within the capacity), and a client holding nothing gets 0.
func (t *Table) StartLearning() {}

// Outstanding returns the capacity of resource in unexpired leases now,
// counting for each client the larger of its newest lease and any older
// one it may still hold: the sum that never exceeds the capacity.
func (t *Table) Outstanding(resource string) float64 { return 0 }

// Stats returns each resource's figures now, sorted by resource id.
func (t *Table) Stats() []Stats { return nil }

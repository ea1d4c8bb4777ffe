// Package capacity is the client of Floodgate's capacity leases: a
// process asks the capacity servers for a share of a resource's global
// capacity, gets a lease, and keeps itself under it.
//
// The package has two halves with the client's state between them, as
// Doorman's design has. The bottom half (Client) talks to the servers: it
// finds the master (Discovery, and the mastership that a replica answers
// with), asks for all its resources in one GetCapacity per refresh, at the
// leases' refresh interval less a random jitter (earlier when a resource's
// wants change a lot), retries with backoff when no server answers, and
// gives its leases back (ReleaseCapacity) on Close. The top half (Resource)
// is what application code calls: the capacity it may use now, its wants,
// and a limiter that enforces the capacity with the engine's token bucket
// (a floodgate.Limiter on a memstore), re-rated on each new lease while
// keeping what the bucket has consumed.
//
//	c, err := capacity.New(capacity.ClientOptions{Addrs: []string{"capacity:8081"}})
//	...
//	defer c.Close(ctx)
//	r, err := c.Resource("db/writes", capacity.Options{Wants: 500, Mode: capacity.Safe})
//	...
//	if d, err := r.Allow(ctx); err == nil && d.Allowed {
//		// write
//	}
//
// When no server can be reached, a client keeps its lease until it
// expires, then follows its resource's Mode: Pessimistic (capacity 0),
// Optimistic (what it wants) or Safe (the safe capacity the last lease
// carried: the resource's configured safe capacity, or its capacity
// divided by the number of clients).
//
// Time comes from a floodgate.Clock (clock.Coarse by default): refreshes,
// backoff and lease expiry are all measured on it, so tests drive them
// with a clock.Manual.
package capacity

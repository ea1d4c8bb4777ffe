// Package overrides keeps per-key overrides of rate limits: "user=241531
// in domain api gets 5 requests per 1s instead of the rule's limit", for
// millions of keys.
//
// Stores:
//
//   - Bolt (OpenBolt): a bbolt file in the service's data directory, for a
//     single instance. One nested bucket per domain, key → compact binary
//     value; List is a cursor seek.
//   - Redis (NewRedis): for services running on Redis, so every instance
//     sees the same overrides. One hash (values) and one sorted set (key
//     order, for List) per domain, both tagged with the domain for
//     Cluster; every write is one script that also publishes the change.
//   - Cache (NewCache): any Store behind a bounded, scan-resistant LRU of
//     Get results, overrides and absences alike, for the hot path: a hit
//     costs about 90 ns and allocates nothing. Writes through it drop what
//     they change; over Redis it also subscribes to the change channel,
//     so other instances' writes show within a round trip, with the TTL as
//     a backstop. A lookup in a domain the store knows to have no
//     overrides at all (the usual case) skips the cache: Bolt knows its
//     domains exactly; Redis checks a domain at most once a second and
//     forgets the answer at any change it hears of (redis_domains.go).
//
// Bulk loads go through PutMany (BatchStore): a million overrides in
// batches of 10,000 take about 1.3 s into Bolt when the keys come in key
// order (a 51 MB file) and 4–18 s in random order (120–150 MB; every
// batch then rewrites most of the file's pages, so bigger batches or
// sorted input help), and about 5 s into Redis (about 200 MB of Redis
// memory). See bench_test.go.
//
// Keys are opaque here: the service builds them from descriptors and
// looks them up with the same bytes. Overrides are validated as rules are
// (Validate), and Apply turns a matched rule into the overridden one.
package overrides

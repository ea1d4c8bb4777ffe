// Package throttle is Floodgate's server throttler: admission control that
// protects a service from itself when it is saturated and every client is
// still under its quota.
//
// A Throttler admits requests up to a concurrency limit (fixed, or learned
// from latency by a Vegas-style controller, see AdaptiveConfig) or at a
// fixed outflow rate (Config.Rate, a leaky bucket as a shaper) and queues the
// rest in a queue bounded by the total predicted cost of what it holds, in
// CPU-milliseconds, not by its count. The cost of a request is predicted
// per route from the measured cost of the route's recent completions
// (CostModel). Each request has a Criticality (the SRE book's four
// levels): when the queue is full an arrival evicts the least critical
// queued request if that is less critical than itself, and is refused
// otherwise; the queue serves the most critical first; a request that
// waited past its deadline is dropped before it runs.
//
// Middleware wires it into net/http: shed requests get 503 with
// Retry-After (problem details when asked for). A request's level is what
// it claims in a header, capped at a ceiling (CRITICAL by default) unless
// MiddlewareOptions.Trusted says its source is trusted: a client may lower
// its own level, never raise it. docs/THROTTLE.md describes the design.
package throttle

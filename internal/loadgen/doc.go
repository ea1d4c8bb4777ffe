// Package loadgen is "floodgate bench", the load generator for the
// rate limit service's gRPC API (Envoy's
// envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit).
//
// It drives ShouldRateLimit closed-loop (a fixed number of callers) or
// open-loop (a fixed offered rate on a fixed schedule, with latency measured
// from each request's intended send time, so that a server stall is not
// hidden by the generator waiting for it: no coordinated omission), and
// reports throughput, OK / OVER_LIMIT / error counts, latency percentiles
// from a log-linear histogram, and optionally the server's CPU time per
// decision read from /proc/PID/stat.
//
// EmptyServer is the comparison point: the same gRPC stack with a handler
// that does nothing, so that "CPU per decision" can be stated relative to
// the cost of the stack alone.
//
// Main is the command; Run and Config are the same thing as a library.
package loadgen

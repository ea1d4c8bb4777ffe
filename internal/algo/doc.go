// Package algo holds the math of every Floodgate algorithm, once.
//
// Each algorithm keeps its per-key state in a few int64 words and is written
// as pure functions of (params, state, now, cost): no clock, no allocation,
// no floating point. Times are microseconds since the Unix epoch. The same
// integer math is what the Redis Lua scripts implement, and a differential
// test keeps the two identical.
//
// All-zero state is the fresh state for every algorithm, so a store can
// create a key by zeroing words and drop a key whose state is back at zero.
//
// The full semantics of each algorithm (what "remaining", "reset after" and
// "retry after" mean) are documented in docs/ALGORITHMS.md.
package algo

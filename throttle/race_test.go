//go:build race

package throttle

// raceEnabled: the race detector slows the single-goroutine simulations
// tenfold and finds nothing in them (TestConcurrentBounds is the
// concurrency test).
const raceEnabled = true

// Package refmodel holds brute-force reference models of every Floodgate
// algorithm and throttling mode, written from the definitions and not from
// internal/algo, and randomized property tests proving that the engine
// (storekit.Apply on a state slice, and a memstore behind a Limiter) makes
// exactly the decisions the models make.
//
// The models trade speed for obviousness:
//
//   - buckets keep their tokens (or queue level) as exact rationals
//     (math/big.Rat) refilled at Limit/Period per microsecond, not in the
//     engine's integer units;
//   - window algorithms keep the list of recorded events (time, cost) and
//     count them per window by definition each time they are asked;
//   - calendar windows find the first instant of a local day by searching
//     the time line, not by time.Date;
//   - retry-after and reset-after are found by searching forward in time for
//     the first microsecond at which a request of the cost would be admitted,
//     or at which the rule counts nothing any more.
//
// Times are integer microseconds since the Unix epoch. The models never read
// the wall clock.
package refmodel

// Package bench compares Floodgate's in-memory engine (floodgate.Limiter
// over memstore) with its peers: golang.org/x/time/rate,
// github.com/sethvargo/go-limiter (memorystore) and
// github.com/ulule/limiter/v3 (memory store).
//
// It is a module of its own so that the main module never depends on the
// competitors. The benchmarks live in the _test.go files; run.sh runs them
// all and docs/BENCHMARKS.md reports the results. cmd/report turns a raw
// results file into the tables of that report. middleware.sh runs
// BenchmarkMiddleware (the net/http middleware of Floodgate and its peers,
// per request) and cmd/mwreport makes its table. envoydiff.sh runs
// cmd/envoydiff, a differential check of `floodgate serve` against
// envoyproxy/ratelimit on the same rules and requests (docs/SERVICE.md,
// Differences from envoyproxy/ratelimit). cmd/luacost measures what a
// request costs redis-server (CPU or, under callgrind, instructions)
// through the Lua library and through envoyproxy/ratelimit's commands.
package bench

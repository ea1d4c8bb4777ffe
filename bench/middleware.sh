#!/usr/bin/env bash
# middleware.sh compares the per-request cost of net/http rate-limit
# middleware in process (BenchmarkMiddleware in middleware_test.go):
# Floodgate's httplimit, sethvargo/go-limiter's httplimit, ulule/limiter's
# stdlib middleware and a hand-written sync.Map of x/time/rate limiters,
# each with every request allowed and with every request denied, over
# 1,000 client IPs.
#
#   ./middleware.sh                     # COUNT=6 rounds, -cpu 1,2, -benchtime 1s
#   COUNT=10 BENCHTIME=500ms ./middleware.sh
#   REF=HEAD ./middleware.sh            # Floodgate as committed at REF (git archive)
#
# The test binary is built once (so every round runs the same code even if
# the working tree changes meanwhile) and run COUNT times, each round running
# every benchmark once under every -cpu value: the same as
#
#   go test -run XXX -bench BenchmarkMiddleware -benchmem -count 1 -cpu 1,2
#
# repeated COUNT times, so that the implementations interleave and a burst of
# load on a shared machine hits all of them alike. The report takes medians
# over the rounds. About 35 s a round on 2 cores.
#
# Output: $OUT.txt (the raw go test lines of every round, benchstat input)
# and $OUT.md (machine, revisions, load averages, the table of
# go run ./cmd/mwreport). OUT defaults to results/middleware-<UTC date>.
set -euo pipefail

cd "$(dirname "$0")"
here=$(pwd)
. ./lib.sh
COUNT=${COUNT:-6}
BENCHTIME=${BENCHTIME:-1s}
CPU=${CPU:-1,2}
REF=${REF:-}
OUT=${OUT:-results/middleware-$(date -u +%Y-%m-%d)}

mkdir -p "$(dirname "$OUT")"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

src=$(bench_src "$here" "$REF" "$work")

engine_rev=$(git -C .. rev-parse --short HEAD)
if [[ -n $REF ]]; then
	engine_rev="$(git -C .. rev-parse --short "$REF") (REF=$REF, exported with git archive)"
else
	dirty=$(git -C .. status --porcelain -- . ':!bench' ':!docs' || true)
	if [[ -n $dirty ]]; then
		engine_rev="$engine_rev + uncommitted changes in: $(echo "$dirty" | awk '{print $2}' | tr '\n' ' ')"
	fi
fi

loadavg() { cut -d' ' -f1-3 /proc/loadavg; }

(cd "$src" && go test -c -o "$work/bench.test" .)

raw=$OUT.txt
: >"$raw"
loads=("before: $(loadavg)")
start=$(date +%s)
for round in $(seq 1 "$COUNT"); do
	echo "=== round $round/$COUNT ($(($(date +%s) - start))s, load $(loadavg))" >&2
	if ! "$work/bench.test" -test.run XXX -test.bench BenchmarkMiddleware -test.benchmem \
		-test.benchtime "$BENCHTIME" -test.count 1 -test.cpu "$CPU" | tee -a "$raw"; then
		echo "=== round $round failed (a wrong status?): see $raw" >&2
		exit 1
	fi
	loads+=("after round $round: $(loadavg)")
done
elapsed=$(($(date +%s) - start))
echo "=== done in ${elapsed}s" >&2

{
	echo "# HTTP middleware overhead per request, in process"
	echo
	echo '```'
	echo "date:        $(date -u +%Y-%m-%dT%H:%M:%SZ)"
	echo "cpu:         $(nproc) × $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
	echo "kernel:      $(uname -sr)"
	echo "go:          $(go version | cut -d' ' -f3-)"
	echo "floodgate:   $engine_rev"
	echo "peers:       $(cd "$src" && go list -m -f '{{.Path}}@{{.Version}}' github.com/sethvargo/go-limiter github.com/ulule/limiter/v3 golang.org/x/time | tr '\n' ' ')"
	echo "command:     bench.test -test.run XXX -test.bench BenchmarkMiddleware -test.benchmem -test.benchtime $BENCHTIME -test.count 1 -test.cpu $CPU"
	echo "             $COUNT rounds, interleaved, ${elapsed}s; medians over the rounds"
	echo "load avg:    (1, 5, 15 min; the machine is shared, other work was running)"
	for l in "${loads[@]}"; do echo "             $l"; done
	echo '```'
	echo
	echo "Each request: a GET from one of 1,000 client addresses (RemoteAddr"
	echo "10.0.x.y:1234, cycled in order), through the middleware to a handler that"
	echo "only calls WriteHeader(200); the ResponseWriter reuses one header map,"
	echo "cleared per request, so B/op and allocs/op are the middleware's own. Every"
	echo "status is checked. allowed: a burst of 1e9 per IP refilled at 1/s (1e9 per"
	echo "1e9 s; all pass); denied: 1 an hour per IP, every key spent before timing"
	echo "(all refused with 429)."
	echo "The loop is b.RunParallel: GOMAXPROCS 1 is one goroutine, GOMAXPROCS 2 is"
	echo "two goroutines at once (ns/op is wall time per request over both)."
	echo
	echo "- **floodgate**: floodgate/httplimit, one per-IP token bucket (gate.IP()) on its own memstore; RateLimit-Policy and RateLimit headers, Retry-After and a text body when refused"
	echo "- **go-limiter**: sethvargo/go-limiter httplimit.NewMiddleware(memorystore, IPKeyFunc()); X-RateLimit-Limit/Remaining/Reset, Retry-After and http.Error when refused"
	echo "- **ulule**: ulule/limiter/v3 drivers/middleware/stdlib over drivers/store/memory (a fixed window); X-RateLimit-Limit/Remaining/Reset, http.Error when refused"
	echo "- **x-time-rate**: hand-written baseline, a sync.Map of golang.org/x/time/rate Limiters keyed by net.SplitHostPort(RemoteAddr); no headers, a bare 429"
	echo
	echo "Ratios are each median over Floodgate's median for the same case and GOMAXPROCS (above 1× costs more than Floodgate)."
	echo
	(cd "$here" && go run ./cmd/mwreport "$raw")
} >"$OUT.md"
cat "$OUT.md"
echo "wrote $raw and $OUT.md" >&2

#!/usr/bin/env bash
# run.sh runs the whole comparison of Floodgate's in-memory engine with its
# peers and saves the raw output in results/.
#
#   ./run.sh                 # the engine as it is in the working tree (../)
#   REF=HEAD ./run.sh        # the engine as committed at REF (git archive)
#   ROUNDS=6 BENCHTIME=400ms ./run.sh
#   BENCH='Keyed/././parallel' OUT=results/parallel ROUNDS=10 ./run.sh   # one workload
#
# The test binary is built once and run ROUNDS times, each round running
# every benchmark once (-test.count 1): the rounds interleave the
# implementations, so a burst of load on a shared machine hits all of them
# alike, and every round runs the same code even if the engine's sources
# change meanwhile. The defaults take about 6 to 8 minutes on 2 cores (more
# when the machine is shared).
#
# Output (in OUT, default results):
#   results/raw.txt        the go test -bench lines of every round (benchstat input)
#   results/env.txt        machine, Go version, engine revision, settings
#   results/benchstat.txt  benchstat summaries (if benchstat is installed)
#   results/report.md      the tables of docs/BENCHMARKS.md (go run ./cmd/report)
set -euo pipefail

cd "$(dirname "$0")"
here=$(pwd)
. ./lib.sh
ROUNDS=${ROUNDS:-6}
BENCHTIME=${BENCHTIME:-400ms}
BENCH=${BENCH:-.}
REF=${REF:-}
OUT=${OUT:-results}

mkdir -p "$OUT"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

src=$(bench_src "$here" "$REF" "$work")

engine_rev=$(git -C .. rev-parse HEAD)
if [[ -n $REF ]]; then
	engine_rev="$(git -C .. rev-parse "$REF") (REF=$REF, exported with git archive)"
else
	dirty=$(git -C .. status --porcelain -- . ':!bench' ':!docs' || true)
	if [[ -n $dirty ]]; then
		sum=$( (git -C .. diff HEAD -- . ':!bench' ':!docs'; git -C .. ls-files --others --exclude-standard -- . ':!bench' ':!docs' | while read -r f; do cat "../$f"; done) | sha256sum | cut -c1-12)
		engine_rev="$engine_rev + uncommitted changes (working tree, content sha256 $sum):
$(echo "$dirty" | sed 's/^/    /')"
	fi
fi

{
	echo "date:       $(date -u +%Y-%m-%dT%H:%M:%SZ)"
	echo "nproc:      $(nproc)"
	echo "cpu:        $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
	echo "kernel:     $(uname -sr)"
	echo "go:         $(go version)"
	echo "GOMAXPROCS: ${GOMAXPROCS:-default ($(nproc))}"
	echo "engine:     $engine_rev"
	echo "peers:      $(cd "$src" && go list -m -f '{{.Path}}@{{.Version}}' golang.org/x/time github.com/sethvargo/go-limiter github.com/ulule/limiter/v3 | tr '\n' ' ')"
	echo "command:    bench.test -test.run '^\$' -test.bench '$BENCH' -test.benchmem -test.benchtime $BENCHTIME -test.count 1, $ROUNDS rounds"
} >"$OUT/env.txt"
cat "$OUT/env.txt"

(cd "$src" && go test -c -o "$work/bench.test" .)

: >"$OUT/raw.txt"
start=$(date +%s)
for round in $(seq 1 "$ROUNDS"); do
	echo "=== round $round/$ROUNDS ($(($(date +%s) - start))s)" >&2
	"$work/bench.test" -test.run '^$' -test.bench "$BENCH" -test.benchmem \
		-test.benchtime "$BENCHTIME" -test.count 1 | tee -a "$OUT/raw.txt"
done
echo "=== done in $(($(date +%s) - start))s" >&2

benchstat=$(command -v benchstat || true)
[[ -z $benchstat && -x "$(go env GOPATH)/bin/benchstat" ]] && benchstat="$(go env GOPATH)/bin/benchstat"
if [[ -n $benchstat ]]; then
	{
		echo "# Single key: benchstat -col /impl (deltas against fg_token_bucket)"
		"$benchstat" -filter '.name:SingleKey .unit:(sec/op OR allocs/op OR admitted/op)' -col /impl "$OUT/raw.txt"
		echo
		echo "# Keyed workloads: benchstat -col /impl (deltas against fg_token_bucket)"
		"$benchstat" -filter '.name:Keyed .unit:(sec/op OR allocs/op OR admitted/op)' -col /impl "$OUT/raw.txt"
		echo
		echo "# Heap per key at 1M keys"
		"$benchstat" -filter '.name:HeapPerKey .unit:(B/key OR sec/insert)' -row /impl -col .name "$OUT/raw.txt"
	} >"$OUT/benchstat.txt" 2>&1 || true
else
	echo "benchstat not found (go install golang.org/x/perf/cmd/benchstat@latest); skipping" >&2
fi
(cd "$here" && go run ./cmd/report "$OUT/raw.txt") >"$OUT/report.md"
echo "wrote $OUT/{raw.txt,env.txt,benchstat.txt,report.md}" >&2

#!/usr/bin/env bash
# service.sh measures `floodgate serve` with `floodgate bench`, in one run:
# the empty ShouldRateLimit handler (the gRPC stack's ceiling), the service
# on the in-memory store, and on Redis (a redis-server started here on a
# free port). Closed loop at 64 callers over 1000 keys (throughput, latency,
# the server's CPU per decision), then open loop at 5,000 requests/s.
#
#   ./service.sh                  # DURATION=10s by default
#   DURATION=20s ./service.sh
#   FLOODGATE=/path/to/floodgate ./service.sh   # a binary built elsewhere (an A/B run)
#   OUT=results/mine ./service.sh               # results/mine.txt and .md
#
# Output: results/service.txt (raw) and results/service.md (the table), or $OUT.txt and $OUT.md.
set -euo pipefail
cd "$(dirname "$0")"
. ./lib.sh
DURATION=${DURATION:-10s}
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

if [ -n "${FLOODGATE:-}" ]; then
	fg=$(realpath "$FLOODGATE")
else
	(cd .. && go build -o "$work/floodgate" ./cmd/floodgate)
	fg=$work/floodgate
fi

bench_rules "$work/rules"


ep=$(freeport)
"$fg" bench --serve-empty 127.0.0.1:$ep & pids+=($!); empty_pid=$!
wait_port $ep

mp=$(freeport)
"$fg" serve --rules "$work/rules" --data "$work/mem" --grpc-addr 127.0.0.1:$mp --http-addr 127.0.0.1:0 --admin-addr 127.0.0.1:0 --log-level warn & pids+=($!); mem_pid=$!
wait_port $mp

rp=$(freeport)
redis-server --port $rp --bind 127.0.0.1 --save "" --appendonly no --dir "$work" --logfile "$work/redis.log" & pids+=($!)
wait_port $rp
sp=$(freeport)
"$fg" serve --rules "$work/rules" --data "$work/red" --store redis://127.0.0.1:$rp --grpc-addr 127.0.0.1:$sp --http-addr 127.0.0.1:0 --admin-addr 127.0.0.1:0 --log-level warn & pids+=($!); red_pid=$!
wait_port $sp

OUT=${OUT:-results/service}
mkdir -p "$(dirname "$OUT")"
out=$OUT.txt
: > "$out"
run() { # name addr pid args...
	local name=$1 addr=$2 pid=$3; shift 3
	echo "=== $name $*" | tee -a "$out"
	"$fg" bench --addr "$addr" --domain bench --descriptor generic_key=k --keys 1000 --warmup 2s --duration "$DURATION" --cpu-pid "$pid" --json "$@" 2>/dev/null | tee -a "$out"
}
for mode in "--concurrency 64" "--rate 5000"; do
	run empty 127.0.0.1:$ep $empty_pid $mode
	run memory 127.0.0.1:$mp $mem_pid $mode
	run redis 127.0.0.1:$sp $red_pid $mode
done
go run ./cmd/servicereport "$out" > "$OUT.md"
cat "$OUT.md"

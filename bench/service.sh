#!/usr/bin/env bash
# service.sh measures `floodgate serve` with `floodgate bench`, in one run:
# the empty ShouldRateLimit handler (the gRPC stack's ceiling, on the gRPC
# options and GC floor of floodgate serve; and as stock grpc-go serves it,
# for a second reference), the service
# on the in-memory store, and on Redis (a redis-server started here on a
# free port). Closed loop at 64 callers over 1000 keys (throughput, latency,
# the server's CPU per decision), then open loop at 5,000 requests/s.
# A peer runs beside them on the same redis-server and rules file:
# envoyproxy/ratelimit (the service Floodgate stands in for), built here
# with `go install` at a fixed commit unless PEER=0. For the runs on Redis,
# redis-server's own CPU per decision is reported too (--store-pid).
#
#   ./service.sh                  # DURATION=10s by default
#   DURATION=20s ./service.sh
#   FLOODGATE=/path/to/floodgate ./service.sh   # a binary built elsewhere (an A/B run)
#   OUT=results/mine ./service.sh               # results/mine.txt and .md
#   PEER=0 ./service.sh                         # without envoyproxy/ratelimit
#   ENVOY_RATELIMIT=/path/to/service_cmd ./service.sh   # the peer built elsewhere
#   DESCRIPTORS=3 ./service.sh    # requests of three descriptors (one by default)
#   ONLY=redis ./service.sh       # the runs on Redis alone (Floodgate and the peer)
#   MODES="--concurrency 64" ./service.sh   # the loads, comma-separated
#   KEYS=10 ./service.sh          # keys per descriptor (1000 by default)
#   TIER=local_share PEER=0 ./service.sh   # every descriptor in that tier (bench_rules)
#   PIN=1 ./service.sh            # the load generator on CPU 0, every server
#                                 # (and redis-server) on CPU 1 (taskset)
#
# Output: results/service.txt (raw) and results/service.md (the table), or $OUT.txt and $OUT.md.
set -euo pipefail
cd "$(dirname "$0")"
. ./lib.sh
DURATION=${DURATION:-10s}
descs=$(bench_descriptors "${DESCRIPTORS:-1}")
srv=() load=()
if [[ ${PIN:-0} != 0 ]]; then
	srv=(taskset -c 1) load=(taskset -c 0)
fi
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
"${srv[@]}" "$fg" bench --serve-empty 127.0.0.1:$ep & pids+=($!); empty_pid=$!
wait_port $ep
kp=$(freeport)
"${srv[@]}" "$fg" bench --serve-empty 127.0.0.1:$kp --stock & pids+=($!); stock_pid=$!
wait_port $kp

mp=$(freeport)
"${srv[@]}" "$fg" serve --rules "$work/rules" --data "$work/mem" --grpc-addr 127.0.0.1:$mp --http-addr 127.0.0.1:0 --admin-addr 127.0.0.1:0 --log-level warn & pids+=($!); mem_pid=$!
wait_port $mp

rp=$(freeport)
"${srv[@]}" redis-server --port $rp --bind 127.0.0.1 --save "" --appendonly no --dir "$work" --logfile "$work/redis.log" & pids+=($!); redis_pid=$!
wait_port $rp
sp=$(freeport)
"${srv[@]}" "$fg" serve --rules "$work/rules" --data "$work/red" --store redis://127.0.0.1:$rp --grpc-addr 127.0.0.1:$sp --http-addr 127.0.0.1:0 --admin-addr 127.0.0.1:0 --log-level warn & pids+=($!); red_pid=$!
wait_port $sp

# The peer: envoyproxy/ratelimit on the same Redis and the same rules file
# (its format), without statsd. Its commit is pinned, so runs compare.
PEER=${PEER:-1}
ENVOY_RATELIMIT_VERSION=v1.4.1-0.20260122083618-3fb702589d36
peer=${ENVOY_RATELIMIT:-}
if [[ $PEER != 0 && -z $peer ]]; then
	if GOBIN="$work/peer" go install "github.com/envoyproxy/ratelimit/src/service_cmd@$ENVOY_RATELIMIT_VERSION" 2>"$work/peer.log"; then
		peer=$work/peer/service_cmd
	else
		echo "envoyproxy/ratelimit did not build; running without it:" >&2
		tail -5 "$work/peer.log" >&2
	fi
fi
if [[ $PEER != 0 && -n $peer ]]; then
	mkdir -p "$work/rl/ratelimit/config"
	cp "$work/rules/bench.yaml" "$work/rl/ratelimit/config/"
	pp=$(freeport)
	env USE_STATSD=false LOG_LEVEL=warn REDIS_SOCKET_TYPE=tcp REDIS_URL=127.0.0.1:$rp \
		RUNTIME_ROOT="$work/rl" RUNTIME_SUBDIRECTORY=ratelimit RUNTIME_WATCH_ROOT=false \
		GRPC_HOST=127.0.0.1 GRPC_PORT=$pp HOST=127.0.0.1 PORT="$(freeport)" DEBUG_HOST=127.0.0.1 DEBUG_PORT="$(freeport)" \
		"${srv[@]}" "$peer" >"$work/peer-run.log" 2>&1 & pids+=($!); peer_pid=$!
	wait_port $pp
fi

OUT=${OUT:-results/service}
mkdir -p "$(dirname "$OUT")"
out=$OUT.txt
: > "$out"
run() { # name addr pid args...
	local name=$1 addr=$2 pid=$3; shift 3
	echo "=== $name $*" | tee -a "$out"
	"${load[@]}" "$fg" bench --addr "$addr" --domain bench $descs --keys "${KEYS:-1000}" --warmup 2s --duration "$DURATION" --cpu-pid "$pid" --json "$@" 2>/dev/null | tee -a "$out"
}
IFS=, read -ra modes <<< "${MODES:---concurrency 64,--rate 5000}"
for mode in "${modes[@]}"; do
	if [[ ${ONLY:-} != redis ]]; then
		run empty 127.0.0.1:$ep $empty_pid $mode
		run empty-stock 127.0.0.1:$kp $stock_pid $mode
		run memory 127.0.0.1:$mp $mem_pid $mode
	fi
	run redis 127.0.0.1:$sp $red_pid $mode --store-pid $redis_pid
	if [[ -n ${peer_pid:-} ]]; then
		run envoy-ratelimit 127.0.0.1:$pp $peer_pid $mode --store-pid $redis_pid
	fi
done
go run ./cmd/servicereport "$out" > "$OUT.md"
cat "$OUT.md"

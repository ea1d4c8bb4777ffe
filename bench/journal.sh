#!/usr/bin/env bash
# journal.sh measures what the memory store's journal costs `floodgate
# serve`, with `floodgate bench`, in one run: the empty handler (the
# reference), serve on the memory store without the journal, and with it at
# each setting (written and fsynced every 100 ms, 10 ms (the default) and
# 1 ms; and written through before each answer, fsynced every 10 ms).
# Closed loop at 64 callers over 1000 keys, then open loop at RATE (5,000/s).
#
#   ./journal.sh                  # DURATION=10s by default
#   OUT=results/mine ./journal.sh # results/mine.txt and .md
#   ROUNDS=3 ./journal.sh         # every server 3 times, interleaved (a busy machine)
#
# Output: results/journal.txt (raw) and results/journal.md (the table).
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

names=() ports=() spids=()
start() { # name flags...
	local name=$1 port; shift
	port=$(freeport)
	"$fg" serve --rules "$work/rules" --data "$work/$name" --grpc-addr 127.0.0.1:$port --http-addr 127.0.0.1:0 --admin-addr 127.0.0.1:0 --log-level warn "$@" & pids+=($!)
	wait_port $port
	names+=("$name") ports+=("$port") spids+=("$!")
}
start journal-off --journal off
start sync=100ms --journal-sync 100ms
start sync=10ms --journal-sync 10ms # the default
start sync=1ms --journal-sync 1ms
start write-through --journal-sync 10ms --journal-write-through

OUT=${OUT:-results/journal}
mkdir -p "$(dirname "$OUT")"
out=$OUT.txt
: > "$out"
run() { # name addr pid args...
	local name=$1 addr=$2 pid=$3; shift 3
	echo "=== $name $*" | tee -a "$out"
	"$fg" bench --addr "$addr" --domain bench --descriptor generic_key=k --keys 1000 --warmup 2s --duration "$DURATION" --cpu-pid "$pid" --json "$@" 2>/dev/null | tee -a "$out"
}
for mode in "--concurrency 64" "--rate ${RATE:-5000}"; do
	for _ in $(seq "${ROUNDS:-1}"); do
		run empty 127.0.0.1:$ep $empty_pid $mode
		for i in "${!names[@]}"; do
			run "${names[$i]}" 127.0.0.1:${ports[$i]} ${spids[$i]} $mode
		done
	done
done
go run ./cmd/servicereport "$out" > "$OUT.md"
cat "$OUT.md"

#!/usr/bin/env bash
# service-ab.sh compares builds of `floodgate serve` on Redis, interleaved:
# each round runs the empty ShouldRateLimit handler (the gRPC stack's
# ceiling, for the ratios) and then each build on a fresh redis-server
# state, and prints requests/s, the server's CPU per decision, p50/p99,
# Redis's own CPU per decision (from /proc, over the whole run), and the
# decisions per Redis call (from INFO commandstats, warm-up included).
#
#   ./service-ab.sh OLD_BINARY NEW_BINARY            # 3 rounds, closed loop, 64 callers
#   ROUNDS=5 DURATION=6s ./service-ab.sh A B C
#   MODE="--rate 5000" ./service-ab.sh A B           # open loop
#
# The load generator and the empty handler are the first binary's.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
[ $# -ge 1 ] || { echo "usage: $0 BINARY [BINARY...]" >&2; exit 2; }
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-6s}
WARMUP=${WARMUP:-1s}
MODE=${MODE:---concurrency 64}
bins=()
for b in "$@"; do bins+=("$(realpath "$b")"); done
gen=${bins[0]}
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
secs() { python3 -c "import sys; s=sys.argv[1]; print(float(s[:-1]) * (60 if s.endswith('m') else 1))" "$1"; }

bench_rules "$work/rules"
rp=$(freeport)
redis-server --port "$rp" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" --logfile "$work/redis.log" & pids+=($!); redis_pid=$!
wait_port "$rp"
span=$(python3 -c "print($(secs "$WARMUP") + $(secs "$DURATION"))")
ticks=$(getconf CLK_TCK)

# measure ADDR PID: one bench run; prints "req/s cpu p50 p99" (µs).
measure() {
	"$gen" bench --addr "$1" --domain bench --descriptor generic_key=k --keys 1000 --warmup "$WARMUP" --duration "$DURATION" \
		$MODE --cpu-pid "$2" --json 2>/dev/null |
		python3 -c 'import json,sys; d=json.load(sys.stdin); print("%.0f %.1f %.0f %.0f" % (d["requests_per_s"], d["server_cpu"]["us_per_decision"], d["latency_us"]["p50"], d["latency_us"]["p99"]))'
}
redis_ticks() { awk '{print $14+$15}' "/proc/$redis_pid/stat"; }

printf '%-6s %-40s %9s %10s %8s %9s %9s %9s %9s %9s\n' round server "req/s" "vs empty" "cpu µs" "vs empty" "p50 µs" "p99 µs" "redis µs" "per call"
for r in $(seq "$ROUNDS"); do
	ep=$(freeport)
	"$gen" bench --serve-empty "127.0.0.1:$ep" >/dev/null 2>&1 & pids+=($!); empty_pid=$!
	wait_port "$ep"
	read -r erps ecpu ep50 ep99 < <(measure "127.0.0.1:$ep" "$empty_pid")
	kill "$empty_pid"; wait "$empty_pid" 2>/dev/null || true
	printf '%-6s %-40s %9s %10s %8s %9s %9s %9s\n' "$r" empty "$erps" 100% "$ecpu" 1.00× "$ep50" "$ep99"
	for b in "${bins[@]}"; do
		redis-cli -p "$rp" flushall >/dev/null
		redis-cli -p "$rp" config resetstat >/dev/null
		sp=$(freeport)
		"$b" serve --rules "$work/rules" --data "$work/data" --store "redis://127.0.0.1:$rp" --grpc-addr "127.0.0.1:$sp" \
			--http-addr 127.0.0.1:0 --admin-addr 127.0.0.1:0 --log-level warn & pids+=($!); serve_pid=$!
		wait_port "$sp"
		t0=$(redis_ticks)
		read -r rps cpu p50 p99 < <(measure "127.0.0.1:$sp" "$serve_pid")
		t1=$(redis_ticks)
		calls=$(redis-cli -p "$rp" info commandstats | awk -F'[=,:]' '/^cmdstat_(fcall|evalsha)[:]/ {n += $3} END {print n+0}')
		kill "$serve_pid"; wait "$serve_pid" 2>/dev/null || true
		python3 -c "
rps, cpu, erps, ecpu = $rps, $cpu, $erps, $ecpu
rc = ($t1 - $t0) / $ticks * 1e6 / (rps * $span)
print('%-6s %-40s %9.0f %9.0f%% %8.1f %8.2f× %9s %9s %9.1f %9.2f' % ('$r', '$b'[-40:], rps, 100 * rps / erps, cpu, cpu / ecpu, '$p50', '$p99', rc, rps * $span / max($calls, 1)))"
	done
done

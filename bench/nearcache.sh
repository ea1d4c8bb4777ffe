#!/usr/bin/env bash
# nearcache.sh: the Redis store's near cache on a hot key. Four
# `floodgate serve` processes on one redis-server, one key with a limit of
# LIMIT a second (a fixed window) asked at 10× that (open loop, spread over
# the four), with the near cache on and off; prints per run the decisions,
# what was admitted a second (the limit, both ways), the decisions asked of
# Redis per decision (floodgate_store_calls_total over it and
# floodgate_store_near_cache_hits_total), FCALLs per decision, and Redis's
# own CPU per decision (from /proc, the whole run).
#
#   ./nearcache.sh FLOODGATE_BINARY
#   LIMIT=1000 DURATION=10s ROUNDS=3 ./nearcache.sh ../floodgate
set -euo pipefail
. "$(dirname "$0")/lib.sh"
[ $# -eq 1 ] || { echo "usage: $0 FLOODGATE_BINARY" >&2; exit 2; }
bin=$(realpath "$1")
LIMIT=${LIMIT:-1000}
DURATION=${DURATION:-10s}
ROUNDS=${ROUNDS:-2}
rate=$((LIMIT * 10 / 4)) # per node
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

mkdir -p "$work/rules"
cat > "$work/rules/near.yaml" <<YAML
domain: near
descriptors:
  - key: hot
    rate_limit:
      unit: second
      requests_per_unit: $LIMIT
YAML
rp=$(freeport)
redis-server --port "$rp" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" --logfile "$work/redis.log" & pids+=($!); redis_pid=$!
wait_port "$rp"
ticks=$(getconf CLK_TCK)
redis_ticks() { awk '{print $14+$15}' "/proc/$redis_pid/stat"; }
metric() { curl -s "http://$1/metrics" | awk -v m="$2" '$1 == m {print $2}'; }

printf '%-6s %-6s %10s %12s %14s %14s %14s\n' round near decisions "admitted/s" "Redis/decision" "FCALL/decision" "redis µs/dec"
for r in $(seq "$ROUNDS"); do
	for near in true false; do
		redis-cli -p "$rp" flushall >/dev/null
		redis-cli -p "$rp" config resetstat >/dev/null
		grpc=() http=() serve=()
		for i in 0 1 2 3; do
			g=$(freeport) h=$(freeport)
			"$bin" serve --rules "$work/rules" --data "$work/data$i" --store "redis://127.0.0.1:$rp" --grpc-addr "127.0.0.1:$g" \
				--http-addr "127.0.0.1:$h" --admin-addr 127.0.0.1:0 --log-level warn --store-near-cache="$near" & pids+=($!); serve+=($!)
			grpc+=("127.0.0.1:$g") http+=("127.0.0.1:$h")
		done
		for i in 0 1 2 3; do wait_port "${grpc[$i]##*:}"; done
		t0=$(redis_ticks)
		benches=()
		for i in 0 1 2 3; do
			"$bin" bench --addr "${grpc[$i]}" --domain near --descriptor hot=k --rate "$rate" --warmup 1s --duration "$DURATION" --json 2>/dev/null > "$work/bench$i.json" & benches+=($!)
		done
		for p in "${benches[@]}"; do wait "$p"; done
		t1=$(redis_ticks)
		calls=0 hits=0
		for i in 0 1 2 3; do
			calls=$(python3 -c "print($calls + $(metric "${http[$i]}" floodgate_store_calls_total))")
			hits=$(python3 -c "print($hits + $(metric "${http[$i]}" floodgate_store_near_cache_hits_total))")
		done
		fcalls=$(redis-cli -p "$rp" info commandstats | awk -F'[=,:]' '/^cmdstat_(fcall|evalsha)[:]/ {n += $3} END {print n+0}')
		ok=$(python3 -c 'import glob,json,sys; print(sum(json.load(open(f))["ok"] for f in glob.glob(sys.argv[1] + "/bench*.json")))' "$work")
		for p in "${serve[@]}"; do kill "$p"; wait "$p" 2>/dev/null || true; done
		python3 -c "
calls, hits, fcalls, ok = $calls, $hits, $fcalls, $ok
dur = float('$DURATION'[:-1])
dec = calls + hits
print('%-6s %-6s %10d %12.1f %14.3f %14.3f %14.2f' % ('$r', '$near', dec, ok / dur, calls / dec, fcalls / dec, ($t1 - $t0) / $ticks * 1e6 / dec))"
	done
done

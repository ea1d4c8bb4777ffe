#!/usr/bin/env bash
# share.sh measures local share (tier: local_share, docs/REDIS.md "Local
# share") against exact mode, with 4 `floodgate serve` nodes on one
# redis-server, one hot key at 10× its limit (1,000 per 1 s window; 10,000
# requests/s offered over the 4 nodes):
#   - over-limit windows and undershoot per window (cmd/sharecheck);
#   - Redis calls per decision (the nodes' floodgate_store_calls_total);
# then the throughput of one node on one hot key with a limit it never
# reaches (`floodgate bench`, closed loop, 64 callers): local share on
# Redis, exact on Redis, and the memory store.
#
#   ./share.sh                    # DURATION=10s by default
#   DURATION=20s RATE=20000 ./share.sh
#
# Output: results/share.txt
set -euo pipefail
cd "$(dirname "$0")"
. ./lib.sh
DURATION=${DURATION:-10s}
RATE=${RATE:-10000}
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
(cd .. && go build -o "$work/floodgate" ./cmd/floodgate)
go build -o "$work/sharecheck" ./cmd/sharecheck
fg=$work/floodgate
mkdir -p "$work/rules" "$work/bench-share" "$work/bench-exact" results
cat > "$work/rules/share.yaml" <<'YAML'
domain: share
descriptors:
  - key: hot
    rate_limit: {unit: second, requests_per_unit: 1000, tier: local_share}
YAML
cat > "$work/rules/exact.yaml" <<'YAML'
domain: exact
descriptors:
  - key: hot
    rate_limit: {unit: second, requests_per_unit: 1000}
YAML
for t in share exact; do
	tier=local_share
	[[ $t == exact ]] && tier=exact
	cat > "$work/bench-$t/bench.yaml" <<YAML
domain: bench
descriptors:
  - key: generic_key
    rate_limit: {unit: second, requests_per_unit: 1000000000, tier: $tier}
YAML
done

rp=$(freeport)
redis-server --port $rp --bind 127.0.0.1 --save "" --appendonly no --dir "$work" --logfile "$work/redis.log" & pids+=($!); redis_pid=$!
wait_port $rp

# serve_node RULES_DIR STORE: starts a node, prints "grpc_port http_port pid"
serve_node() {
	local g h
	g=$(freeport) h=$(freeport)
	"$fg" serve --rules "$1" --data "$(mktemp -d -p "$work")" ${2:+--store "$2"} --grpc-addr 127.0.0.1:$g --http-addr 127.0.0.1:$h --admin-addr 127.0.0.1:0 --log-level warn &
	echo "$g $h $!"
}

out=results/share.txt
: > "$out"
grpcs=() https=()
for _ in 1 2 3 4; do
	read -r g h p < <(serve_node "$work/rules" redis://127.0.0.1:$rp)
	pids+=($p); wait_port $g
	grpcs+=(127.0.0.1:$g) https+=(127.0.0.1:$h)
done
ga=$(IFS=,; echo "${grpcs[*]}") ha=$(IFS=,; echo "${https[*]}")
for domain in exact share; do
	echo "== 4 nodes, hot key, limit 1000/s, offered $RATE/s, $DURATION: $domain" | tee -a "$out"
	"$work/sharecheck" -addrs "$ga" -metrics "$ha" -rate "$RATE" -duration "$DURATION" -limit 1000 -domain $domain | tee -a "$out"
done

for mode in memory share exact; do
	case $mode in
	memory) read -r g h p < <(serve_node "$work/bench-share" "") ;;
	share) read -r g h p < <(serve_node "$work/bench-share" redis://127.0.0.1:$rp) ;;
	exact) read -r g h p < <(serve_node "$work/bench-exact" redis://127.0.0.1:$rp) ;;
	esac
	pids+=($p); wait_port $g
	echo "== one node, one hot key never refused, closed loop 64: $mode" | tee -a "$out"
	"$fg" bench --addr 127.0.0.1:$g --duration "$DURATION" --warmup 2s --cpu-pid $p --store-pid $redis_pid --quiet --json | tee -a "$out"
	kill $p
done

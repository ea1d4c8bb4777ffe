#!/usr/bin/env bash
# share.sh measures local share (tier: local_share, docs/REDIS.md "Local
# share") against exact mode, with 4 `floodgate serve` nodes on one
# redis-server, one hot key at 10× its limit (1,000 per 1 s window; 10,000
# requests/s offered over the 4 nodes):
#   - over-limit windows and undershoot per window (cmd/sharecheck);
#   - Redis calls per decision (the nodes' floodgate_store_calls_total);
# then the throughput of one node on one hot key with a limit it never
# reaches (`floodgate bench`, closed loop, 64 callers): local share on
# Redis, exact on Redis, and the memory store (phase serve); then the same
# through `floodgate proxy` (phase proxy): wrk -t1 -c64 from one address,
# so one hot key (remote_address), to bench/cmd/upstream, the proxy's and
# redis-server's CPU per request from /proc. The serve and proxy phases
# run their three modes in turn, ROUNDS times (the host is noisy: compare
# within a round).
#
#   ./share.sh                    # DURATION=10s by default
#   DURATION=20s RATE=20000 ./share.sh
#   PHASES="serve proxy" ROUNDS=3 DURATION=8s ./share.sh
#
# Output: results/share.txt (OUT=...)
set -euo pipefail
cd "$(dirname "$0")"
. ./lib.sh
DURATION=${DURATION:-10s}
RATE=${RATE:-10000}
PHASES=${PHASES:-check serve proxy}
ROUNDS=${ROUNDS:-1}
has() { [[ " $PHASES " == *" $1 "* ]]; }
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

out=${OUT:-results/share.txt}
: > "$out"
if has check; then
	grpcs=() https=() cpids=()
	for _ in 1 2 3 4; do
		read -r g h p < <(serve_node "$work/rules" redis://127.0.0.1:$rp)
		pids+=($p) cpids+=($p); wait_port $g
		grpcs+=(127.0.0.1:$g) https+=(127.0.0.1:$h)
	done
	ga=$(IFS=,; echo "${grpcs[*]}") ha=$(IFS=,; echo "${https[*]}")
	for domain in exact share; do
		echo "== 4 nodes, hot key, limit 1000/s, offered $RATE/s, $DURATION: $domain" | tee -a "$out"
		"$work/sharecheck" -addrs "$ga" -metrics "$ha" -rate "$RATE" -duration "$DURATION" -limit 1000 -domain $domain | tee -a "$out"
	done
	kill "${cpids[@]}"
fi

if has serve; then
	for round in $(seq "$ROUNDS"); do
		for mode in memory share exact; do
			case $mode in
			memory) read -r g h p < <(serve_node "$work/bench-share" "") ;;
			share) read -r g h p < <(serve_node "$work/bench-share" redis://127.0.0.1:$rp) ;;
			exact) read -r g h p < <(serve_node "$work/bench-exact" redis://127.0.0.1:$rp) ;;
			esac
			pids+=($p); wait_port $g
			echo "== one node, one hot key never refused, closed loop 64: $mode (round $round)" | tee -a "$out"
			"$fg" bench --addr 127.0.0.1:$g --duration "$DURATION" --warmup 2s --cpu-pid $p --store-pid $redis_pid --quiet --json | tee -a "$out"
			kill $p
		done
	done
fi

# ticks PID: its user+system CPU ticks so far
ticks() { local s f; s=$(cat "/proc/$1/stat") s=${s##*) }; read -r -a f <<<"$s"; echo $((f[11] + f[12])); }

if has proxy && ! command -v wrk > /dev/null; then
	echo "share.sh: no wrk (apt-get install wrk): the proxy phase is skipped" | tee -a "$out" >&2
elif has proxy; then
	go build -o "$work/upstream" ./cmd/upstream
	up=$(freeport)
	"$work/upstream" -listen 127.0.0.1:$up > /dev/null 2>&1 & pids+=($!)
	wait_port $up
	for t in share exact; do
		tier=local_share
		[[ $t == exact ]] && tier=exact
		mkdir -p "$work/proxy-$t"
		cat > "$work/proxy-$t/proxy.yaml" <<YAML
domain: proxy
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 1000000000, tier: $tier}
http:
  - name: per-ip
    key: [remote_address]
YAML
	done
	hz=$(getconf CLK_TCK)
	for round in $(seq "$ROUNDS"); do
		for mode in memory share exact; do
			rules=$work/proxy-share store=""
			[[ $mode != memory ]] && store=redis://127.0.0.1:$rp
			[[ $mode == exact ]] && rules=$work/proxy-exact
			pp=$(freeport)
			"$fg" proxy --upstream http://127.0.0.1:$up --listen 127.0.0.1:$pp --admin-addr 127.0.0.1:0 --rules "$rules" \
				--data "$(mktemp -d -p "$work")" ${store:+--store "$store"} --log-level warn & p=$!
			pids+=($p); wait_port $pp
			wrk -t1 -c64 -d2s http://127.0.0.1:$pp/ > /dev/null
			p0=$(ticks $p) r0=$(ticks $redis_pid)
			wrk -t1 -c64 -d"$DURATION" http://127.0.0.1:$pp/ > "$work/wrk.out"
			p1=$(ticks $p) r1=$(ticks $redis_pid)
			kill $p
			awk -v mode=$mode -v round=$round -v pt=$((p1 - p0)) -v rt=$((r1 - r0)) -v hz=$hz '
				/requests in/ { n = $1 }
				/Non-2xx/ { bad = $NF }
				/Requests\/sec/ { rps = $2 }
				END { printf "== proxy, one hot key never refused, wrk -t1 -c64: %s (round %d)\nrequests/s %.0f  requests %d  non-2xx %d  proxy CPU µs/request %.1f  redis-server CPU µs/request %.2f\n", mode, round, rps, n, bad, pt / hz * 1e6 / n, rt / hz * 1e6 / n }' "$work/wrk.out" | tee -a "$out"
		done
	done
fi

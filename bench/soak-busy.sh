#!/usr/bin/env bash
# soak-busy.sh: `floodgate serve` on Redis on a busy host, before and
# after (issue 17, item 5: "a busy host looks like a dead Redis"), side by
# side in one run, so that both meet the same contention.
#
# Each side has a redis-server of its own on a free loopback port and a
# `floodgate serve --store redis://...` on it, with two rules (fail open,
# the default): a daily quota of 1000 on one key (quota=q) and a normal
# rule (generic_key, 100/s a key, over 1000 keys, never reached). Two
# `floodgate bench` loads drive each side for DURATION, open loop: 1000/s
# on the normal rule, 100/s on the quota key. `stress-ng --cpu 4` runs
# beside them (2 cores here). /readyz of each side is polled every 100 ms.
#
# Reported, per side: degraded decisions (floodgate_store_degraded_decisions_total),
# store errors and timeouts, breaker openings (after only: the metric is new),
# timeouts excused as starvation (after only), /readyz status changes,
# and over-admission: the quota key's admitted requests beyond its 1000.
#
#   ./soak-busy.sh                          # DURATION=240s, STRESS=4
#   BEFORE=/path/to/floodgate ./soak-busy.sh  # the "before" binary (default: built from /work/main's checkout, MAIN)
#   MAIN=/path/to/checkout ./soak-busy.sh     # where to build "before" from
#   DURATION=60s STRESS=0 ./soak-busy.sh      # shorter, without stress-ng
#   OUT=results/soak-busy ./soak-busy.sh      # results/soak-busy.txt (raw) and .md
#
# Not for CI: minutes long, and it loads the machine on purpose. Every
# process it starts is stopped when it exits.
set -euo pipefail
cd "$(dirname "$0")"
. ./lib.sh
DURATION=${DURATION:-240s}
STRESS=${STRESS:-4}
MAIN=${MAIN:-/work/main}
OUT=${OUT:-results/soak-busy}
work=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT

(cd .. && go build -o "$work/after" ./cmd/floodgate)
if [ -n "${BEFORE:-}" ]; then
	cp "$BEFORE" "$work/before"
else
	(cd "$MAIN" && go build -o "$work/before" ./cmd/floodgate)
fi

mkdir -p "$work/rules"
cat > "$work/rules/soak.yaml" <<'YAML'
domain: soak
descriptors:
  - key: quota
    rate_limit:
      unit: day
      requests_per_unit: 1000
  - key: generic_key
    rate_limit:
      unit: second
      requests_per_unit: 100
YAML

# start_side NAME: a redis-server and a floodgate serve on it; sets
# ${NAME}_grpc and ${NAME}_http.
start_side() {
	local name=$1 rp gp hp
	rp=$(freeport)
	redis-server --port "$rp" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" --logfile "$work/redis-$name.log" &
	pids+=($!)
	wait_port "$rp"
	gp=$(freeport) hp=$(freeport)
	"$work/$name" serve --rules "$work/rules" --data "$work/data-$name" --store "redis://127.0.0.1:$rp" \
		--grpc-addr "127.0.0.1:$gp" --http-addr "127.0.0.1:$hp" --admin-addr 127.0.0.1:0 --log-level error \
		2> "$work/serve-$name.log" &
	pids+=($!)
	wait_port "$gp"
	wait_port "$hp"
	eval "${name}_grpc=127.0.0.1:$gp ${name}_http=127.0.0.1:$hp"
}
start_side before
start_side after

# poll_ready ADDR FILE: /readyz's status every 100 ms, one a line, until killed.
poll_ready() {
	while :; do
		curl -s -o /dev/null -m 1 -w '%{http_code}\n' "http://$1/readyz" >> "$2" || echo 000 >> "$2"
		sleep 0.1
	done
}

if [[ $STRESS != 0 ]]; then
	stress-ng --cpu "$STRESS" --timeout 0 >/dev/null 2>&1 &
	pids+=($!)
fi
for side in before after; do
	grpc=${side}_grpc http=${side}_http
	poll_ready "${!http}" "$work/ready-$side" &
	pids+=($!)
	"$work/after" bench --addr "${!grpc}" --domain soak --descriptor generic_key=k --keys 1000 \
		--rate 1000 --warmup 0s --duration "$DURATION" --quiet --json > "$work/normal-$side.json" &
	pids+=($!)
	"$work/after" bench --addr "${!grpc}" --domain soak --descriptor quota=q \
		--rate 100 --warmup 0s --duration "$DURATION" --quiet --json > "$work/quota-$side.json" &
	pids+=($!)
done
loadavg_start=$(cut -d' ' -f1-3 /proc/loadavg)
# wait for the four loads (the last four-plus pids are the loads and pollers)
for side in before after; do
	while [ ! -s "$work/quota-$side.json" ] || [ ! -s "$work/normal-$side.json" ]; do sleep 1; done
done
loadavg_end=$(cut -d' ' -f1-3 /proc/loadavg)

metric() { curl -s "http://$1/metrics" | awk -v n="$2" '$1 == n { print $2; found=1 } END { if (!found) print "-" }'; }
flaps() { awk 'NR > 1 && $1 != prev { n++ } { prev = $1 } END { print n + 0 }' "$1"; }
unready() { awk '$1 == 503 { n++ } END { print n + 0 }' "$1"; }
unanswered() { awk '$1 != 200 && $1 != 503 { n++ } END { print n + 0 }' "$1"; }
polls() { wc -l < "$1"; }
json() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"; }

mkdir -p "$(dirname "$OUT")"
{
	echo "soak-busy $(date -u +%Y-%m-%dT%H:%M:%SZ) duration=$DURATION stress-ng --cpu $STRESS; load average at start $loadavg_start, at end $loadavg_end; $(nproc) CPUs"
	for side in before after; do
		http=${side}_http
		echo "== $side"
		for m in floodgate_store_calls_total floodgate_store_degraded_decisions_total floodgate_store_errors_total floodgate_store_timeouts_total \
			floodgate_store_breaker_opens_total floodgate_store_starved_timeouts_total floodgate_store_timeout_seconds; do
			echo "$m $(metric "${!http}" $m)"
		done
		echo "readyz_polls $(polls "$work/ready-$side") readyz_changes $(flaps "$work/ready-$side") readyz_503 $(unready "$work/ready-$side") readyz_unanswered_in_1s $(unanswered "$work/ready-$side")"
		echo "normal $(cat "$work/normal-$side.json")"
		echo "quota $(cat "$work/quota-$side.json")"
	done
} > "$OUT.txt"

{
	echo "| | before | after |"
	echo "| --- | ---: | ---: |"
	row() { echo "| $1 | $2 | $3 |"; }
	b=$before_http a=$after_http
	row "decisions asked of Redis" "$(metric $b floodgate_store_calls_total)" "$(metric $a floodgate_store_calls_total)"
	row "degraded decisions" "$(metric $b floodgate_store_degraded_decisions_total)" "$(metric $a floodgate_store_degraded_decisions_total)"
	row "store errors (timeouts)" "$(metric $b floodgate_store_errors_total) ($(metric $b floodgate_store_timeouts_total))" "$(metric $a floodgate_store_errors_total) ($(metric $a floodgate_store_timeouts_total))"
	row "timeouts excused as starvation" "-" "$(metric $a floodgate_store_starved_timeouts_total)"
	row "breaker openings" "-" "$(metric $a floodgate_store_breaker_opens_total)"
	row "/readyz changes (polls every 100 ms)" "$(flaps "$work/ready-before") of $(polls "$work/ready-before")" "$(flaps "$work/ready-after") of $(polls "$work/ready-after")"
	row "/readyz polls answered 503" "$(unready "$work/ready-before")" "$(unready "$work/ready-after")"
	row "/readyz polls unanswered in 1 s (counted as changes too)" "$(unanswered "$work/ready-before")" "$(unanswered "$work/ready-after")"
	qb=$(json "$work/quota-before.json" ok) qa=$(json "$work/quota-after.json" ok)
	row "quota key (1000/day): admitted of offered" "$qb of $(json "$work/quota-before.json" requests)" "$qa of $(json "$work/quota-after.json" requests)"
	row "over-admission (admitted beyond 1000)" "$((qb > 1000 ? qb - 1000 : 0))" "$((qa > 1000 ? qa - 1000 : 0))"
	row "normal rule: requests answered" "$(json "$work/normal-before.json" requests)" "$(json "$work/normal-after.json" requests)"
	echo
	echo "duration $DURATION, stress-ng --cpu $STRESS, load average $loadavg_start at start, $loadavg_end at end, $(nproc) CPUs"
} > "$OUT.md"
cat "$OUT.md"

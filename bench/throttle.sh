#!/usr/bin/env bash
# throttle.sh runs the server throttler's overload workload (issue 21)
# against Floodgate's throttle and its peers in one run, interleaved:
# go-zero's adaptive shedder, kratos BBR, go-concurrency-limits
# (Gradient2, partitioned by criticality) and sentinel-golang's system
# adaptive rule (BBR past a CPU usage). See cmd/throttlecmp.
#
#   ./throttle.sh                 # ROUNDS=3, LOAD=6s
#   ROUNDS=5 ./throttle.sh
#
# The report (each run, then medians and Floodgate's ratios) goes to
# stdout and results/throttle-peers.txt, with the load average before
# and after.
set -euo pipefail
cd "$(dirname "$0")"
ROUNDS=${ROUNDS:-3}
LOAD=${LOAD:-6s}
bin=$(mktemp -d)/throttlecmp
trap 'rm -rf "$(dirname "$bin")"' EXIT
go build -o "$bin" ./cmd/throttlecmp
{
	echo "# $(date -u +%FT%TZ) $(nproc) CPUs; load before: $(cut -d' ' -f1-3 /proc/loadavg)"
	echo "# ROUNDS=$ROUNDS LOAD=$LOAD ./throttle.sh"
	"$bin" -rounds "$ROUNDS" -load "$LOAD"
	echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee results/throttle-peers.txt

#!/usr/bin/env bash
# proxy.sh measures an HTTP rate-limiting reverse proxy's cost, in one run:
#
#   direct     wrk -> upstream                     (the ceiling of this setup)
#   nginx      wrk -> nginx (limit_req) -> upstream
#   floodgate  wrk -> floodgate proxy   -> upstream
#
# The upstream is bench/cmd/upstream (200 "ok\n" to GET /). Both limiters
# key on the client address (nginx: limit_req_zone $binary_remote_addr;
# floodgate: a remote_address descriptor); wrk connects from 127.0.0.1, so
# every request counts against one key. Two phases:
#
#   pass  limit RATE_PASS r/s (default 1,000,000): nothing is refused, so the
#         figures are the proxy's overhead (duration DURATION);
#   deny  limit RATE_DENY r/s (default 100): nearly every request is refused
#         (429), the refusal path's throughput (duration DENY_DURATION).
#
# nginx uses `limit_req zone=... burst=RATE nodelay` (burst = the rate, as
# a floodgate limit's default capacity), `limit_req_status 429`, refusals
# logged below the error log's level (nginx logs each one at `error` by
# default, which would make it write a line per refused request), proxy
# HTTP/1.1 with an upstream keepalive pool (keepalive CONNS), and
# keepalive_requests 1,000,000 on both sides (the default, 1000, would
# reconnect every 1000 requests; Go's server and wrk do not). floodgate
# uses the rule below with its default algorithm (a fixed window of one
# second).
#
# CPU pinning (taskset; the CPUs are those this script may use, sorted):
#   LIMITER_CPUS  the last WORKERS CPUs (default: WORKERS=1, so CPU 1 on a
#                 2-core machine): nginx (master and worker_processes WORKERS)
#                 and floodgate (GOMAXPROCS=WORKERS) run here, one at a time;
#   LOAD_CPUS     the other CPUs (CPU 0): wrk and the upstream share them
#                 (the upstream's GOMAXPROCS is their number).
# So in the direct run the limiter CPUs are idle, and wrk and the upstream
# are limited by their own CPUs in every run; the "limiter CPU" columns
# say whether the limiter or the load side was the bottleneck (a limiter
# near WORKERS cores busy is saturated).
#
# When run as root, nginx and floodgate run as nobody (setpriv), from a
# temporary directory with their own configuration, pid and log files,
# on free loopback ports; everything this script starts is stopped on exit.
#
#   ./proxy.sh                          # DURATION=10s, WORKERS=1, wrk -t1 -c64
#   DURATION=5s ./proxy.sh
#   WORKERS=1 THREADS=1 CONNS=64 DENY_DURATION=5s WARMUP=1s ./proxy.sh
#   LIMITER_CPUS=2,3 LOAD_CPUS=0,1 WORKERS=2 ./proxy.sh
#   FLOODGATE_ARGS='--some-flag x' ./proxy.sh   # extra flags for floodgate proxy
#   FLOODGATE_BIN=/path/to/floodgate ./proxy.sh # a prebuilt binary instead of go build ../cmd/floodgate
#
# If the floodgate binary does not build or has no proxy subcommand
# (`floodgate proxy --help` fails), the script says so and runs the others.
#
# Output: results/proxy-DATE.txt (wrk's raw output) and results/proxy-DATE.md
# (the environment and the tables, by go run ./cmd/proxyreport).
set -euo pipefail
cd "$(dirname "$0")"

DURATION=${DURATION:-10s}
DENY_DURATION=${DENY_DURATION:-5s}
WARMUP=${WARMUP:-1s}
WORKERS=${WORKERS:-1}
THREADS=${THREADS:-1}
CONNS=${CONNS:-64}
RATE_PASS=${RATE_PASS:-1000000}
RATE_DENY=${RATE_DENY:-100}
FLOODGATE_ARGS=${FLOODGATE_ARGS:-}
OUT=${OUT:-results/proxy-$(date -u +%Y-%m-%d)}

# --- CPUs -----------------------------------------------------------------
expand_cpus() { # "0-2,5" -> "0 1 2 5"
	local part a b out=()
	IFS=, read -r -a parts <<<"$1"
	for part in "${parts[@]}"; do
		if [[ $part == *-* ]]; then
			a=${part%-*} b=${part#*-}
			for ((i = a; i <= b; i++)); do out+=("$i"); done
		else
			out+=("$part")
		fi
	done
	echo "${out[@]}"
}
read -r -a cpus <<<"$(expand_cpus "$(taskset -cp $$ | sed 's/.*: *//')")"
ncpu=${#cpus[@]}
if [[ -z ${LIMITER_CPUS:-} || -z ${LOAD_CPUS:-} ]]; then
	if ((WORKERS < 1 || WORKERS >= ncpu)); then
		echo "proxy.sh: WORKERS=$WORKERS leaves no CPU for wrk and the upstream among the $ncpu CPUs (${cpus[*]}); set LIMITER_CPUS and LOAD_CPUS" >&2
		exit 2
	fi
	LOAD_CPUS=$(IFS=,; echo "${cpus[*]:0:ncpu-WORKERS}")
	LIMITER_CPUS=$(IFS=,; echo "${cpus[*]:ncpu-WORKERS}")
fi
read -r -a load_list <<<"$(expand_cpus "$LOAD_CPUS")"
LOAD_PROCS=${#load_list[@]}

# --- processes ------------------------------------------------------------
work=$(mktemp -d)
chmod 755 "$work"
pids=()
proc_state() { local s; s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1; s=${s##*) }; echo "${s%% *}"; }
alive() { local st; st=$(proc_state "$1") && [[ $st != Z ]]; }
stop() { # pid: SIGTERM, then SIGKILL (with its children) after 5 s
	local p=$1 kids
	kids=$(ps -o pid= --ppid "$p" 2>/dev/null | tr '\n' ' ' || true)
	kill -TERM "$p" 2>/dev/null || true
	for _ in $(seq 50); do alive "$p" || break; sleep 0.1; done
	# shellcheck disable=SC2086
	if alive "$p"; then kill -KILL "$p" $kids 2>/dev/null || true; fi
	wait "$p" 2>/dev/null || true
}
cleanup() {
	local p
	for p in "${pids[@]}"; do stop "$p"; done
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

freeport() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }

wait_http() { # url pid log: until the port answers HTTP (any status), 15 s at most
	local url=$1 pid=$2 log=$3 code
	for _ in $(seq 150); do
		if ! alive "$pid"; then
			echo "proxy.sh: the process behind $url exited; its log:" >&2
			cat "$log" >&2 || true
			exit 1
		fi
		code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 1 "$url" || true)
		[[ $code != 000 ]] && return 0
		sleep 0.1
	done
	echo "proxy.sh: $url did not answer within 15 s; log:" >&2
	cat "$log" >&2 || true
	exit 1
}

# nginx (and floodgate) run unprivileged: as nobody when this script is root.
unpriv=()
if [[ $(id -u) == 0 ]]; then
	unpriv=(setpriv --reuid=65534 --regid=65534 --clear-groups)
fi
own() { if [[ $(id -u) == 0 ]]; then chown -R 65534:65534 "$@"; fi; }

# --- builds ---------------------------------------------------------------
go build -o "$work/upstream" ./cmd/upstream
go build -o "$work/proxyreport" ./cmd/proxyreport
fg=$work/floodgate
fg_skip=""
if [[ -n ${FLOODGATE_BIN:-} ]]; then
	cp "$FLOODGATE_BIN" "$fg" # readable by nobody, like the build
elif ! (cd .. && go build -o "$fg" ./cmd/floodgate) >"$work/fgbuild.log" 2>&1; then
	fg_skip="floodgate did not build"
	echo "proxy.sh: $fg_skip; skipping floodgate:" >&2
	cat "$work/fgbuild.log" >&2
elif ! "$fg" proxy --help >"$work/fghelp.txt" 2>&1; then
	fg_skip="floodgate proxy not available"
	echo "proxy.sh: $fg_skip (floodgate proxy --help failed); skipping floodgate" >&2
fi

# --- upstream ---------------------------------------------------------------
up_port=$(freeport)
GOMAXPROCS=$LOAD_PROCS taskset -c "$LOAD_CPUS" "$work/upstream" -listen "127.0.0.1:$up_port" >"$work/upstream.log" 2>&1 &
up_pid=$!
pids+=("$up_pid")
wait_http "http://127.0.0.1:$up_port/" "$up_pid" "$work/upstream.log"

# --- nginx ------------------------------------------------------------------
nginx_pid=""
start_nginx() { # rate: sets nginx_pid, nginx_port
	local rate=$1 d=$work/nginx
	rm -rf "$d"
	mkdir -p "$d"
	nginx_port=$(freeport)
	cat >"$d/nginx.conf" <<EOF
daemon off;
master_process on;
worker_processes $WORKERS;
pid $d/nginx.pid;
error_log $d/error.log warn;
events {
    worker_connections 4096;
}
http {
    access_log off;
    client_body_temp_path $d/body;
    proxy_temp_path $d/proxy;
    fastcgi_temp_path $d/fastcgi;
    uwsgi_temp_path $d/uwsgi;
    scgi_temp_path $d/scgi;

    limit_req_zone \$binary_remote_addr zone=perip:10m rate=${rate}r/s;
    limit_req_status 429;
    limit_req_log_level info;

    upstream backend {
        server 127.0.0.1:$up_port;
        keepalive $CONNS;
        keepalive_requests 1000000;
    }
    server {
        listen 127.0.0.1:$nginx_port backlog=4096;
        keepalive_requests 1000000;
        location / {
            limit_req zone=perip burst=$rate nodelay;
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
}
EOF
	own "$d"
	taskset -c "$LIMITER_CPUS" "${unpriv[@]}" nginx -p "$d" -c "$d/nginx.conf" >"$d/stderr.log" 2>&1 &
	nginx_pid=$!
	pids+=("$nginx_pid")
	wait_http "http://127.0.0.1:$nginx_port/" "$nginx_pid" "$d/stderr.log"
	# nginx writes to its error log when it fails to start, not to stderr
	if ! alive "$nginx_pid"; then cat "$d/error.log" >&2; exit 1; fi
}

# --- floodgate ----------------------------------------------------------------
fg_pid=""
start_floodgate() { # rate: sets fg_pid, fg_port
	local rate=$1 d=$work/fg
	rm -rf "$d"
	mkdir -p "$d/rules" "$d/data"
	cat >"$d/rules/proxy.yaml" <<EOF
domain: proxy
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: $rate}
http:
  - name: per-ip
    key: [remote_address]
EOF
	own "$d"
	fg_port=$(freeport)
	local extra=()
	# shellcheck disable=SC2206
	[[ -n $FLOODGATE_ARGS ]] && extra=($FLOODGATE_ARGS)
	# FLOODGATE_LOG_LEVEL and FLOODGATE_DATA are floodgate serve's
	# environment settings; harmless if proxy does not read them.
	(cd "$d" && exec env GOMAXPROCS="$WORKERS" FLOODGATE_LOG_LEVEL=warn FLOODGATE_DATA="$d/data" \
		taskset -c "$LIMITER_CPUS" "${unpriv[@]}" "$fg" proxy \
		--upstream "http://127.0.0.1:$up_port" --listen "127.0.0.1:$fg_port" \
		--admin-addr 127.0.0.1:0 --rules "$d/rules" "${extra[@]}") >"$work/fg.log" 2>&1 &
	fg_pid=$!
	pids+=("$fg_pid")
	wait_http "http://127.0.0.1:$fg_port/" "$fg_pid" "$work/fg.log"
}

forget() { # pid: no longer ours to stop
	local p keep=()
	for p in "${pids[@]}"; do [[ $p != "$1" ]] && keep+=("$p"); done
	pids=("${keep[@]}")
}
stop_limiter() { # pid
	stop "$1"
	forget "$1"
}

# --- measuring ------------------------------------------------------------------
hz=$(getconf CLK_TCK)
cpu_ticks() { # pid: user+system ticks of pid and its children (nginx's workers)
	local t=0 p s f
	for p in "$1" $(ps -o pid= --ppid "$1" 2>/dev/null || true); do
		s=$(cat "/proc/$p/stat" 2>/dev/null) || continue
		s=${s##*) }
		read -r -a f <<<"$s"
		t=$((t + f[11] + f[12]))
	done
	echo "$t"
}

mkdir -p "$(dirname "$OUT")"
raw=$OUT.txt
: >"$raw"
run_wrk() { # wrk args: output in $work/wrk.out. In the background, so that a
	# signal to this script stops it at once (bash runs traps only between
	# foreground commands).
	taskset -c "$LOAD_CPUS" wrk -t"$THREADS" -c"$CONNS" "$@" >"$work/wrk.out" 2>&1 &
	local w=$!
	pids+=("$w")
	if ! wait "$w"; then
		echo "proxy.sh: wrk $* failed:" >&2
		cat "$work/wrk.out" >&2
		exit 1
	fi
	forget "$w"
}
measure() { # target phase rate duration url limiter-pid
	local target=$1 phase=$2 rate=$3 dur=$4 url=$5 lpid=$6 before after
	echo "=== $target $phase rate=$rate burst=$rate duration=$dur url=$url" | tee -a "$raw"
	run_wrk -d"$WARMUP" "$url"
	[[ -n $lpid ]] && before=$(cpu_ticks "$lpid")
	run_wrk -d"$dur" --latency "$url"
	tee -a "$raw" <"$work/wrk.out"
	if [[ -n $lpid ]]; then
		after=$(cpu_ticks "$lpid")
		awk -v t=$((after - before)) -v hz="$hz" 'BEGIN { printf "limiter_cpu_s: %.2f\n", t / hz }' | tee -a "$raw"
	fi
}
skipped() { # target phase rate reason
	echo "=== $1 $2 rate=$3 burst=$3 skipped=$4" | tee -a "$raw"
}

measure direct pass - "$DURATION" "http://127.0.0.1:$up_port/" ""
for phase in pass deny; do
	if [[ $phase == pass ]]; then rate=$RATE_PASS dur=$DURATION; else rate=$RATE_DENY dur=$DENY_DURATION; fi
	start_nginx "$rate"
	measure nginx "$phase" "$rate" "$dur" "http://127.0.0.1:$nginx_port/" "$nginx_pid"
	stop_limiter "$nginx_pid"
	if [[ -n $fg_skip ]]; then
		skipped floodgate "$phase" "$rate" "$fg_skip"
	else
		start_floodgate "$rate"
		measure floodgate "$phase" "$rate" "$dur" "http://127.0.0.1:$fg_port/" "$fg_pid"
		stop_limiter "$fg_pid"
	fi
done

# --- report ---------------------------------------------------------------------
engine_rev=$(git -C .. rev-parse --short HEAD)
if [[ -n ${FLOODGATE_BIN:-} ]]; then
	engine_rev="$FLOODGATE_BIN: $("$fg" version 2>&1 | head -1 || true)"
elif [[ -n $(git -C .. status --porcelain -- . ':!bench' ':!docs' 2>/dev/null || true) ]]; then
	engine_rev="$engine_rev + uncommitted changes"
fi
{
	echo "# HTTP proxy benchmark: direct, nginx limit_req, floodgate proxy"
	echo
	echo '```'
	echo "date:        $(date -u +%Y-%m-%dT%H:%M:%SZ)"
	echo "cpu:         $ncpu × $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
	echo "kernel:      $(uname -sr)"
	echo "nginx:       $(nginx -v 2>&1 | sed 's/^nginx version: //')"
	echo "wrk:         $(wrk -v 2>&1 | head -1 | awk '{print $2}')"
	echo "go:          $(go version | awk '{print $3}')"
	echo "floodgate:   $engine_rev${fg_skip:+ ($fg_skip)}"
	echo "load:        wrk -t$THREADS -c$CONNS --latency, $DURATION (pass), $DENY_DURATION (deny), after a $WARMUP warm-up; one client address"
	echo "pinning:     limiter (nginx master + $WORKERS worker(s), floodgate GOMAXPROCS=$WORKERS) on CPU $LIMITER_CPUS; wrk and upstream (GOMAXPROCS=$LOAD_PROCS) on CPU $LOAD_CPUS"
	echo "limits:      pass $RATE_PASS r/s, deny $RATE_DENY r/s (nginx burst = rate, nodelay, status 429; floodgate fixed window of 1 s)"
	echo '```'
	echo
	"$work/proxyreport" "$raw"
	echo "ratio vs nginx: requests/s over nginx's in the same phase. limiter CPU: the"
	echo "proxy's user+system CPU time during the measured run over its length (cores),"
	echo "and per request; near $WORKERS core(s) means the limiter was the bottleneck."
	echo "Raw wrk output: $(basename "$raw")."
} >"$OUT.md"
echo
cat "$OUT.md"
echo "wrote $OUT.txt and $OUT.md" >&2

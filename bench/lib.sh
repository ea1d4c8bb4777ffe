# lib.sh: what the benchmark scripts share (sourced, not run).

# freeport prints a free loopback TCP port.
freeport() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }

# wait_port waits until something listens on loopback port $1 (10 s at most).
wait_port() { for _ in $(seq 100); do (echo > /dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.1; done; echo "port $1 never opened" >&2; exit 1; }

# bench_rules writes the benchmark's rules file into directory $1: three
# descriptors (generic_key, user, route), each a limit no request reaches,
# so every decision is made in full and admitted. A request names one
# (bench_descriptors 1) or all three (bench_descriptors 3). With TIER set
# (local_share, write_back, exact), each descriptor's rate_limit names it
# (Floodgate's extension field: run such a file with PEER=0, since
# envoyproxy/ratelimit does not know it).
bench_rules() {
	mkdir -p "$1"
	bench_rules_file > "$1/bench.yaml"
	if [[ -n ${TIER:-} ]]; then
		sed -i "s/^\(      requests_per_unit: .*\)$/\1\n      tier: $TIER/" "$1/bench.yaml"
	fi
}

bench_rules_file() {
	cat <<'YAML'
domain: bench
descriptors:
  - key: generic_key
    rate_limit:
      unit: second
      requests_per_unit: 1000000000
  - key: user
    rate_limit:
      unit: second
      requests_per_unit: 1000000000
  - key: route
    rate_limit:
      unit: second
      requests_per_unit: 1000000000
YAML
}

# bench_descriptors prints floodgate bench's --descriptor flags for a
# request of $1 descriptors (1 or 3) of bench_rules' file.
bench_descriptors() {
	case $1 in
	1) echo "--descriptor generic_key=k" ;;
	3) echo "--descriptor generic_key=k --descriptor user=u --descriptor route=r" ;;
	*) echo "bench_descriptors: 1 or 3 descriptors, not $1" >&2; return 1 ;;
	esac
}

# bench_src prints the directory to build this benchmark module from: this
# one ($1), or, when REF ($2) is set, a copy of the module placed beside the
# engine as committed at REF (exported with git archive into $3), so that
# its replace => ../ points at that engine.
bench_src() {
	local here=$1 ref=$2 work=$3
	if [[ -z $ref ]]; then
		echo "$here"
		return
	fi
	git -C "$here/.." archive "$ref" | tar -x -C "$work"
	rm -rf "$work/bench"
	mkdir "$work/bench"
	(cd "$here" && cp -r go.mod go.sum ./*.go cmd internal "$work/bench/")
	echo "$work/bench"
}

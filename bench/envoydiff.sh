#!/usr/bin/env bash
# envoydiff.sh: a differential check of `floodgate serve` against
# envoyproxy/ratelimit. Builds floodgate (this tree), envoyproxy/ratelimit's
# service_cmd and config_check_cmd at the commit service.sh pins, and
# bench/cmd/envoydiff, which starts a private redis-server on a free port,
# both services on the same rules (envoyproxy/ratelimit's own test and
# example files, read from its module source, unmodified) and compares
# their answers to the same requests. Prints the report and its summary.
#
#   ./envoydiff.sh                         # results/envoydiff.txt
#   OUT=results/mine.txt ./envoydiff.sh
#   STORE=memory ./envoydiff.sh            # floodgate on its memory store
#   ARGS='-v -group edge' ./envoydiff.sh   # every step, one group
#   ENVOY_RATELIMIT=/path/service_cmd ENVOY_RATELIMIT_CHECK=/path/config_check_cmd ./envoydiff.sh
#
# Exit status: 0 when every difference is a documented one, 1 otherwise.
set -euo pipefail
cd "$(dirname "$0")"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

ENVOY_RATELIMIT_VERSION=v1.4.1-0.20260122083618-3fb702589d36
mod=github.com/envoyproxy/ratelimit
src=$(cd "$work" && go mod download -json "$mod@$ENVOY_RATELIMIT_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[[ -d $src ]] || { echo "envoydiff.sh: could not download $mod@$ENVOY_RATELIMIT_VERSION" >&2; exit 2; }

(cd .. && go build -o "$work/floodgate" ./cmd/floodgate)
go build -o "$work/envoydiff" ./cmd/envoydiff
peer=${ENVOY_RATELIMIT:-}
check=${ENVOY_RATELIMIT_CHECK:-}
if [[ -z $peer || -z $check ]]; then
	GOBIN="$work/peer" go install "$mod/src/service_cmd@$ENVOY_RATELIMIT_VERSION" "$mod/src/config_check_cmd@$ENVOY_RATELIMIT_VERSION"
	peer=${peer:-$work/peer/service_cmd}
	check=${check:-$work/peer/config_check_cmd}
fi

OUT=${OUT:-results/envoydiff.txt}
mkdir -p "$(dirname "$OUT")"
# shellcheck disable=SC2086
"$work/envoydiff" -peer "$peer" -config-check "$check" -floodgate "$work/floodgate" -src "$src" \
	-store "${STORE:-redis}" -out "$OUT" ${ARGS:-} >/dev/null && rc=0 || rc=$?
cat "$OUT"
exit $rc

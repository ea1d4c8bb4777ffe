#!/usr/bin/env bash
# genproto.sh regenerates the Go code of the .proto files under proto/.
# It needs protoc (Debian's protobuf-compiler) and the two Go plugins at
# the versions below, which it installs into a private GOBIN when missing.
#
#   scripts/genproto.sh          # rewrite the generated files
#   scripts/genproto.sh -check   # fail if they are not current (CI)
set -euo pipefail
cd "$(dirname "$0")/.."

PROTOC_GEN_GO=v1.36.12
PROTOC_GEN_GO_GRPC=v1.6.0

bin=${GENPROTO_BIN:-$HOME/.cache/floodgate-genproto/bin}
mkdir -p "$bin"
if [[ ! -x $bin/protoc-gen-go-$PROTOC_GEN_GO ]]; then
	GOFLAGS= GOBIN="$bin" go install "google.golang.org/protobuf/cmd/protoc-gen-go@$PROTOC_GEN_GO"
	mv "$bin/protoc-gen-go" "$bin/protoc-gen-go-$PROTOC_GEN_GO"
fi
if [[ ! -x $bin/protoc-gen-go-grpc-$PROTOC_GEN_GO_GRPC ]]; then
	GOFLAGS= GOBIN="$bin" go install "google.golang.org/grpc/cmd/protoc-gen-go-grpc@$PROTOC_GEN_GO_GRPC"
	mv "$bin/protoc-gen-go-grpc" "$bin/protoc-gen-go-grpc-$PROTOC_GEN_GO_GRPC"
fi

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
protoc -I proto \
	--plugin=protoc-gen-go="$bin/protoc-gen-go-$PROTOC_GEN_GO" \
	--plugin=protoc-gen-go-grpc="$bin/protoc-gen-go-grpc-$PROTOC_GEN_GO_GRPC" \
	--go_out="$out" --go_opt=module=github.com/floodgate/floodgate \
	--go-grpc_out="$out" --go-grpc_opt=module=github.com/floodgate/floodgate \
	$(cd proto && find . -name "*.proto" | sed "s|^./||" | sort)

# The generated header names protoc's version; the check compares the rest,
# so a machine with another protoc release still agrees.
strip() { sed -E '/^\/\/[[:space:]]+(- )?protoc[[:space:]]+v?[0-9]/d' "$1"; }
status=0
while IFS= read -r f; do
	rel=${f#"$out"/}
	if [[ ${1:-} == -check ]]; then
		if [[ ! -f $rel ]] || ! diff -q <(strip "$f") <(strip "$rel") >/dev/null; then
			echo "genproto: $rel is not current; run scripts/genproto.sh" >&2
			status=1
		fi
	else
		mkdir -p "$(dirname "$rel")"
		cp "$f" "$rel"
	fi
done < <(find "$out" -name '*.go' | sort)
exit $status

#!/usr/bin/env bash
# gen.sh regenerates transport/pb from transport/pb/strata.proto.
#
# Needs protoc (Debian: apt-get update && apt-get install -y protobuf-compiler;
# generated with libprotoc 3.21.12) and installs the Go plugins, pinned, from
# the module proxy into a private GOBIN. Run from anywhere:
#
#	transport/gen.sh
#
# The generated files are committed; CI need not run this.
set -euo pipefail

PROTOC_GEN_GO=google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
# v1.6.x emits SupportPackageIsVersion9 code, which grpc >= v1.64 (we use
# v1.85.0) supports.
PROTOC_GEN_GO_GRPC=google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2

here=$(cd "$(dirname "$0")" && pwd)
gobin=${STRATA_PROTOC_GOBIN:-${TMPDIR:-/tmp}/strata-protoc-gobin}

command -v protoc >/dev/null || {
	echo "gen.sh: protoc not found; apt-get install -y protobuf-compiler" >&2
	exit 1
}
mkdir -p "$gobin"
# GOFLAGS cleared so a -mod setting of the enclosing module cannot interfere.
GOBIN=$gobin GOFLAGS= go install "$PROTOC_GEN_GO"
GOBIN=$gobin GOFLAGS= go install "$PROTOC_GEN_GO_GRPC"

cd "$here/pb"
PATH=$gobin:$PATH protoc \
	--proto_path=. \
	--go_out=. --go_opt=paths=source_relative \
	--go-grpc_out=. --go-grpc_opt=paths=source_relative \
	strata.proto
echo "gen.sh: regenerated $here/pb"

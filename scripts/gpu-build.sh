#!/bin/sh
# gpu-build.sh: cross-build, on a machine with Go, what scripts/gpu-check.sh
# runs on a GPU machine that has no Go (issue 16): stripped, CGO_ENABLED=0
# linux/amd64 binaries, gzipped into .gpu/ (ignored by git; carried along
# with the tree, 64 MiB at most).
#
#	scripts/gpu-build.sh            # then: scripts/gpu-check.sh LOGDIR on the GPU machine
set -eu
cd "$(dirname "$0")/.."
out=.gpu
rm -rf "$out"
mkdir -p "$out"
export CGO_ENABLED=0 GOOS=linux GOARCH=amd64
flags='-s -w'
go test -c -ldflags="$flags" -o "$out/cuda.test" ./model/cuda
go build -ldflags="$flags" -o "$out/coordinator" ./cmd/coordinator
for f in "$out"/*; do gzip -9 "$f"; done
git rev-parse HEAD > "$out/COMMIT"
du -ch "$out"/* | tail -1
total=$(du -cb "$out"/* | tail -1 | cut -f1)
if [ "$total" -gt $((60 << 20)) ]; then
	echo "gpu-build: $out holds $total bytes, over the 60 MiB left for it in the 64 MiB carried" >&2
	exit 1
fi

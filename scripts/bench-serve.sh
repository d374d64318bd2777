#!/bin/sh
# Reproduces the serving benchmark of issue 6: builds the coordinator, writes
# the ~110M-parameter random Q8_0 model once (to $TMPDIR), and runs
# `coordinator serve --local-shards 1` and `2` under loadgen (34-token
# prompts, 64 output tokens, 1/4/8 streams, then the abort churn).
# Extra arguments go to scripts/benchserve (e.g. --requests-per-stream 10).
set -eu
cd "$(dirname "$0")/.."
bin="${TMPDIR:-/tmp}/strata-bench-coordinator"
go build -o "$bin" ./cmd/coordinator
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo '?')" >&2
go run ./scripts/benchserve --coordinator "$bin" "$@"
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo '?')" >&2

#!/bin/bash
# Pipeline scaling (issue 4): one `shard join` process pinned to one core
# against two shard processes pinned to one core each, under the same load.
# LOADS lists loadgen loads as clients:prompt-len:output-len:requests; the
# default runs a decode-heavy one (8 streams, 34-token prompts, 64 output
# tokens) and a prompt-heavy one (16 streams, 256-token prompts, 16 output
# tokens) and a prefill-only one (16 streams, 256-token prompts, 1 output
# token), each side alternated twice.
# The coordinator is pinned to core 1. Needs taskset and the 110M Q8_0 model
# that scripts/bench-serve.sh writes ($TMPDIR/strata-bench-110M-q8_0.gguf).
# Only loopback addresses are used.
set -u
cd "$(dirname "$0")/.."
M="${MODEL:-${TMPDIR:-/tmp}/strata-bench-110M-q8_0.gguf}"
[ -f "$M" ] || { echo "no model at $M: run scripts/bench-serve.sh once, or set MODEL" >&2; exit 1; }
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
go build -o "$bin/coordinator" ./cmd/coordinator && go build -o "$bin/shard" ./cmd/shard && go build -o "$bin/loadgen" ./cmd/loadgen || exit 1
run() { # $1 = shards
	n=$1
	d=$(mktemp -d)
	taskset -c 1 "$bin/coordinator" serve --model "$M" --min-shards "$n" --listen 127.0.0.1:18500 --gossip 127.0.0.1:18501 \
		--grpc 127.0.0.1:18502 --data-dir "$d/c" --threads 1 --kv-memory 256MiB >"$d/c.log" 2>&1 &
	pids=$!
	sleep 1
	for i in $(seq 0 $((n - 1))); do
		core=$i
		[ "$n" -eq 1 ] && core=0
		taskset -c "$core" "$bin/shard" join --coordinator 127.0.0.1:18501 --model "$M" --gossip 127.0.0.1:$((18510 + i)) \
			--grpc 127.0.0.1:$((18520 + i)) --data-dir "$d/s$i" --threads 1 >"$d/s$i.log" 2>&1 &
		pids="$pids $!"
	done
	for _ in $(seq 1 120); do curl -sf 127.0.0.1:18500/readyz >/dev/null && break; sleep 0.5; done
	"$bin/loadgen" --url http://127.0.0.1:18500 --clients 1 --requests 2 --output-len 16 >/dev/null 2>&1 # warm up
	echo "== $n shard(s), load $load, load average $(cut -d' ' -f1 /proc/loadavg)"
	"$bin/loadgen" --url http://127.0.0.1:18500 --clients "$c" --requests "$r" --prompt-len "$p" --output-len "$o" 2>&1 |
		grep -iE "tok/s|TTFT|inter-token|failed|KV"
	kill $pids
	wait 2>/dev/null
	rm -rf "$d"
}
# Alternate so that load drifts hit both sides.
for load in ${LOADS:-8:34:64:48 16:256:16:64 16:256:1:64}; do
	IFS=: read -r c p o r <<<"$load"
	run 2
	run 1
	run 2
	run 1
done

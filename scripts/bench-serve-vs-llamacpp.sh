#!/usr/bin/env bash
# Serving beside llama.cpp's server on the same file (issue 11's table):
# `coordinator serve --local-shards 1 --threads T` and `llama-server -t T
# -np 8` (continuous batching, 8 slots of 2048 tokens), each driven by
# cmd/loadgen with the same load — 34-token prompts, 64 output tokens,
# greedy, streamed, 1, 4 and 8 concurrent streams, REQS requests per
# stream — alternating which server goes first each round, ROUNDS rounds.
# Prints one line per run and then the medians and strata/llama.cpp ratios,
# with the CPU named. loadgen speaks to both alike (it tokenizes through
# /tokenize in either shape and reads the SSE stream).
#
# usage: scripts/bench-serve-vs-llamacpp.sh FILE.gguf
#   FILE must lie under ROOT (the chroot llama.cpp runs in; see
#   scripts/llamacpp-chroot.sh)
# env: ROOT (default /work/trixie), THREADS (default 2), ROUNDS (default 3),
#      REQS (requests per stream, default 6), STREAMS (default "1 4 8"),
#      LLAMA_CPU (hold llama.cpp to one CPU variant, e.g. zen4: AVX-512
#      without AMX; see scripts/llamacpp-variant.sh)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
[ $# -eq 1 ] || { sed -n 2,19p "$0" >&2; exit 2; }
root="${ROOT:-/work/trixie}"
threads="${THREADS:-2}"
rounds="${ROUNDS:-3}"
reqs="${REQS:-6}"
streams="${STREAMS:-1 4 8}"
f="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
case "$f" in "$root"/*) ;; *) echo "$f is not under ROOT $root" >&2; exit 1 ;; esac
bin="$(mktemp -d)"
raw="$bin/raw"
pid=
trap '[ -n "$pid" ] && kill $pid 2>/dev/null; rm -rf "$bin"; llamacpp_variant_restore' EXIT
. "$repo/scripts/llamacpp-variant.sh"
(cd "$repo" && go build -o "$bin/coordinator" ./cmd/coordinator && go build -o "$bin/loadgen" ./cmd/loadgen)
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//') ($(nproc) CPUs), load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "llama.cpp: $(chroot "$root" llama-server --version 2>&1 | grep -m1 version: || echo unknown), CPU variant ${LLAMA_CPU:-best}; strata $(git -C "$repo" rev-parse --short HEAD); file $f; threads $threads"

waitok() { # $1 = URL: up to 120 s
	for _ in $(seq 1 480); do curl -sf "$1" >/dev/null 2>&1 && return 0; sleep 0.25; done
	echo "timed out waiting for $1" >&2
	return 1
}

serve() { # $1 = strata | llama: starts it on 127.0.0.1:18700, sets pid
	if [ "$1" = strata ]; then
		"$bin/coordinator" serve --insecure --model "$f" --local-shards 1 --threads "$threads" \
			--listen 127.0.0.1:18700 --data-dir "$bin/data" >"$bin/server.log" 2>&1 &
		pid=$!
		waitok http://127.0.0.1:18700/readyz
	else
		chroot "$root" llama-server -m "/${f#"$root"/}" -t "$threads" -np 8 -c 16384 \
			--host 127.0.0.1 --port 18700 >"$bin/server.log" 2>&1 &
		pid=$!
		waitok http://127.0.0.1:18700/health
	fi
}

for round in $(seq 1 "$rounds"); do
	order="llama strata"
	[ $((round % 2)) -eq 0 ] && order="strata llama"
	for who in $order; do
		serve "$who"
		"$bin/loadgen" --url http://127.0.0.1:18700 --clients 2 --requests 4 --settle 0 >/dev/null 2>&1 || true # warm up
		for s in $streams; do
			"$bin/loadgen" --url http://127.0.0.1:18700 --clients "$s" --requests $((s * reqs)) --prompt-len 34 \
				--output-len 64 --settle 0 --json 2>/dev/null |
				python3 -c 'import json,sys
r=json.load(sys.stdin)
print(json.dumps({"who":sys.argv[1],"streams":int(sys.argv[2]),"round":int(sys.argv[3]),"toks":r["TokensPerSec"],
  "ttft_ms":r["TTFT"]["P50"]/1e6,"itl_ms":r["ITL"]["P50"]/1e6,"failed":r["Requests"]-r["Completed"]-r["Aborted"]}))' "$who" "$s" "$round" |
				tee -a "$raw"
		done
		kill "$pid"
		wait "$pid" 2>/dev/null || true
		pid=
	done
done
python3 - "$raw" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("\n| streams | llama-server tok/s | strata tok/s | strata / llama.cpp | TTFT p50 ms llama / strata | ITL p50 ms llama / strata |")
print("|---|---|---|---|---|---|")
for s in sorted({r["streams"] for r in rows}):
    med = lambda who, k: statistics.median(r[k] for r in rows if r["who"] == who and r["streams"] == s)
    l, t = med("llama", "toks"), med("strata", "toks")
    print(f"| {s} | {l:.1f} | {t:.1f} | {t / l:.2f}x | {med('llama', 'ttft_ms'):.1f} / {med('strata', 'ttft_ms'):.1f} | {med('llama', 'itl_ms'):.1f} / {med('strata', 'itl_ms'):.1f} |")
EOF
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

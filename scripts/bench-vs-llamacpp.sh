#!/usr/bin/env bash
# Speed beside llama.cpp on the same files (issues 12 and 13): for each file
# and thread count, alternates llama-bench (-p 128 -n 64 -r 3) with strata's
# own measurement of the same file (`vs-llamacpp bench`: pp128 and tg64 as
# `coordinator generate --bench` measures them, and its end-to-end row, tg64
# through generate's sampler and detokenizer), ROUNDS times, and prints the
# medians over rounds and strata/llama.cpp ratios, with the CPU named.
# Run it on an idle machine: the figures are only as quiet as the machine.
#
# usage: scripts/bench-vs-llamacpp.sh FILE.gguf...
#   files must lie under ROOT (the chroot llama.cpp runs in; see
#   scripts/llamacpp-chroot.sh)
# env: ROOT (default /work/trixie), BENCH (default chroot ROOT llama-bench),
#      THREADS (default "1 2"), ROUNDS (default 3), REPS (llama-bench -r and
#      strata's repetitions, default 3), VS (a built vs-llamacpp; default: go
#      build it), RAW (keep each round's figures here as JSON lines),
#      LLAMA_CPU (hold llama.cpp to one CPU variant, e.g. zen4: AVX-512
#      without AMX; see scripts/llamacpp-variant.sh), DEPTH (context cached
#      before tg64: llama-bench -d and `vs-llamacpp bench --depth`, default
#      0; the e2e column is measured only at 0).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
[ $# -gt 0 ] || { sed -n 2,22p "$0" >&2; exit 2; }
root="${ROOT:-/work/trixie}"
trap llamacpp_variant_restore EXIT
. "$repo/scripts/llamacpp-variant.sh"
bench="${BENCH:-chroot $root llama-bench}"
threads="${THREADS:-1 2}"
rounds="${ROUNDS:-3}"
reps="${REPS:-3}"
depth="${DEPTH:-0}"
raw="${RAW:-$(mktemp)}"
vs="${VS:-}"
if [ -z "$vs" ]; then
	vs="$(mktemp -d)/vs-llamacpp"
	(cd "$repo" && go build -buildvcs=auto -o "$vs" ./scripts/vs-llamacpp)
fi
for f in "$@"; do
	f="$(cd "$(dirname "$f")" && pwd)/$(basename "$f")"
	case "$f" in "$root"/*) ;; *) echo "$f is not under ROOT $root" >&2; exit 1 ;; esac
done
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//') ($(nproc) CPUs), load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "llama.cpp: $($bench --version 2>&1 | grep -m1 version: || echo unknown), CPU variant ${LLAMA_CPU:-best}; strata $("$vs" version)"
for round in $(seq 1 "$rounds"); do
	for f in "$@"; do
		f="$(cd "$(dirname "$f")" && pwd)/$(basename "$f")"
		for t in $threads; do
			# llama.cpp first in odd rounds, strata first in even ones
			order="llama strata"; [ $((round % 2)) -eq 0 ] && order="strata llama"
			for who in $order; do
				if [ "$who" = llama ]; then
					$bench -m "/${f#"$root"/}" -p 128 -n 64 -d "$depth" -r "$reps" -t "$t" -o jsonl 2>/dev/null |
						python3 -c 'import json,sys
rows=[json.loads(l) for l in sys.stdin if l.strip()]
pp=[r["avg_ts"] for r in rows if r["n_prompt"]>0 and r["n_gen"]==0]
tg=[r["avg_ts"] for r in rows if r["n_gen"]>0 and r["n_prompt"]==0]
print(json.dumps({"who":"llama","file":sys.argv[1],"threads":int(sys.argv[2]),"pp128":pp[0],"tg64":tg[0],"cpu_info":rows[0].get("cpu_info",""),"build":rows[0].get("build_commit","")}))' "$f" "$t" >>"$raw"
				else
					"$vs" bench --model "$f" --threads "$t" --reps "$reps" --depth "$depth" |
						python3 -c 'import json,sys
d=json.load(sys.stdin); d.update({"who":"strata","file":sys.argv[1],"threads":int(sys.argv[2])}); print(json.dumps(d))' "$f" "$t" >>"$raw"
				fi
			done
		done
	done
	echo "round $round done, load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
done
python3 - "$raw" <<'PY'
import json, os, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
keys = []
for r in rows:
    k = (r["file"], r["threads"])
    if k not in keys:
        keys.append(k)
med = lambda who, k, f: statistics.median(r[f] for r in rows if r["who"] == who and (r["file"], r["threads"]) == k)
print()
print("| file | threads | strata kernels | llama.cpp pp128 tok/s | strata pp128 | ratio | llama.cpp tg64 tok/s | strata tg64 | ratio | strata e2e (generate) | e2e / llama.cpp tg64 |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for k in keys:
    kern = next(r["kernels"] for r in rows if r["who"] == "strata" and (r["file"], r["threads"]) == k)
    lp, sp = med("llama", k, "pp128"), med("strata", k, "pp128")
    lt, st = med("llama", k, "tg64"), med("strata", k, "tg64")
    if any("e2e" in r for r in rows if r["who"] == "strata"):
        se = med("strata", k, "e2e")
        e2e = f"{se:.1f} | {se/lt:.2f}×"
    else:
        e2e = "– | –"  # DEPTH > 0
    print(f"| {os.path.basename(k[0])} | {k[1]} | {kern} | {lp:.1f} | {sp:.1f} | {sp/lp:.2f}× | {lt:.1f} | {st:.1f} | {st/lt:.2f}× | {e2e} |")
n = len({(r["file"], r["threads"], r["who"]) for r in rows})
print(f"\nmedians of {len(rows)//max(n,1)} alternated rounds; raw figures: {sys.argv[1]}")
PY
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

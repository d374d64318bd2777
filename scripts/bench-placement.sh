#!/bin/bash
# Placement by measured speed against memory-only placement (issue 15,
# item 3): a coordinator with no local shards and two `shard join`
# processes of unequal speed, shard A with --threads 1 and shard B with
# --threads 2 (A registers first), on the 110M Q8_0 random model that
# scripts/bench-serve.sh writes ($TMPDIR/strata-bench-110M-q8_0.gguf).
# Each round runs a decode-heavy load (8 streams, 32-token prompts, 48
# output tokens) and a prefill-heavy one (8 streams, 256-token prompts, 4
# output tokens), each once with --placement-mix memory (memory only) and
# once with the mix named in MIX (default balanced), alternating which goes
# first; ROUNDS rounds (default 3). It prints one line per run: the load,
# the mix, the placement (layers per shard, predicted stage times), output
# tok/s and requests/s. Only loopback addresses are used.
#
# Prediction, written before the first run: both shards report the same
# memory, so memory-only placement splits the 12 layers 6/6; B measures
# about twice A's speed, so speed placement gives A about 4 layers and B 8
# and the head. If B is 2x as fast under load too, the slowest stage drops
# from A's 6 layers to about 4 layers' time: about 1.4x the throughput for
# the prefill-heavy load (compute-bound), somewhat less (1.2-1.4x) for the
# decode-heavy one (per-step overheads and hops do not shrink).
#
# Measured 2026-12-01 on a 2-core AMD EPYC (Zen 4) shared with three other
# sessions' builds and tests (load average 20-28 throughout), so the pair
# was not reliably unequal: medians of alternated runs, speed-weighted
# (balanced) against memory-only, were 102.1 vs 99.2 output tok/s decode-
# heavy (1.03x) and 3.82 vs 3.02 tok/s prefill-heavy (1.26x) over 3 rounds
# with median calibration; 134.9 vs 127.3 (1.06x) and 4.07 vs 4.30 (0.95x)
# over 2 rounds with fastest-run calibration. The calibrations themselves
# swung 3-10x between runs (once ranking the 1-thread shard faster), and on
# the fastest runs both shards measured the same decode time per layer.
# The goal (>= 1.3x) is not shown; rerun on a quiet machine, or with one
# shard throttled (a cgroup cpu.max), before drawing a conclusion.
#
# Rerun 2026-12-01 on the same 2-core AMD EPYC (Zen 4), quiet (load 1.4-2.4),
# ROUNDS=2: decode-heavy 340.7/329.7 tok/s memory-only vs 360.1/325.2
# speed-weighted (medians 335.2 vs 342.6: 1.02x); prefill-heavy 5.92/5.71
# req/s vs 5.68/5.83 (1.00x). Calibration now separates the pair (decode8
# 0.49-0.70 ms/layer on 1 thread, 0.28-0.46 on 2) and placement follows it
# (4/8 or 8/4 layers), yet throughput does not move. Not yet explained;
# the likely cause is the box itself: the two shards' three compute
# threads and the coordinator share the same 2 cores, so a shard's speed
# alone (what calibration measures) is not its speed beside the other
# stage. Not measured: how much the stages overlap (a per-stage busy
# fraction would tell). What would show the goal: shards on separate
# machines or pinned cores (taskset), or a shard throttled by a cgroup
# quota with calibration averaged over a window longer than the quota's
# period (the fastest of 5 short runs escapes the throttle).
#
# Calibration now averages each kind over a third of its 1 s budget, and
# THROTTLE=0.5 makes the pair from two 1-thread shards, the first held to
# half a core by a cgroup quota. Prediction, written before that run: the
# quota'd shard calibrates at about half the other's speed; speed placement
# gives it about 4 of 12 layers (the other 8 and the head); memory-only
# leaves its 6 layers, at half speed, the slowest stage (about 12 layer-
# times against 8): about 1.4-1.5x prefill-heavy, 1.2-1.4x decode-heavy.
# Measured 2026-12-01, same AMD EPYC (Zen 4), quiet (load 1.1-2.7),
# THROTTLE=0.5 ROUNDS=2: calibration sees the quota (decode8 0.84-1.26
# ms/layer held, 0.45-0.54 free) and speed placement gives the held shard
# 3-4 layers (predicted slowest stage 33 ms against memory-only's 47-52).
# Decode-heavy: 231.8/275.0 tok/s memory-only vs 279.8/302.6 speed-
# weighted, medians 253.4 vs 291.2: 1.15x (rounds 1.21x, 1.10x).
# Prefill-heavy: 3.30/3.57 req/s vs 4.52/4.27, medians 3.43 vs 4.40: 1.28x
# (rounds 1.37x, 1.20x). Below the prediction and the 1.3x goal: the
# predicted ratio of slowest stages was 1.41x; the rest is time that does
# not shrink with the split (the hop, the coordinator, the other stage
# sharing the same 2 cores).
#
# PIN=1 puts each shard on a core of its own (taskset), as two machines
# would be; the THROTTLE prediction above is the one this tests (no new
# prediction was written for it). Measured 2026-12-01, same AMD EPYC (Zen
# 4), idle but for the runs (load 1.0-1.5), 110M Q8_0 from llama-quantize,
# PIN=1 THROTTLE=0.5 over 3 alternated rounds: decode-heavy 260.9/286.1/
# 315.2 tok/s memory-only vs 330.1/385.6/389.6 speed-weighted, medians
# 286.1 vs 385.6: 1.35x (rounds 1.26, 1.35, 1.24x); prefill-heavy 3.16/
# 3.80/3.79 req/s vs 4.95/4.64/4.66, medians 3.79 vs 4.66: 1.23x (rounds
# 1.56, 1.22, 1.23x). Speed placement gave the held shard 3-4 layers
# (predicted slowest stage 30-32 ms against memory-only's 41-49).
set -u
cd "$(dirname "$0")/.."
M="${MODEL:-${TMPDIR:-/tmp}/strata-bench-110M-q8_0.gguf}"
[ -f "$M" ] || { echo "no model at $M: run scripts/bench-serve.sh once, or set MODEL" >&2; exit 1; }
ROUNDS=${ROUNDS:-3}
MIX=${MIX:-balanced}
# THROTTLE=0.5: instead of 1 and 2 threads, two 1-thread shards, the first
# held to half a core by a CPU quota (a cgroup, as a container's CPU limit
# does; needs root): the unequal pair a 2-core machine can really make.
THROTTLE=${THROTTLE:-}
# PIN=1: each shard on a core of its own (taskset: the first on CPU 0, the
# second on CPU 1), so that neither takes the other's core, as on two
# machines; the coordinator is not pinned.
PIN=${PIN:-}
cg=
if [ -n "$THROTTLE" ]; then
	quota=$(python3 -c "print(int($THROTTLE * 100000))")
	if [ -d /sys/fs/cgroup/cpu ]; then # cgroup v1
		cg=/sys/fs/cgroup/cpu/strata-bench-$$
		mkdir "$cg" && echo 100000 >"$cg/cpu.cfs_period_us" && echo "$quota" >"$cg/cpu.cfs_quota_us" || exit 1
	else # cgroup v2
		cg=/sys/fs/cgroup/strata-bench-$$
		mkdir "$cg" && echo "$quota 100000" >"$cg/cpu.max" || exit 1
	fi
fi
bin=$(mktemp -d)
trap 'rm -rf "$bin"; [ -n "$cg" ] && rmdir "$cg" 2>/dev/null' EXIT
go build -o "$bin/coordinator" ./cmd/coordinator && go build -o "$bin/shard" ./cmd/shard && go build -o "$bin/loadgen" ./cmd/loadgen || exit 1
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-), $(nproc) CPUs; model $M"

waitlog() { # $1 = file, $2 = pattern: up to 60 s
	for _ in $(seq 1 240); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.25; done
	echo "timed out waiting for '$2' in $1" >&2
	return 1
}

run() { # $1 = mix, $2 = load name, $3 = prompt-len, $4 = output-len, $5 = requests
	d=$(mktemp -d)
	"$bin/coordinator" serve --insecure --model "$M" --local-shards 0 --min-shards 2 --placement-mix "$1" \
		--listen 127.0.0.1:18600 --gossip 127.0.0.1:18601 --grpc 127.0.0.1:18602 --data-dir "$d/c" \
		--threads 1 --kv-memory 256MiB >"$d/c.log" 2>&1 &
	pids=$!
	waitlog "$d/c.log" serving || { kill $pids; return; }
	i=0
	for th in 1 2; do
		name=threads$th threads=$th wrap=()
		if [ -n "$THROTTLE" ]; then # both on one thread; the first held to THROTTLE of a core
			threads=1 name=full
			[ "$th" = 1 ] && name=quota$THROTTLE wrap=(sh -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$cg")
		fi
		pin=()
		[ -n "$PIN" ] && pin=(taskset -c "$i")
		"${wrap[@]}" "${pin[@]}" "$bin/shard" join --insecure --coordinator 127.0.0.1:18601 --model "$M" --name "$name" \
			--gossip 127.0.0.1:$((18610 + i)) --grpc 127.0.0.1:$((18620 + i)) --data-dir "$d/s$i" \
			--threads "$threads" --kv-memory 256MiB >"$d/s$i.log" 2>&1 &
		pids="$pids $!"
		# One at a time: each calibrates alone, then registers.
		waitlog "$d/s$i.log" registered || { kill $pids; return; }
		i=$((i + 1))
	done
	for _ in $(seq 1 240); do curl -sf 127.0.0.1:18600/readyz >/dev/null && break; sleep 0.25; done
	"$bin/loadgen" --url http://127.0.0.1:18600 --clients 1 --requests 1 --output-len 4 >/dev/null 2>&1 # warm up
	placement=$(curl -s 127.0.0.1:18600/v1/cluster | python3 -c '
import json, sys
v = json.load(sys.stdin)
out = []
for s in sorted(v["shards"], key=lambda s: s["stage"]):
    c = s.get("calibration") or {}
    out.append("%s[%d,%d) pred %.1fms cal d8 %.2fms p %.1fms" % (s["name"], s["first_layer"], s["end_layer"],
        s.get("predicted_stage_ns", 0) / 1e6, c.get("decode8_ns", 0) / 1e6, c.get("prefill_ns", 0) / 1e6))
print("; ".join(out))')
	load1=$(cut -d' ' -f1 /proc/loadavg)
	"$bin/loadgen" --url http://127.0.0.1:18600 --clients 8 --requests "$5" --prompt-len "$3" --output-len "$4" \
		--timeout 10m --json >"$d/report.json" 2>"$d/loadgen.err"
	python3 - "$d/report.json" "$1" "$2" "$placement" "$load1" <<'EOF'
import json, sys
path, mix, load, placement, load1 = sys.argv[1:]
try:
    r = json.load(open(path))
except Exception as e:
    print(f"{load:8} {mix:9} loadgen failed: {e}")
    sys.exit()
el = r["Elapsed"] / 1e9
print(f"{load:8} {mix:9} {r['TokensPerSec']:7.2f} tok/s {r['Completed'] / el:6.3f} req/s  errors {r['Errors'] or 0}  load {load1}  | {placement}")
EOF
	kill $pids
	wait 2>/dev/null
	rm -rf "$d"
}

for round in $(seq 1 "$ROUNDS"); do
	order="memory $MIX"
	[ $((round % 2)) -eq 0 ] && order="$MIX memory"
	for load in decode prefill; do
		for mix in $order; do
			if [ "$load" = decode ]; then
				run "$mix" decode 32 48 16
			else
				run "$mix" prefill 256 4 16
			fi
		done
	done
done

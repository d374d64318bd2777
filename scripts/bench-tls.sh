#!/bin/sh
# Serving throughput with the cluster's mutual TLS (the default) against
# --insecure, alternated in one session so that both meet the same machine
# load: ROUNDS rounds (default 3) of `coordinator serve --local-shards 2`
# (two stage hops plus results over loopback gRPC, each TLS in the secure
# run) under 8 streams of the serving benchmark's load (scripts/benchserve).
# Prints each run's output tok/s, then the medians and their ratio.
set -eu
cd "$(dirname "$0")/.."
rounds="${ROUNDS:-3}"
bin="${TMPDIR:-/tmp}/strata-bench-coordinator"
go build -o "$bin" ./cmd/coordinator
go build -o "$bin-benchserve" ./scripts/benchserve
out="${TMPDIR:-/tmp}/strata-bench-tls.$$"
: >"$out"
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo '?')" >&2
i=0
while [ "$i" -lt "$rounds" ]; do
	for mode in tls insecure; do
		flag=""
		[ "$mode" = insecure ] && flag="--serve-flag=--insecure"
		tps=$("$bin-benchserve" --coordinator "$bin" --shards 2 --streams 8 --churn=false "$@" $flag |
			awk -F'|' '/plain/ {gsub(/ /, "", $6); print $6}')
		echo "round $((i + 1)) $mode: $tps output tok/s" >&2
		echo "$mode $tps" >>"$out"
	done
	i=$((i + 1))
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo '?')" >&2
awk '
	{ v[$1, ++n[$1]] = $2 }
	function median(m,   k, i, j, t, a) {
		k = n[m]; for (i = 1; i <= k; i++) a[i] = v[m, i]
		for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
		return k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
	}
	END {
		t = median("tls"); p = median("insecure")
		printf "median output tok/s at 8 streams: TLS %.1f, --insecure %.1f; TLS/insecure = %.3f (%+.1f%%)\n", t, p, t / p, 100 * (t / p - 1)
	}' "$out"
rm -f "$out" "$bin-benchserve"

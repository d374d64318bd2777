#!/usr/bin/env bash
# Runs .ci/run (or the command given) beside CPU hogs, as CI's shared
# machines may: a test that passes only on an idle machine is a test that
# asserts the machine's speed, not the product's behaviour.
#
#	scripts/ci-under-load.sh                 # .ci/run beside 2 hogs
#	HOGS=4 scripts/ci-under-load.sh go test -race ./cmd/coordinator/
#
# The hogs are busy loops at normal priority, killed when the command ends
# (or this script is interrupted); the command's exit status is returned.
set -uo pipefail
cd "$(dirname "$0")/.."
hogs=${HOGS:-2}
pids=()
stop() { [ ${#pids[@]} -gt 0 ] && kill "${pids[@]}" 2>/dev/null; wait "${pids[@]}" 2>/dev/null; }
trap stop EXIT INT TERM
for _ in $(seq "$hogs"); do
	sh -c 'while :; do :; done' &
	pids+=($!)
done
echo "ci-under-load: $hogs CPU hogs running (pids ${pids[*]}) on $(nproc) CPUs" >&2
if [ $# -eq 0 ]; then
	set -- .ci/run
fi
start=$(date +%s)
"$@"
rc=$?
echo "ci-under-load: '$*' exited $rc after $(( $(date +%s) - start ))s beside $hogs hogs" >&2
exit $rc

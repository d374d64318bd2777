#!/usr/bin/env bash
# test-compose.sh: build static binaries and scratch images, bring up the
# compose cluster (coordinator + 2 shards, one streaming its weights), check
# greedy output, kill a shard, check the coordinator survives and recovers
# when the shard is started again, and tear everything down.
#
#	deploy/test-compose.sh [MODEL.gguf]
#
# Everything it creates carries a per-run compose project name
# (strata-test-PID): it touches only its own containers, network, volumes
# and images, and removes them on exit, whatever the exit. Bounded: each
# wait has a deadline, and the whole run is killed after STRATA_TEST_TIMEOUT
# seconds (default 600).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
model=${1:-${STRATA_MODEL:-$root/../shared/models/stories260K.gguf}}
[[ -f $model ]] || { echo "test-compose: model $model not found" >&2; exit 2; }
model=$(cd "$(dirname "$model")" && pwd)/$(basename "$model")

project=strata-test-$$
tag=test-$$
start=$(date +%s)
compose_files=("$here/compose.yaml")
# shellcheck source=compose-lib.sh
. "$here/compose-lib.sh"
work=$(mktemp -d)
export STRATA_MODEL=$model STRATA_TAG=$tag STRATA_THREADS=1
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export STRATA_HTTP=127.0.0.1:$port
api=http://127.0.0.1:$port

cleanup() {
	local rc=$1
	trap - EXIT INT TERM
	kill "$watchdog" 2>/dev/null || true
	if [[ $rc -ne 0 ]]; then
		log "FAILED (exit $rc); last logs:"
		dc logs --no-color --tail=40 2>&1 | sed 's/^/    /' || true
	fi
	log "tearing down $project"
	dc down -v --remove-orphans -t 5 >/dev/null 2>&1 || true
	docker rmi "strata-coordinator:$tag" "strata-shard:$tag" >/dev/null 2>&1 || true
	rm -rf "$work"
	log "done in $(($(date +%s) - start)) s (exit $rc)"
	exit $rc
}
# Bound the whole run: a watchdog ends this script (cleanup still runs).
start_watchdog "${STRATA_TEST_TIMEOUT:-600}"
trap 'cleanup $?' EXIT
trap 'exit 130' INT TERM

ready() { [[ $(curl -s -o /dev/null -w '%{http_code}' "$api/readyz") == 200 ]]; }
healthy() { [[ $(curl -s -o /dev/null -w '%{http_code}' "$api/healthz") == 200 ]]; }
running() { [[ $(docker inspect -f '{{.State.Running}}' "$1" 2>/dev/null) == true ]]; }

want=$', there was a little girl named Lily. She loved to play outside in the park. One day, she saw a big, red ball. She wanted to play with it, but it was too high.\nLily\'s mom said'

# complete: a greedy completion of "Once upon a time"; prints the text.
complete() {
	curl -s --max-time 60 "$api/v1/completions" -H 'Content-Type: application/json' \
		-d '{"prompt":"Once upon a time","max_tokens":64,"temperature":0}' |
		python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["choices"][0]["text"] if "choices" in r else "ERROR: "+json.dumps(r), end="")'
}

check_text() {
	local got
	got=$(complete)
	if [[ $got != "$want" ]]; then
		log "$1: unexpected text: $(printf %q "$got")"
		return 1
	fi
	log "$1: greedy text matches llama.cpp"
}

build_images "$tag"

log "starting $project (API on $STRATA_HTTP)"
if ! out=$(dc up -d 2>&1); then
	echo "$out" >&2
	exit 1
fi
wait_for 90 "/readyz" ready
log "cluster ready"
check_text "two shards"
if ! dc logs --no-color shard-1 2>&1 | grep -q 'streamed weights'; then
	log "shard-1 (no model file) did not stream its weights"
	exit 1
fi
log "shard-1 streamed its range from the coordinator"

shard=$(dc ps -q shard-1)
coordinator=$(dc ps -q coordinator)
log "docker kill shard-1"
docker kill "$shard" >/dev/null
sleep 2
running "$coordinator" || { log "the coordinator died with the shard"; exit 1; }
healthy || { log "/healthz failed after the kill"; exit 1; }
log "coordinator up; /readyz $(curl -s -o /dev/null -w '%{http_code}' "$api/readyz") after the kill"

if ! running "$shard"; then
	log "docker start shard-1"
	docker start "$shard" >/dev/null
fi
wait_for 90 "/readyz after the restart" ready
check_text "after the shard restart"
running "$coordinator" || { log "the coordinator exited"; exit 1; }
# What the restarted shard did: the restart is a new incarnation, which the
# coordinator treats as a lost shard plus a new one (a spare, or part of a
# new placement that loads from the cache).
n_streamed=$(dc logs --no-color shard-1 2>&1 | grep -c 'streamed weights' || true)
n_cached=$(dc logs --no-color shard-1 2>&1 | grep -c 'weights from cache' || true)
log "shard-1 over both runs: streamed $n_streamed time(s), loaded from its cache $n_cached time(s)"
dc logs --no-color shard-1 2>&1 | grep -E 'assigned|weights|spare' | sed 's/^/    /' || true
log "PASS"

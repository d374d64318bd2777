#!/usr/bin/env bash
# test-partition.sh: partitions for real. Builds static binaries and scratch
# images (as test-compose.sh does), brings up compose.yaml + partition.yaml
# (a coordinator and three shards, each shard also on a probe network the
# host reads its /metrics through), and runs TestPartitionFaults
# (partition_test.go) against it: under a bounded streaming load, a stage
# shard cut off the cluster network for 5 s and for 30 s (docker network
# disconnect, then connect with its old address), and a stage shard's
# container paused for 10 s. Tears everything down on exit.
#
#	deploy/test-partition.sh [MODEL.gguf]
#
# Variables:
#	STRATA_IMAGE_TAG     use the images strata-{coordinator,shard}:TAG
#	                     already built (and keep them) instead of building
#	STRATA_SUBNET        the cluster network's /24 (default 10.231.N.0/24,
#	                     N from the PID); must not overlap another network
#	STRATA_PARTITION_LOGS  also write the cluster's whole log to this file
#	STRATA_GO_TEST_FLAGS   more flags for go test (e.g. -race)
#	STRATA_TEST_TIMEOUT  seconds before the whole run is killed (default 1200)
#
# Everything it creates carries a per-run compose project name
# (strata-part-PID) and is removed on exit, whatever the exit.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
model=${1:-${STRATA_MODEL:-$root/../shared/models/stories260K.gguf}}
[[ -f $model ]] || { echo "test-partition: model $model not found" >&2; exit 2; }
model=$(cd "$(dirname "$model")" && pwd)/$(basename "$model")

project=strata-part-$$
tag=${STRATA_IMAGE_TAG:-part-$$}
start=$(date +%s)
compose_files=("$here/compose.yaml" "$here/partition.yaml")
# shellcheck source=compose-lib.sh
. "$here/compose-lib.sh"
work=$(mktemp -d)
export STRATA_MODEL=$model STRATA_TAG=$tag STRATA_THREADS=1
export STRATA_SUBNET=${STRATA_SUBNET:-10.231.$(($$ % 200 + 20)).0/24}
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export STRATA_HTTP=127.0.0.1:$port
api=http://127.0.0.1:$port

cleanup() {
	local rc=$1
	trap - EXIT INT TERM
	kill "$watchdog" 2>/dev/null || true
	if [[ $rc -ne 0 ]]; then
		log "FAILED (exit $rc); last logs:"
		dc logs --no-color --tail=60 2>&1 | sed 's/^/    /' || true
	fi
	if [[ -n ${STRATA_PARTITION_LOGS:-} ]]; then
		dc logs --no-color >"$STRATA_PARTITION_LOGS" 2>&1 || true
		log "cluster logs in $STRATA_PARTITION_LOGS"
	fi
	log "tearing down $project"
	dc down -v --remove-orphans -t 5 >/dev/null 2>&1 || true
	if [[ -z ${STRATA_IMAGE_TAG:-} ]]; then
		docker rmi "strata-coordinator:$tag" "strata-shard:$tag" >/dev/null 2>&1 || true
	fi
	rm -rf "$work"
	log "done in $(($(date +%s) - start)) s (exit $rc)"
	exit $rc
}
start_watchdog "${STRATA_TEST_TIMEOUT:-1200}"
trap 'cleanup $?' EXIT
trap 'exit 130' INT TERM

ready() { [[ $(curl -s -o /dev/null -w '%{http_code}' "$api/readyz") == 200 ]]; }

if [[ -z ${STRATA_IMAGE_TAG:-} ]]; then
	build_images "$tag"
fi

log "starting $project (API on $STRATA_HTTP, cluster network $STRATA_SUBNET)"
if ! out=$(dc up -d 2>&1); then
	echo "$out" >&2
	exit 1
fi
wait_for 120 "/readyz" ready
log "cluster ready"

shards=""
for s in shard-0 shard-1 shard-2; do
	shards+="$s=$(dc ps -q "$s") "
done
# The networks' names as Docker knows them (compose prefixes the project).
network=$(docker network ls --filter "label=com.docker.compose.project=$project" --filter "label=com.docker.compose.network=strata" --format '{{.Name}}')
probe=$(docker network ls --filter "label=com.docker.compose.project=$project" --filter "label=com.docker.compose.network=probe" --format '{{.Name}}')
[[ -n $network && -n $probe ]] || { log "cannot find the networks of $project"; exit 1; }

log "running TestPartitionFaults"
(cd "$root" && STRATA_PARTITION_API=$api STRATA_PARTITION_NETWORK=$network STRATA_PARTITION_PROBE=$probe \
	STRATA_PARTITION_SHARDS=$shards go test -count=1 -timeout 20m ${STRATA_GO_TEST_FLAGS:-} -run '^TestPartitionFaults$' -v ./deploy/)
log "PASS"

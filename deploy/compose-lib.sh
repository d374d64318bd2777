# compose-lib.sh: what test-compose.sh and test-partition.sh share. Source
# it after setting `here` (this directory), `root` (the repository),
# `project` (the compose project), `start` (the run's start, date +%s) and
# `compose_files` (the -f files, an array); set `work` (a scratch
# directory) before calling build_images.
# It defines:
#
#	compose        the compose command (docker compose v2 or docker-compose 1.29)
#	dc ARGS...     compose on this run's project and files
#	log MSG...     a line with the seconds since start
#	wait_for DEADLINE_S WHAT CMD...   retry CMD every 0.5 s until it succeeds
#	build_images TAG   static binaries of the working tree, then the images
#	                   strata-{coordinator,shard}:TAG built from them
#	start_watchdog TIMEOUT_S   end this script (cleanup runs) after TIMEOUT_S;
#	                   its PID is in $watchdog

if docker compose version >/dev/null 2>&1; then
	compose=(docker compose)
elif command -v docker-compose >/dev/null 2>&1; then
	compose=(docker-compose)
else
	echo "$(basename "$0"): neither 'docker compose' nor docker-compose is installed" >&2
	exit 2
fi

dc() {
	local files=() f
	for f in "${compose_files[@]}"; do files+=(-f "$f"); done
	"${compose[@]}" -p "$project" "${files[@]}" "$@"
}

log() { printf '[%4ds] %s\n' "$(($(date +%s) - start))" "$*"; }

wait_for() {
	local deadline=$(($(date +%s) + $1)) what=$2
	shift 2
	until "$@" >/dev/null 2>&1; do
		if (($(date +%s) > deadline)); then
			log "timed out waiting for $what"
			return 1
		fi
		sleep 0.5
	done
}

build_images() {
	local tag=$1 target out
	log "building static binaries"
	mkdir -p "$work/bin" "$work/data"
	(cd "$root" && CGO_ENABLED=0 go build -tags nocuda -trimpath -ldflags='-s -w' -o "$work/bin/" ./cmd/coordinator ./cmd/shard)
	log "building images strata-{coordinator,shard}:$tag"
	for target in coordinator shard; do
		if ! out=$(docker build -q -f "$here/Dockerfile" --target "$target" -t "strata-$target:$tag" "$work" 2>&1); then
			echo "$out" >&2
			return 1
		fi
	done
}

start_watchdog() {
	local timeout_s=$1
	(
		trap 'kill $sp 2>/dev/null; exit 0' TERM
		sleep "$timeout_s" &
		sp=$!
		wait $sp
		log "timed out after ${timeout_s}s"
		kill -TERM $$
	) &
	watchdog=$!
}

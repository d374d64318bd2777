#!/usr/bin/env bash
# Installs Debian's llama.cpp (package llama.cpp, sid) in a Debian chroot,
# for comparing strata with llama.cpp on the same files:
# scripts/vs-llamacpp/run.sh (agreement, issues 12 and 13) and
# scripts/bench-vs-llamacpp.sh (speed). Developer machines only: CI does not
# run it, and nothing of llama.cpp enters the repository.
#
# usage: sudo scripts/llamacpp-chroot.sh [DIR]     (default /work/trixie)
#
# Then `chroot DIR llama-server|llama-bench|llama-quantize ...` run it; the
# files they read must lie inside DIR (models go to DIR/models and are named
# /models/... inside). llama-server listens on the host's loopback. Debian
# builds every CPU backend (libggml-cpu-*.so) and picks the best for the
# CPU at run time (zen4 on an AMD EPYC with AVX-512). Re-running it only
# updates the package and re-mounts /proc.
set -euo pipefail
dir="${1:-/work/trixie}"
if [ ! -x "$dir/usr/bin/apt-get" ]; then
	command -v debootstrap >/dev/null || apt-get install -y debootstrap
	debootstrap --variant=minbase trixie "$dir" http://deb.debian.org/debian
fi
# llama.cpp is packaged in sid (unstable); trixie's base is enough for the rest.
echo "deb http://deb.debian.org/debian sid main" >"$dir/etc/apt/sources.list.d/sid.list"
chroot "$dir" apt-get -o Acquire::Check-Valid-Until=false update
chroot "$dir" apt-get install -y llama.cpp llama.cpp-tools
mountpoint -q "$dir/proc" || mount --bind /proc "$dir/proc" # llama.cpp reads /proc/cpuinfo and /proc/self
mkdir -p "$dir/models"
chroot "$dir" llama-server --version 2>&1 | grep -m1 version:

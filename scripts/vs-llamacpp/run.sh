#!/usr/bin/env bash
# Runs vs-llamacpp compare over issue 12's and 13's files and prints the
# Markdown tables (docs/llamacpp-agreement.md holds a run's output).
#
# usage: scripts/vs-llamacpp/run.sh [SETS] [JSONL]
#   SETS   comma-separated among stories (stories260K's five shared files and
#          nine llama-quantize types made from its F32 file), random (a
#          random-weight F32 llama, the same nine types), archs (a random F32
#          file per architecture and ARCH_TYPES); default all three
#   JSONL  full records, one line per file (default /tmp/vs-llamacpp.jsonl)
# env: ROOT (the chroot llama.cpp runs in, default /work/trixie), DIR (where
#      the files go, under ROOT; default ROOT/models/vs; files already there
#      are reused), SERVER, QUANTIZE (commands; default chroot ROOT
#      llama-server / llama-quantize), HEAD_SCALE (random files' output head
#      factor, default 4), ARCH_TYPES (default "Q8_0 Q4_K_M"), VS (a built
#      vs-llamacpp; default: go build it), MODELS (the shared stories files),
#      ARCHS (the architectures of the archs set).
# llama.cpp is not part of the repository: scripts/llamacpp-chroot.sh
# installs Debian's package in ROOT. About 30 s per file on 2 cores.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
sets="${1:-stories,random,archs}"
jsonl="${2:-/tmp/vs-llamacpp.jsonl}"
root="${ROOT:-/work/trixie}"
server="${SERVER:-chroot $root llama-server}"
quantize="${QUANTIZE:-chroot $root llama-quantize}"
models="${MODELS:-$repo/../shared/models}"
scale="${HEAD_SCALE:-4}"
arch_types="${ARCH_TYPES:-Q8_0 Q4_K_M}"
types="Q4_K_M Q5_K_M Q6_K Q3_K_M Q2_K Q5_0 Q5_1 IQ4_NL IQ4_XS"
dir="${DIR:-$root/models/vs}"
mkdir -p "$dir"
vs="${VS:-}"
if [ -z "$vs" ]; then
	vs="$(mktemp -d)/vs-llamacpp"
	(cd "$repo" && go build -buildvcs=auto -o "$vs" ./scripts/vs-llamacpp)
fi
seen() { echo "/${1#"$root"/}"; } # a path under ROOT as the chroot sees it
quant() { # quant SRC TYPE DST: llama-quantize, without imatrix
	[ -s "$3" ] || $quantize "$(seen "$1")" "$(seen "$3")" "$2" >"$3.log" 2>&1 ||
		{ echo "llama-quantize $2 failed, see $3.log" >&2; return 1; }
}
header="$("$vs" compare --header-only)"
cmp() { # a file that fails (llama.cpp refuses it, say) gets a row saying so; the run goes on
	"$vs" compare --root "$root" --server "$server" --json "$jsonl" --model "$@" 2>"$dir/compare.err" || {
		why="$(grep -m1 -o 'error loading model.*' "$dir/compare.err" || grep -m1 -o 'vs-llamacpp: .*' "$dir/compare.err")"
		echo "| $(basename "$1") | — | failed: ${why:0:160} |"
	}
	grep -v '^[0-9.]* [IWE] \|^$' "$dir/compare.err" >&2 || true
}

echo "llama.cpp: $($server --version 2>&1 | grep -m1 version:) | CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-) | strata $("$vs" version)"
case ",$sets," in *,stories,*)
	echo; echo "### stories260K"; echo
	echo "$header"
	for f in stories260K.gguf stories260K-F16.gguf stories260K-BF16.gguf stories260K-Q8_0.gguf stories260K-Q4_0.gguf; do
		[ -s "$dir/$f" ] || cp "$models/$f" "$dir/$f"
		cmp "$dir/$f"
	done
	for t in $types; do
		quant "$dir/stories260K.gguf" "$t" "$dir/stories260K-$t.gguf"
		cmp "$dir/stories260K-$t.gguf"
	done
esac
case ",$sets," in *,random,*)
	echo; echo "### random llama (4 layers of 256, FFN 512, vocabulary 2000, output head ×$scale)"; echo
	src="$dir/random-llama-F32.gguf"
	[ -s "$src" ] || "$vs" random --arch llama --head-scale "$scale" --out "$src"
	echo "$header"
	cmp "$src"
	for t in $types; do
		quant "$src" "$t" "$dir/random-llama-$t.gguf"
		cmp "$dir/random-llama-$t.gguf"
	done
esac
case ",$sets," in *,archs,*)
	echo; echo "### architectures (random weights, output head ×$scale)"; echo
	echo "$header"
	for a in ${ARCHS:-llama qwen2 qwen3 phi3 gemma2 gemma3 qwen2moe qwen3moe mixtral}; do
		src="$dir/random-$a-F32.gguf"
		[ -s "$src" ] || "$vs" random --arch "$a" --head-scale "$scale" --out "$src"
		cmp "$src"
		for t in $arch_types; do
			quant "$src" "$t" "$dir/random-$a-$t.gguf"
			cmp "$dir/random-$a-$t.gguf"
		done
	done
esac

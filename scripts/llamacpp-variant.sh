# Sourced by the scripts that run llama.cpp beside strata: with LLAMA_CPU
# set (e.g. LLAMA_CPU=zen4), holds Debian's llama.cpp in the chroot ROOT to
# that one CPU variant for the run. Debian builds every variant
# (libggml-cpu-<name>.so) and ggml loads the best the CPU can run: on an
# Intel Xeon with AMX that is "sapphirerapids", AMX included; "zen4" is the
# AVX-512 F/BW/VL/VBMI/VNNI/BF16 build without AMX (issue 11's comparator).
# The other variants are moved aside into ROOT/.ggml-variants-aside and put
# back when the calling script exits (llamacpp_variant_restore, which the
# caller's EXIT trap must run).
llamacpp_variant_dir="$root/usr/lib/x86_64-linux-gnu/ggml/backends0"
llamacpp_variant_aside="$root/.ggml-variants-aside"
llamacpp_variant_restore() {
	if [ -d "$llamacpp_variant_aside" ]; then
		mv "$llamacpp_variant_aside"/libggml-cpu-*.so "$llamacpp_variant_dir"/ 2>/dev/null || true
		rmdir "$llamacpp_variant_aside" 2>/dev/null || true
	fi
}
llamacpp_variant_restore # a run killed before it could restore
if [ -n "${LLAMA_CPU:-}" ]; then
	if [ ! -f "$llamacpp_variant_dir/libggml-cpu-$LLAMA_CPU.so" ]; then
		echo "LLAMA_CPU=$LLAMA_CPU: no $llamacpp_variant_dir/libggml-cpu-$LLAMA_CPU.so; variants: $(cd "$llamacpp_variant_dir" && ls libggml-cpu-*.so | sed 's/libggml-cpu-//; s/\.so//' | tr '\n' ' ')" >&2
		exit 2
	fi
	mkdir -p "$llamacpp_variant_aside"
	for so in "$llamacpp_variant_dir"/libggml-cpu-*.so; do
		[ "$so" = "$llamacpp_variant_dir/libggml-cpu-$LLAMA_CPU.so" ] || mv "$so" "$llamacpp_variant_aside"/
	done
fi

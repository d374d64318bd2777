package cpu

// SetPortable forces the portable kernels (true) or lets the CPU's SIMD
// kernels run (false), for the external tests.
func SetPortable(on bool) { portableOnly = on }

// SetAVX2Only makes the AVX2 kernels (and the portable element-wise code)
// run on an AVX-512 machine, as on an AVX2-only CPU, for the external tests.
func SetAVX2Only(on bool) { avx2Only = on }

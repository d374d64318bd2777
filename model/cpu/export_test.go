package cpu

// SetPortable forces the portable kernels (true) or lets the CPU's SIMD
// kernels run (false), for the external tests.
func SetPortable(on bool) { portableOnly = on }

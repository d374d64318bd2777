// Command asmgen generates the amd64 assembly kernels of package cpu with avo.
//
// Run it through go generate in model/cpu (see gen.go there):
//
//	go run ./internal/asmgen -out kernels_amd64.s -stubs kernels_stubs_amd64.go -pkg cpu
//
// Every kernel has the signature
//
//	func(n int, w *byte, ws int, x *byte, xs int, out *float32, os int)
//
// and computes an R×C tile of dot products: out[c*os/4 + r] = dot(weight row
// r at w+r*ws, activation row c at x+c*xs) for r < R, c < C. n counts
// elements for the float types and 32-element blocks for Q8_0 and Q4_0 (the
// panel kernels, see panelKernel and kquant.go, take blocks or 256-element
// super-blocks of repacked weights). Each
// output is reduced in exactly the order of the portable kernel of its type
// (see dot.go and dot_quant.go), whatever R and C: an R×C kernel equals R*C
// calls of the 1×1 kernel bit for bit.
//
// Every function ends with ret, never with a bare RET: all of them use YMM or
// ZMM registers, and ret clears their upper halves with VZEROUPPER first (see
// ret; TestNoBareRET enforces it).
package main

import (
	"fmt"
	"math"
	"os"

	"github.com/mmcloughlin/avo/attr"
	. "github.com/mmcloughlin/avo/build"
	"github.com/mmcloughlin/avo/ir"
	. "github.com/mmcloughlin/avo/operand"
	"github.com/mmcloughlin/avo/reg"
)

const signature = "func(n int, w *byte, ws int, x *byte, xs int, out *float32, os int)"

func main() {
	ConstraintExpr("amd64,!purego")
	for _, k := range []struct {
		name string
		maxR int
		maxC int
		gen  func(t *tile)
	}{
		{"f32AVX512", 4, 4, f32AVX512},
		{"f16AVX512", 4, 4, f16AVX512},
		{"bf16AVX512", 4, 4, bf16AVX512},
		{"f16xAVX512", 4, 4, f16xAVX512},
		{"bf16xAVX512", 4, 4, bf16xAVX512},
	} {
		for r := 1; r <= k.maxR; r++ {
			for c := 1; c <= k.maxC; c++ {
				if only := os.Getenv("ASMGEN_ONLY"); only != "" && only != fmt.Sprintf("%s_%dx%d", k.name, r, c) {
					continue
				}
				TEXT(fmt.Sprintf("%s_%dx%d", k.name, r, c), NOSPLIT, signature)
				Pragma("noescape")
				Doc(fmt.Sprintf("%s_%dx%d computes a %d×%d tile of %s dot products.", k.name, r, c, r, c, k.name))
				t := newTile(r, c)
				k.gen(t)
				ret()
			}
		}
	}
	maskConsts()
	for r := 1; r <= 2; r++ {
		for c := 1; c <= 2; c++ {
			TEXT(fmt.Sprintf("f32AVX2_%dx%d", r, c), NOSPLIT, signature)
			Pragma("noescape")
			Doc(fmt.Sprintf("f32AVX2_%dx%d computes a %d×%d tile of f32 dot products with AVX2 and FMA.", r, c, r, c))
			f32AVX2(newTile(r, c))
			ret()
		}
	}
	for r := 1; r <= 2; r++ {
		for c := 1; c <= 2; c++ {
			TEXT(fmt.Sprintf("f16AVX2_%dx%d", r, c), NOSPLIT, signature)
			Pragma("noescape")
			Doc(fmt.Sprintf("f16AVX2_%dx%d computes a %d×%d tile of f16 dot products with AVX2, F16C and FMA.", r, c, r, c))
			f16AVX2(newTile(r, c))
			ret()
		}
	}
	for r := 1; r <= 2; r++ {
		for c := 1; c <= 2; c++ {
			TEXT(fmt.Sprintf("bf16AVX2_%dx%d", r, c), NOSPLIT, signature)
			Pragma("noescape")
			Doc(fmt.Sprintf("bf16AVX2_%dx%d computes a %d×%d tile of bf16 dot products with AVX2.", r, c, r, c))
			bf16AVX2(newTile(r, c))
			ret()
		}
	}
	for _, k := range []struct {
		name string
		gen  func(t *tile)
	}{{"q80AVX2", q80AVX2}, {"q40AVX2", q40AVX2}, {"f16xAVX2", f16xAVX2}, {"bf16xAVX2", bf16xAVX2}} {
		for r := 1; r <= 2; r++ {
			for c := 1; c <= 2; c++ {
				TEXT(fmt.Sprintf("%s_%dx%d", k.name, r, c), NOSPLIT, signature)
				Pragma("noescape")
				Doc(fmt.Sprintf("%s_%dx%d computes a %d×%d tile of %s dot products with AVX2 and FMA.", k.name, r, c, r, c, k.name))
				k.gen(newTile(r, c))
				ret()
			}
		}
	}
	expConsts()
	expSub()
	vexpConsts()
	swiGLU()
	quantQ80()
	f32ToF16()
	f16Scale()
	roundF16()
	roundBF16()
	for _, H := range []int{1, 2} {
		softmaxValues(true, H)
		softmaxValues(false, H)
		softmaxWeights(H)
	}
	scores16()
	score1()
	for C := 1; C <= maxPanelC; C++ {
		q80LanePanel(C)
		panelKernel("q40Panel", "Q4_0", C, true, false)
	}
	for C := 1; C <= maxPanelC; C++ {
		q4KPanel(C, false, false)
		q6KPanel(C)
	}
	quantQ8KX()
	for C := 1; C <= maxPanelC; C++ {
		q4KPanelAVX2(C, false, false)
		q6KPanelAVX2(C, false)
	}
	for C := 1; C <= maxPanelC; C++ {
		q50Panel(C, false)
	}
	for C := 1; C <= maxPanelC; C++ {
		q4KPanel(C, true, false)
		q23KPanel(C, false)
		q23KPanel(C, true)
		q50Panel(C, true)
		q4KPanelAVX2(C, true, false)
		iq4XSPanel(C)
		panelKernel("iq4NLPanel", "IQ4_NL", C, true, true)
	}
	for r := 1; r <= 2; r++ {
		for c := 1; c <= 2; c++ {
			TEXT(fmt.Sprintf("q50AVX2_%dx%d", r, c), NOSPLIT, signature)
			Pragma("noescape")
			Doc(fmt.Sprintf("q50AVX2_%dx%d computes a %d×%d tile of q50AVX2 dot products with AVX2 and FMA.", r, c, r, c))
			q50AVX2(newTile(r, c))
			ret()
		}
	}
	for r := 1; r <= 2; r++ {
		for c := 1; c <= 2; c++ {
			TEXT(fmt.Sprintf("iq4NLAVX2_%dx%d", r, c), NOSPLIT, signature)
			Pragma("noescape")
			Doc(fmt.Sprintf("iq4NLAVX2_%dx%d computes a %d×%d tile of IQ4_NL dot products with AVX2 and FMA.", r, c, r, c))
			iq4NLAVX2(newTile(r, c))
			ret()
		}
	}
	for C := 1; C <= maxPanelC; C++ {
		q23KPanelAVX2(C, false, false)
		q23KPanelAVX2(C, true, false)
		iq4XSPanelAVX2(C, false)
	}
	for r := 1; r <= 2; r++ {
		for c := 1; c <= 2; c++ {
			TEXT(fmt.Sprintf("q51AVX2_%dx%d", r, c), NOSPLIT, signature)
			Pragma("noescape")
			Doc(fmt.Sprintf("q51AVX2_%dx%d computes a %d×%d tile of Q5_1 dot products with AVX2 and FMA.", r, c, r, c))
			q51AVX2(newTile(r, c))
			ret()
		}
	}
	f16AccAVX2()
	scoreAVX2()
	scoresAVX2()
	for _, H := range []int{1, 2} {
		softmaxValuesAVX2(true, H)
		softmaxValuesAVX2(false, H)
		softmaxWeightsAVX2(H)
	}
	scoreTail()
	for C := 1; C <= maxPanelC; C++ {
		q4KPanel(C, true, true)
	}
	// The matrix-vector kernels: the 1×1 float tiles looping over weight
	// rows (rowsKernel), again prefetching ahead of their weights
	// (matVecAhead, halfAhead); then the C = 1 panels prefetching, AVX-512
	// and AVX2: an Intel CPU without AVX-512 has the prefetchers that stop
	// at every page too.
	for _, k := range []struct {
		name  string
		gen   func(t *tile)
		ahead int
	}{
		{"f32AVX512", f32AVX512, matVecAhead},
		{"f16xAVX512", f16xAVX512, halfAhead},
		{"bf16xAVX512", bf16xAVX512, halfAhead},
		{"f32AVX2", f32AVX2, matVecAhead},
		{"f16xAVX2", f16xAVX2, halfAhead},
		{"bf16xAVX2", bf16xAVX2, halfAhead},
	} {
		rowsKernel(k.name, k.gen)
		withAhead(k.ahead, func() { rowsKernel(k.name, k.gen) })
	}
	withAhead(matVecAhead, func() {
		q80LanePanel(1)
		panelKernel("q40Panel", "Q4_0", 1, true, false)
		panelKernel("iq4NLPanel", "IQ4_NL", 1, true, true)
		q50Panel(1, false)
		q50Panel(1, true)
		q4KPanel(1, false, false)
		q4KPanel(1, true, false)
		q4KPanel(1, true, true)
		q6KPanel(1)
		q23KPanel(1, false)
		q23KPanel(1, true)
		iq4XSPanel(1)
		q4PanelAVX2(1, false, false)
		q4PanelAVX2(1, true, false)
		lanePanelAVX2(1, "Q5_0", false)
		lanePanelAVX2(1, "Q5_1", false)
		lanePanelAVX2(1, "Q8_0", false)
		q4KPanelAVX2(1, false, false)
		q4KPanelAVX2(1, true, false)
		q6KPanelAVX2(1, false)
		q23KPanelAVX2(1, false, false)
		q23KPanelAVX2(1, true, false)
		iq4XSPanelAVX2(1, false)
	})
	cpuVendor()
	amxPanel(amxQ40)
	amxPanel(amxIQ4NL)
	amxPanel(amxIQ4XS)
	amxPanel(amxQ4K)
	amxPanel(amxQ5K)
	amxPanel(amxQ6K)
	for C := 1; C <= maxPanelC; C++ {
		q4PanelAVX2(C, false, false)
		q4PanelAVX2(C, true, false)
	}
	for C := 1; C <= maxPanelC; C++ {
		lanePanelAVX2(C, "Q5_0", false)
		lanePanelAVX2(C, "Q5_1", false)
		lanePanelAVX2(C, "Q8_0", false)
	}
	swiGLUAVX2()
	quantQ80AVX2(false)
	quantQ80AVX2(true)
	f32ToF16AVX2()
	quantQ8KXAVX2()
	roundF16AVX2()
	roundBF16AVX2()
	// AVX-VNNI: the AVX2 block panels for prompts (C >= 2; one activation
	// row runs the AVX2 kernels, with or without the prefetch).
	for C := 2; C <= maxPanelC; C++ {
		q4PanelAVX2(C, false, true)
		q4PanelAVX2(C, true, true)
		lanePanelAVX2(C, "Q5_0", true)
		lanePanelAVX2(C, "Q5_1", true)
		lanePanelAVX2(C, "Q8_0", true)
		iq4XSPanelAVX2(C, true)
		q23KPanelAVX2(C, false, true)
		q23KPanelAVX2(C, true, true)
		q4KPanelAVX2(C, false, true)
		q4KPanelAVX2(C, true, true)
		q6KPanelAVX2(C, true)
	}
	Generate()
	if err := vexVNNI(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// cpuVendor emits func cpuVendor() (ebx, edx, ecx, sig uint32): CPUID leaf
// 0's vendor string, "GenuineIntel" as "Genu", "ineI", "ntel", and leaf 1's
// EAX, the family, model and stepping. It ends with ret's VZEROUPPER like
// every function here, so callers run it only on a CPU with AVX
// (cpuIdentity).
func cpuVendor() {
	TEXT("cpuVendor", NOSPLIT, "func() (ebx, edx, ecx, sig uint32)")
	Doc("cpuVendor returns CPUID leaf 0's vendor string in EBX, EDX, ECX order and leaf 1's EAX; it needs AVX (VZEROUPPER).")
	XORL(reg.EAX, reg.EAX)
	XORL(reg.ECX, reg.ECX)
	CPUID()
	Store(reg.EBX, ReturnIndex(0))
	Store(reg.EDX, ReturnIndex(1))
	Store(reg.ECX, ReturnIndex(2))
	MOVL(U32(1), reg.EAX)
	XORL(reg.ECX, reg.ECX)
	CPUID()
	Store(reg.EAX, ReturnIndex(3))
	ret()
}

// ret ends a function: VZEROUPPER, then RET. Every function of this
// generator uses YMM or ZMM registers, and a function that returns with their
// upper halves dirty makes every legacy-SSE instruction run later on the same
// thread (all of Go's scalar float code: math.Exp, the sampler, ...) pay the
// AVX→SSE transition penalty on Intel CPUs, which made serving 6× slower on a
// Xeon; AMD hides it. VZEROUPPER costs about a cycle and changes no X
// register, so a future function that uses only general-purpose or XMM
// registers may end with ret too. Never call RET directly: TestNoBareRET in
// this package fails on it, and TestVZEROUPPER in package cpu checks the
// generated assembly.
func ret() {
	VZEROUPPER()
	RET()
}

// expTab holds expZ's constants (see expf in package cpu, whose order it
// follows): float64 32/ln 2, the rounding shift, the polynomial's C0, C1,
// C2, 1 and the index mask 31, then the 32 entries of 2^(i/32) less i<<47;
// expLim the float32 limits below which expf is 0 and above which +Inf.
var expTab, expLim Mem

func expConsts() {
	expTab = GLOBL("expTab", RODATA|NOPTR)
	vals := []float64{0x1.71547652b82fep+0 * 32, 0x1.8p+52, 0x1.c6af84b912394p-5 / 32 / 32 / 32,
		0x1.ebfce50fac4f3p-3 / 32 / 32, 0x1.62e42ff0c52d6p-1 / 32, 1}
	for i, v := range vals {
		DATA(8*i, U64(math.Float64bits(v))) // F64 prints 1 as the integer $(1)
	}
	DATA(8*len(vals), U64(31))
	for i, t := range expTable {
		DATA(8*(expTabT/8+i), U64(t))
	}
	DATA(expTabBit4, U64(16))
	expLim = GLOBL("expLim", RODATA|NOPTR)
	DATA(0, U32(math.Float32bits(-0x1.9fe368p6)))
	DATA(4, U32(math.Float32bits(0x1.62e42ep6)))
}

// expTab offsets.
const (
	expTabInvLn2N, expTabShift, expTabC0, expTabC1, expTabC2, expTabOne, expTabMask = 0, 8, 16, 24, 32, 40, 48
	expTabT                                                                         = 56
	expTabBit4                                                                      = expTabT + 8*32 // 16: an index's upper half of the table
)

// expTable is package cpu's expTable: 2^(i/32) less i<<47, as bits.
var expTable = [32]uint64{
	0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51,
	0x3fef72b83c7d517b, 0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1,
	0x3fef06fe0a31b715, 0x3feef1a7373aa9cb, 0x3feedea64c123422, 0x3feece086061892d,
	0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429, 0x3feea47eb03a5585,
	0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
	0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d,
	0x3feee89f995ad3ad, 0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069,
	0x3fef5818dcfba487, 0x3fef7c97337b9b5f, 0x3fefa4afa2a490da, 0x3fefd0765b6e4540,
}

// expZ returns expf (glibc's) of the 16 float32 lanes of z: each half in
// float64, 2^(k/32) looked up in expTab's 32 entries (held in four
// registers: two two-register permutes, chosen between by the index's bit
// 4, where a gather would wait on memory), then the limits and NaN blended
// in.
func expZ(z reg.VecVirtual) reg.VecVirtual {
	at := func(off int) Mem { return expTab.Offset(off) }
	var tab [4]reg.VecVirtual
	for i := range tab {
		tab[i] = ZMM()
		VMOVUPD(at(expTabT+64*i), tab[i])
	}
	hiY := YMM()
	VEXTRACTF64X4(Imm(1), z, hiY)
	lo, hi := ZMM(), ZMM()
	VCVTPS2PD(z.AsY(), lo)
	VCVTPS2PD(hiY, hi)
	for _, h := range []reg.VecVirtual{lo, hi} {
		zz := ZMM()
		VMULPD_BCST(at(expTabInvLn2N), h, zz) // z = x*32/ln 2
		kd := ZMM()
		VADDPD_BCST(at(expTabShift), zz, kd) // its low bits hold k
		idx := ZMM()
		VPANDQ_BCST(at(expTabMask), kd, idx)
		s, s2, up := ZMM(), ZMM(), K()
		VMOVDQA64(idx, s)
		VPERMI2PD(tab[1], tab[0], s) // entries 0..15 by the index's low 4 bits
		VMOVDQA64(idx, s2)
		VPERMI2PD(tab[3], tab[2], s2) // 16..31
		VPTESTMQ_BCST(at(expTabBit4), idx, up)
		VMOVDQA64(s2, up, s)
		e := ZMM()
		VPSLLQ(Imm(47), kd, e)
		VPADDQ(e, s, s) // s = 2^(k/32)
		r := ZMM()
		VSUBPD_BCST(at(expTabShift), kd, r)
		VSUBPD(r, zz, r) // r = z - k
		p, q, r2 := ZMM(), ZMM(), ZMM()
		VBROADCASTSD(at(expTabC0), p)
		VFMADD213PD_BCST(at(expTabC1), r, p) // C0*r + C1
		VBROADCASTSD(at(expTabC2), q)
		VFMADD213PD_BCST(at(expTabOne), r, q) // C2*r + 1
		VMULPD(r, r, r2)
		VFMADD213PD(q, r2, p) // (C0*r + C1)*r² + (C2*r + 1)
		VMULPD(s, p, p)
		VCVTPD2PS(p, h.AsY())
	}
	out := ZMM()
	VINSERTF64X4(Imm(1), hi.AsY(), lo, out)
	// Below the low limit 0, above the high one +Inf, NaN x+x.
	lim, kl, kh, kn := ZMM(), K(), K(), K()
	VBROADCASTSS(expLim.Offset(0), lim)
	VCMPPS(Imm(0x11), lim, z, kl) // z < lo, ordered
	VBROADCASTSS(expLim.Offset(4), lim)
	VCMPPS(Imm(0x1e), lim, z, kh) // z > hi, ordered
	VCMPPS(Imm(0x03), z, z, kn)   // unordered
	zero, t := ZMM(), GP32()
	VXORPS(zero, zero, zero)
	VBLENDMPS(zero, out, kl, out)
	inf := ZMM()
	MOVL(U32(0x7f800000), t)
	VPBROADCASTD(t, inf)
	VBLENDMPS(inf, out, kh, out)
	nan := ZMM()
	VADDPS(z, z, nan)
	VBLENDMPS(nan, out, kn, out)
	return out
}

// expSub emits func(n int, x *float32, sub float32, dst *float32):
// dst[i] = expf(x[i] - sub).
func expSub() {
	TEXT("expSubAVX512", NOSPLIT, "func(n int, x *float32, sub float32, dst *float32)")
	Pragma("noescape")
	Doc("expSubAVX512 sets dst[i] = expf(x[i] - sub) for i < n.")
	n := param("n")
	x := param("x")
	dst := param("dst")
	sx := XMM()
	Load(Param("sub"), sx)
	sub := ZMM()
	VBROADCASTSS(sx, sub)
	body := func(k reg.OpmaskVirtual) {
		z := ZMM()
		if k == nil {
			VMOVUPS(Mem{Base: x}, z)
		} else {
			VMOVUPS_Z(Mem{Base: x}, k, z)
		}
		VSUBPS(sub, z, z)
		e := expZ(z)
		if k == nil {
			VMOVUPS(e, Mem{Base: dst})
		} else {
			VMOVUPS(e, k, Mem{Base: dst})
		}
	}
	Label("loop")
	CMPQ(n, Imm(16))
	JL(LabelRef("tail"))
	body(nil)
	ADDQ(Imm(64), x)
	ADDQ(Imm(64), dst)
	SUBQ(Imm(16), n)
	JMP(LabelRef("loop"))
	Label("tail")
	TESTQ(n, n)
	JZ(LabelRef("done"))
	body(tailMask(n))
	Label("done")
	ret()
}

// vexpTab holds vexpZ's float32 constants (see vexpf in package cpu): the
// shift 1.5*2^23, log2(e), ln 2 in two parts, the polynomial's C5..C1, 1,
// 192, +Inf and the absolute-value mask; then vexpY's integer 127.
var vexpTab Mem

func vexpConsts() {
	vexpTab = GLOBL("vexpTab", RODATA|NOPTR)
	vals := []float32{0x1.8p23, 0x1.715476p+0, 0x1.62e4p-1, 0x1.7f7d1cp-20,
		0x1.0e4020p-7, 0x1.573e2ep-5, 0x1.555e66p-3, 0x1.fffdb6p-2, 0x1.ffffecp-1, 1, 192}
	for i, v := range vals {
		DATA(4*i, U32(math.Float32bits(v)))
	}
	DATA(4*len(vals), U32(0x7f800000))   // +Inf
	DATA(4*len(vals)+4, U32(0x7fffffff)) // |x| mask
	DATA(4*len(vals)+8, U32(127))        // the exponent bias (vexpY)
}

// vexp offsets into vexpTab.
const (
	vxShift, vxLog2E, vxLn2Hi, vxLn2Lo = 0, 4, 8, 12
	vxC5, vxC4, vxC3, vxC2, vxC1       = 16, 20, 24, 28, 32
	vxOne, vx192, vxInf, vxAbs, vxBias = 36, 40, 44, 48, 52
)

// vexpZ returns ggml_v_expf of the 16 float32 lanes of x (vexpf in package
// cpu), every FMA as ggml's source writes it.
func vexpZ(x reg.VecVirtual) reg.VecVirtual {
	at := func(off int) Mem { return vexpTab.Offset(off) }
	shift, z := ZMM(), ZMM()
	VBROADCASTSS(at(vxShift), shift)
	VBROADCASTSS(at(vxLog2E), z)
	VFMADD213PS(shift, x, z) // z = x*log2(e) + shift
	n := ZMM()
	VSUBPS(shift, z, n) // n = z - shift
	b := ZMM()
	VMOVAPS(x, b)
	VFNMADD231PS_BCST(at(vxLn2Hi), n, b) // b = x - n*ln2Hi
	VFNMADD231PS_BCST(at(vxLn2Lo), n, b) // b -= n*ln2Lo
	u := ZMM()
	VMULPS(b, b, u)
	p, q, l := ZMM(), ZMM(), ZMM()
	VBROADCASTSS(at(vxC5), p)
	VFMADD213PS_BCST(at(vxC4), b, p) // p = C5*b + C4
	VBROADCASTSS(at(vxC3), q)
	VFMADD213PS_BCST(at(vxC2), b, q) // q = C3*b + C2
	VFMADD213PS(q, u, p)             // p = p*u + q
	VBROADCASTSS(at(vxC1), l)
	VFMADD213PS_BCST(at(vxOne), b, l) // l = C1*b + 1
	VFMADD213PS(l, u, p)              // j = p*u + l
	res := ZMM()
	VSCALEFPS(n, p, res) // j * 2^n
	// |n| > 192: +Inf for n > 0, 0 otherwise.
	a, c := ZMM(), ZMM()
	VPANDD_BCST(at(vxAbs), n, a)
	VBROADCASTSS(at(vx192), c)
	far, low := K(), K()
	VCMPPS(Imm(0x1e), c, a, far) // |n| > 192, ordered
	zero, alt := ZMM(), ZMM()
	VXORPS(zero, zero, zero)
	VCMPPS(Imm(0x12), zero, n, low) // n <= 0, ordered
	VBROADCASTSS(at(vxInf), alt)
	VBLENDMPS(zero, alt, low, alt)
	VBLENDMPS(alt, res, far, res)
	return res
}

// swiGLU emits func(n int, gate, up *float32): gate[i] = gate[i] / (1 +
// vexpf(-gate[i])) * up[i], each operation rounded to float32, for n a
// multiple of 16 (ggml's SwiGLU; the Go code does the rest of a row).
func swiGLU() {
	TEXT("swigluAVX512", NOSPLIT, "func(n int, gate, up *float32)")
	Pragma("noescape")
	Doc("swigluAVX512 sets gate[i] = silu(gate[i]) * up[i] for i < n (a multiple of 16), silu with ggml_v_expf.")
	n := param("n")
	g := param("gate")
	u := param("up")
	t := GP32()
	MOVL(U32(0x80000000), t)
	sign := ZMM()
	VPBROADCASTD(t, sign)
	MOVL(U32(0x3f800000), t)
	one := ZMM()
	VPBROADCASTD(t, one)
	Label("loop")
	CMPQ(n, Imm(16))
	JL(LabelRef("done"))
	z, up := ZMM(), ZMM()
	VMOVUPS(Mem{Base: g}, z)
	VMOVUPS(Mem{Base: u}, up)
	neg := ZMM()
	VPXORD(sign, z, neg)
	e := vexpZ(neg)
	VADDPS(one, e, e)
	VDIVPS(e, z, z)
	VMULPS(up, z, z)
	VMOVUPS(z, Mem{Base: g})
	ADDQ(Imm(64), g)
	ADDQ(Imm(64), u)
	SUBQ(Imm(16), n)
	JMP(LabelRef("loop"))
	Label("done")
	ret()
}

// quantQ80 emits func(nb int, x *float32, dst *byte): ggml's x86 Q8_0
// activation quantization (ggml.QuantizeActivationRow): per block of 32,
// d = amax/127, id = 127/amax (0 when amax is 0), q = saturate8(round to
// nearest even(x*id)), d stored as f16 rounded to nearest even.
func quantQ80() {
	TEXT("quantQ80AVX512", NOSPLIT, "func(nb int, x *float32, dst *byte)")
	Pragma("noescape")
	Doc("quantQ80AVX512 quantizes nb blocks of 32 activations to Q8_0.")
	n := param("nb")
	x := param("x")
	dst := param("dst")
	t := GP32()
	MOVL(U32(0x7fffffff), t)
	absMask := ZMM()
	VPBROADCASTD(t, absMask)
	MOVL(U32(0x42fe0000), t) // 127
	c127 := XMM()
	VMOVD(t, c127)
	zero := XMM()
	VXORPS(zero, zero, zero)
	Label("loop")
	TESTQ(n, n)
	JZ(LabelRef("done"))
	a, b := ZMM(), ZMM()
	VMOVUPS(Mem{Base: x}, a)
	VMOVUPS(Mem{Base: x, Disp: 64}, b)
	m := ZMM()
	VPANDD(absMask, a, m)
	mb := ZMM()
	VPANDD(absMask, b, mb)
	VMAXPS(mb, m, m)
	y := YMM()
	VEXTRACTF64X4(Imm(1), m, y)
	VMAXPS(y, m.AsY(), y)
	xx := XMM()
	VEXTRACTF32X4(Imm(1), y, xx)
	VMAXPS(xx, y.AsX(), xx)
	h := XMM()
	VMOVHLPS(xx, xx, h)
	VMAXPS(h, xx, xx)
	VMOVSHDUP(xx, h)
	VMAXSS(h, xx, xx) // amax
	d := XMM()
	VDIVSS(c127, xx, d) // amax / 127
	VCVTPS2PH(Imm(0), d, d)
	VPEXTRW(Imm(0), d, Mem{Base: dst})
	k := K()
	VCMPSS(Imm(4), zero, xx, k) // amax != 0
	id := XMM()
	VDIVSS_Z(xx, c127, k, id) // 127 / amax, or 0
	idz := ZMM()
	VBROADCASTSS(id, idz)
	VMULPS(idz, a, a)
	VMULPS(idz, b, b)
	VCVTPS2DQ(a, a)
	VCVTPS2DQ(b, b)
	VPMOVSDB(a, Mem{Base: dst, Disp: 2})
	VPMOVSDB(b, Mem{Base: dst, Disp: 18})
	ADDQ(Imm(128), x)
	ADDQ(Imm(34), dst)
	DECQ(n)
	JMP(LabelRef("loop"))
	Label("done")
	ret()
}

// tile holds the pointers and strides of one kernel call.
type tile struct {
	R, C   int
	n      reg.GPVirtual
	wp, ws reg.GPVirtual
	ws3    reg.GPVirtual
	xp, xs reg.GPVirtual
	xs3    reg.GPVirtual
	// out, where set, holds the output address (a rows kernel's, see
	// rowsKernel); else the stores load parameter out.
	out reg.GPVirtual
}

// outPtr returns the register holding the output address: t.out, or
// parameter out loaded.
func (t *tile) outPtr() reg.GPVirtual {
	if t.out != nil {
		return t.out
	}
	return param("out")
}

// outStride returns parameter os loaded, for a tile of more than one
// activation row; nil for one, whose outputs need no stride (and a rows
// kernel has no os).
func (t *tile) outStride() reg.GPVirtual {
	if t.C == 1 {
		return nil
	}
	return param("os")
}

func param(name string) reg.GPVirtual {
	r := GP64()
	Load(Param(name), r)
	return r
}

func newTile(r, c int) *tile {
	t := &tile{R: r, C: c}
	t.n = param("n")
	t.wp = param("w")
	t.ws = param("ws")
	t.xp = param("x")
	t.xs = param("xs")
	if r > 3 {
		t.ws3 = GP64()
		LEAQ(Mem{Base: t.ws, Index: t.ws, Scale: 2}, t.ws3)
	}
	if c > 3 {
		t.xs3 = GP64()
		LEAQ(Mem{Base: t.xs, Index: t.xs, Scale: 2}, t.xs3)
	}
	return t
}

// w returns the address of weight row r at byte offset disp.
func (t *tile) w(r, disp int) Mem { return rowMem(t.wp, t.ws, t.ws3, r, disp) }

// x returns the address of activation row c at byte offset disp.
func (t *tile) x(c, disp int) Mem { return rowMem(t.xp, t.xs, t.xs3, c, disp) }

func rowMem(base, stride, stride3 reg.GPVirtual, i, disp int) Mem {
	switch i {
	case 0:
		return Mem{Base: base, Disp: disp}
	case 1:
		return Mem{Base: base, Index: stride, Scale: 1, Disp: disp}
	case 2:
		return Mem{Base: base, Index: stride, Scale: 2, Disp: disp}
	case 3:
		return Mem{Base: base, Index: stride3, Scale: 1, Disp: disp}
	}
	panic("row index out of range")
}

// zeroAcc returns R×C zeroed ZMM accumulators.
func (t *tile) zeroAcc() [][]reg.VecVirtual {
	acc := make([][]reg.VecVirtual, t.R)
	for r := range acc {
		acc[r] = make([]reg.VecVirtual, t.C)
		for c := range acc[r] {
			acc[r][c] = ZMM()
			VXORPS(acc[r][c], acc[r][c], acc[r][c])
		}
	}
	return acc
}

// advance moves both row pointers by bytes and n down by count.
func (t *tile) advance(bytesW, bytesX, count int) {
	ADDQ(imm(bytesW), t.wp)
	ADDQ(imm(bytesX), t.xp)
	SUBQ(imm(count), t.n)
}

// imm is v as an immediate operand of an ADDQ or SUBQ: 8 bits where it
// fits, else 32.
func imm(v int) Op {
	if v < 128 {
		return Imm(uint64(v))
	}
	return U32(uint32(v))
}

// store folds every accumulator (reduceLanes' tree: +8, +4, +2, +1) and
// writes it to out.
func (t *tile) store(acc [][]reg.VecVirtual) {
	op := t.outPtr()
	os := t.outStride()
	var os3 reg.GPVirtual
	if t.C > 3 {
		os3 = GP64()
		LEAQ(Mem{Base: os, Index: os, Scale: 2}, os3)
	}
	for r := range acc {
		for c := range acc[r] {
			s := foldZ(acc[r][c])
			VMOVSS(s, rowMem(op, os, os3, c, 4*r))
		}
	}
}

// foldZ reduces the 16 lanes of z as reduceLanes does and returns an XMM
// whose lane 0 is the result.
func foldZ(z reg.VecVirtual) reg.VecVirtual {
	y := YMM()
	VEXTRACTF64X4(Imm(1), z, y)
	VADDPS(y, z.AsY(), y) // lane j += lane j+8
	x := XMM()
	VEXTRACTF32X4(Imm(1), y, x) // EVEX: y may be Y16..Y31
	VADDPS(x, y.AsX(), x)       // lane j += lane j+4
	h := XMM()
	VMOVHLPS(x, x, h)
	VADDPS(h, x, x) // lane j += lane j+2
	VMOVSHDUP(x, h)
	VADDSS(h, x, x) // lane 0 += lane 1
	return x
}

// foldY reduces 16 lanes held as lo (lanes 0..7) and hi (8..15).
func foldY(lo, hi reg.VecVirtual) reg.VecVirtual {
	y := YMM()
	VADDPS(hi, lo, y)
	x := XMM()
	VEXTRACTF128(Imm(1), y, x)
	VADDPS(x, y.AsX(), x)
	h := XMM()
	VMOVHLPS(x, x, h)
	VADDPS(h, x, x)
	VMOVSHDUP(x, h)
	VADDSS(h, x, x)
	return x
}

// tailMask sets k to the low n%16 bits (n < 16 here).
func tailMask(n reg.GPVirtual) reg.OpmaskVirtual {
	ones := GP32()
	MOVL(U32(0xffffffff), ones)
	m := GP32()
	BZHIL(n.As32(), ones, m)
	k := K()
	KMOVW(m, k)
	return k
}

// floatLoop emits the 16-lane float loop shared by F32, F16 and BF16. load
// loads 16 elements of a row into a ZMM (mask nil: all; else zero-masked
// tail); esz is the element size in bytes; fma adds the products of one
// weight vector and one activation vector into acc (mask nil: all lanes).
func (t *tile) floatLoop(esz int, load func(m Mem, k reg.OpmaskVirtual) reg.VecVirtual, fma func(w, x, acc reg.VecVirtual, k reg.OpmaskVirtual)) {
	acc := t.zeroAcc()
	body := func(k reg.OpmaskVirtual) {
		xv := make([]reg.VecVirtual, t.C)
		for c := range xv {
			xv[c] = load(t.x(c, 0), k)
		}
		for r := 0; r < t.R; r++ {
			wv := load(t.w(r, 0), k)
			for c := range xv {
				fma(wv, xv[c], acc[r][c], k)
			}
		}
	}
	Label("loop")
	CMPQ(t.n, Imm(16))
	JL(LabelRef("tail"))
	prefetchAhead(t.wp, 16*esz)
	body(nil)
	t.advance(16*esz, 16*esz, 16)
	JMP(LabelRef("loop"))
	Label("tail")
	TESTQ(t.n, t.n)
	JZ(LabelRef("done"))
	body(tailMask(t.n))
	Label("done")
	t.store(acc)
}

// maskTab is 16 int32 -1s then 16 zeros: the 16 lanes' masks for a tail
// of r elements start at byte 4*(16-r).
var maskTab Mem

func maskConsts() {
	maskTab = GLOBL("maskTab", RODATA|NOPTR)
	for i := 0; i < 32; i++ {
		v := uint32(0)
		if i < 16 {
			v = 0xffffffff
		}
		DATA(4*i, U32(v))
	}
}

// f32AVX2 is DotF32's order with 16 lanes held in two YMM registers (lanes
// 0..7 and 8..15); the tail FMA is blended so that lanes past it keep their
// value, as the masked AVX-512 FMA does.
func f32AVX2(t *tile) {
	type pair struct{ lo, hi reg.VecVirtual }
	acc := make([][]pair, t.R)
	for r := range acc {
		acc[r] = make([]pair, t.C)
		for c := range acc[r] {
			acc[r][c] = pair{YMM(), YMM()}
			VXORPS(acc[r][c].lo, acc[r][c].lo, acc[r][c].lo)
			VXORPS(acc[r][c].hi, acc[r][c].hi, acc[r][c].hi)
		}
	}
	Label("loop")
	CMPQ(t.n, Imm(16))
	JL(LabelRef("tail"))
	prefetchAhead(t.wp, 64)
	xv := make([]pair, t.C)
	for c := range xv {
		xv[c] = pair{YMM(), YMM()}
		VMOVUPS(t.x(c, 0), xv[c].lo)
		VMOVUPS(t.x(c, 32), xv[c].hi)
	}
	for r := 0; r < t.R; r++ {
		wlo, whi := YMM(), YMM()
		VMOVUPS(t.w(r, 0), wlo)
		VMOVUPS(t.w(r, 32), whi)
		for c := range xv {
			VFMADD231PS(wlo, xv[c].lo, acc[r][c].lo)
			VFMADD231PS(whi, xv[c].hi, acc[r][c].hi)
		}
	}
	t.advance(64, 64, 16)
	JMP(LabelRef("loop"))
	Label("tail")
	TESTQ(t.n, t.n)
	JZ(LabelRef("done"))
	// Masks for lanes 0..n-1: maskTab + 4*(16-n).
	off := GP64()
	MOVQ(U32(16), off)
	SUBQ(t.n, off)
	tab := GP64()
	LEAQ(maskTab, tab)
	mlo, mhi := YMM(), YMM()
	VMOVDQU(Mem{Base: tab, Index: off, Scale: 4}, mlo)
	VMOVDQU(Mem{Base: tab, Index: off, Scale: 4, Disp: 32}, mhi)
	// Reload the activations per weight row: AVX2 has 16 registers.
	for r := 0; r < t.R; r++ {
		for hf, m := range []reg.VecVirtual{mlo, mhi} {
			w := YMM()
			VMASKMOVPS(t.w(r, 32*hf), m, w)
			for c := 0; c < t.C; c++ {
				a := acc[r][c].lo
				if hf == 1 {
					a = acc[r][c].hi
				}
				x := YMM()
				VMASKMOVPS(t.x(c, 32*hf), m, x)
				VFMADD213PS(a, w, x)  // x = w*x + acc
				VBLENDVPS(m, x, a, a) // lanes in the tail take the FMA
			}
		}
	}
	Label("done")
	op := t.outPtr()
	os := t.outStride()
	for r := range acc {
		for c := range acc[r] {
			s := foldY(acc[r][c].lo, acc[r][c].hi)
			if c == 0 {
				VMOVSS(s, Mem{Base: op, Disp: 4 * r})
			} else {
				VMOVSS(s, Mem{Base: op, Index: os, Scale: 1, Disp: 4 * r})
			}
		}
	}
}

// f32AVX512 is DotF32's order: one FMA per element into lane i%16.
func f32AVX512(t *tile) {
	t.floatLoop(4, func(m Mem, k reg.OpmaskVirtual) reg.VecVirtual {
		z := ZMM()
		if k == nil {
			VMOVUPS(m, z)
		} else {
			VMOVUPS_Z(m, k, z)
		}
		return z
	}, fmaMasked)
}

func fmaMasked(w, x, acc reg.VecVirtual, k reg.OpmaskVirtual) {
	if k == nil {
		VFMADD231PS(w, x, acc)
	} else {
		VFMADD231PS(w, x, k, acc)
	}
}

// f16AVX512 converts both rows with VCVTPH2PS; the product of two halves is
// exact in float32, so the FMA equals dotF16's rounded product plus add.
func f16AVX512(t *tile) {
	t.floatLoop(2, func(m Mem, k reg.OpmaskVirtual) reg.VecVirtual {
		z := ZMM()
		if k == nil {
			VCVTPH2PS(m, z)
		} else {
			y := YMM()
			VMOVDQU16_Z(m, k, y)
			VCVTPH2PS(y, z)
		}
		return z
	}, fmaMasked)
}

// bf16AVX512 widens both rows (bf16 << 16) and adds each product with one
// FMA, as dotBF16 does.
func bf16AVX512(t *tile) {
	t.floatLoop(2, func(m Mem, k reg.OpmaskVirtual) reg.VecVirtual {
		z := ZMM()
		if k == nil {
			VPMOVZXWD(m, z)
		} else {
			VPMOVZXWD_Z(m, k, z)
		}
		VPSLLD(Imm(16), z, z)
		return z
	}, fmaMasked)
}

const (
	q80 = 34
	q40 = 18
)

// f32ToF16 emits func(n int, src *float32, dst *uint16): dst[i] =
// ggml.F32ToF16(src[i]), which is VCVTPS2PH with round to nearest even
// (imm 0) for every input, NaNs, infinities and subnormals included.
func f32ToF16() {
	TEXT("f32ToF16AVX512", NOSPLIT, "func(n int, src *float32, dst *uint16)")
	Pragma("noescape")
	Doc("f32ToF16AVX512 sets dst[i] = ggml.F32ToF16(src[i]) for i < n.")
	n := param("n")
	src := param("src")
	dst := param("dst")
	Label("loop")
	CMPQ(n, Imm(16))
	JL(LabelRef("tail"))
	z := ZMM()
	VMOVUPS(Mem{Base: src}, z)
	VCVTPS2PH(Imm(0), z, Mem{Base: dst})
	ADDQ(Imm(64), src)
	ADDQ(Imm(32), dst)
	SUBQ(Imm(16), n)
	JMP(LabelRef("loop"))
	Label("tail")
	TESTQ(n, n)
	JZ(LabelRef("done"))
	k := tailMask(n)
	VMOVUPS_Z(Mem{Base: src}, k, z)
	VCVTPS2PH(Imm(0), z, k, Mem{Base: dst})
	Label("done")
	ret()
}

// f16Scale emits func(n int, src *uint16, scale float32, dst *float32):
// dst[i] = f16(src[i]) * scale, rounded to float32.
func f16Scale() {
	TEXT("f16ScaleAVX512", NOSPLIT, "func(n int, src *uint16, scale float32, dst *float32)")
	Pragma("noescape")
	Doc("f16ScaleAVX512 sets dst[i] = float32(src[i]) * scale for i < n, src in f16.")
	n := param("n")
	src := param("src")
	dst := param("dst")
	sx := XMM()
	Load(Param("scale"), sx)
	sc := ZMM()
	VBROADCASTSS(sx, sc)
	z := ZMM()
	Label("loop")
	CMPQ(n, Imm(16))
	JL(LabelRef("tail"))
	VCVTPH2PS(Mem{Base: src}, z)
	VMULPS(sc, z, z)
	VMOVUPS(z, Mem{Base: dst})
	ADDQ(Imm(32), src)
	ADDQ(Imm(64), dst)
	SUBQ(Imm(16), n)
	JMP(LabelRef("loop"))
	Label("tail")
	TESTQ(n, n)
	JZ(LabelRef("done"))
	k := tailMask(n)
	VCVTPH2PS_Z(Mem{Base: src}, k, z)
	VMULPS(sc, z, z)
	VMOVUPS(z, k, Mem{Base: dst})
	Label("done")
	ret()
}

// softmaxValues emits Attend's value accumulation over m consecutive keys of
// one block for H heads (1 or 2; see softmaxValuesSIMD in package cpu):
//
//	func(hd int, acc *T, v *byte, voff int, stride int, m int, ms, vs *float32)
//
// Head h's accumulator is at acc + h*hd elements, its values of key j at
// v + h*voff + j*stride, its weights at ms, vs + h*64 elements. For key
// j < m and each head: when ms[j] != 1, acc = round(acc * ms[j]); then acc =
// round(fma(v_j, vs[j], acc)), where round is VCVTPS2PH's round to nearest
// even to f16 for an f16 accumulator and nothing (the FMA's float32
// rounding) for a float32 one. Skipping the rescale by exactly 1 changes
// nothing: acc only ever holds results of VCVTPS2PH or of arithmetic, never
// a signalling NaN. Each head's accumulator is processed in passes of 64
// elements held in four ZMM registers, so that 4*H independent dependency
// chains run per key.
func softmaxValues(f16 bool, H int) {
	const U = 4
	vk, rem, accp, vp, one := valueHead(f16, H, "AVX512", 16, "")
	Label("pass")
	var ks [U]reg.OpmaskVirtual
	for i := range ks {
		t := GP64()
		MOVQ(rem, t)
		if i > 0 {
			SUBQ(Imm(uint64(16*i)), t)
		}
		z := GP64()
		XORQ(z, z)
		CMPQ(t, Imm(0))
		CMOVQLT(z, t)
		MOVQ(U32(16), z)
		CMPQ(t, Imm(16))
		CMOVQGT(z, t) // clamp to 0..16: BZHI reads the index's low byte only
		ks[i] = tailMask(t)
	}
	vk.U = U
	vk.load = func(m Mem, i int, z reg.VecVirtual) {
		if f16 {
			VCVTPH2PS_Z(m, ks[i], z)
		} else {
			VMOVUPS_Z(m, ks[i], z)
		}
	}
	vk.store = func(z reg.VecVirtual, i int, m Mem) {
		if f16 {
			VCVTPS2PH(Imm(0), z, ks[i], m)
		} else {
			VMOVUPS(z, ks[i], m)
		}
	}
	rescales := vk.keys(accp, vp, one, "")
	SUBQ(Imm(16*U), rem)
	JG(LabelRef("pass"))
	ret()
	rescales()
}

// valueHead starts value kernel softmax{F16,F32}x{H}{isa} (more ends its
// doc): it returns the kernel's description for vectors of lanes elements
// (accMem set; U, load and store are the caller's), the head dimension
// left (rem, counted down by the passes), the accumulator and value
// pointers, and 1.0 in an XMM.
func valueHead(f16 bool, H int, isa string, lanes int, more string) (vk valueKernel, rem, accp, vp reg.GPVirtual, one reg.VecVirtual) {
	name, esz, accType := "softmaxF32", 4, "*float32"
	if f16 {
		name, esz, accType = "softmaxF16", 2, "*uint16"
	}
	name += fmt.Sprintf("x%d%s", H, isa)
	TEXT(name, NOSPLIT, "func(hd int, acc "+accType+", v *byte, voff int, stride int, m int, ms, vs *float32)")
	Pragma("noescape")
	Doc(name + fmt.Sprintf(" accumulates m keys' values of %d heads into acc with Attend's online-softmax weights ms, vs%s.", H, more))
	rem = param("hd")
	accp = param("acc")
	vp = param("v")
	g := GP32()
	MOVL(U32(0x3f800000), g)
	one = XMM()
	VMOVD(g, one)
	hdB := GP64() // head 1's accumulator, bytes after head 0's
	if H > 1 {
		Load(Param("hd"), hdB)
		SHLQ(Imm(uint64(map[int]int{2: 1, 4: 2}[esz])), hdB)
	}
	vk = valueKernel{f16: f16, H: H, esz: esz, lanes: lanes}
	vk.accMem = func(h, i int) Mem {
		m := Mem{Base: accp, Disp: lanes * esz * i}
		if h > 0 {
			m.Index, m.Scale = hdB, 1
		}
		return m
	}
	return vk, rem, accp, vp, one
}

// valueKernel describes one pass of a value kernel (softmaxValues,
// softmaxValuesAVX2): H heads, U vectors of lanes elements each per head,
// esz-byte elements (16 lanes: ZMM registers, 8: YMM); accMem addresses
// accumulator vector i of head h; load and store move vector i of the
// accumulators or of a value row (masked to the head dimension where the
// ISA can, on AVX-512).
type valueKernel struct {
	f16       bool
	H, U, esz int
	lanes     int
	accMem    func(h, i int) Mem
	load      func(m Mem, i int, v reg.VecVirtual)
	store     func(v reg.VecVirtual, i int, m Mem)
}

// vec makes a vector register of k's width.
func (k valueKernel) vec() reg.VecVirtual {
	if k.lanes == 16 {
		return ZMM()
	}
	return YMM()
}

// keys emits a pass: the accumulators loaded, the m keys' steps (for each
// head, a rescale by ms where it is not 1, then acc = round(fma(v_j,
// vs[j], acc))), the accumulators stored and acc and v moved on a pass. It
// returns the emitter of the rescale blocks the key loop jumps to, for the
// caller to place after its loop. Labels carry prefix.
func (k valueKernel) keys(accp, vp reg.GPVirtual, one reg.VecVirtual, prefix string) (rescales func()) {
	H, U := k.H, k.U
	var a [2][4]reg.VecVirtual
	for h := 0; h < H; h++ {
		for i := range U {
			a[h][i] = k.vec()
			k.load(k.accMem(h, i), i, a[h][i])
		}
	}
	round := func(z reg.VecVirtual) {
		if !k.f16 {
			return
		}
		if k.lanes == 16 {
			y := YMM()
			VCVTPS2PH(Imm(0), z, y)
			VCVTPH2PS(y, z)
			return
		}
		x := XMM()
		VCVTPS2PH(Imm(0), z, x)
		VCVTPH2PS(x, z)
	}
	cnt := param("m")
	msp := param("ms")
	vsp := param("vs")
	stride := param("stride")
	row := GP64()
	MOVQ(vp, row)
	var voff reg.GPVirtual
	if H > 1 {
		voff = param("voff")
	}
	Label(prefix + "key")
	for h := 0; h < H; h++ {
		VUCOMISS(Mem{Base: msp, Disp: 4 * softmaxChunk * h}, one)
		JNE(LabelRef(fmt.Sprintf("%srescale%d", prefix, h)))
		JPS(LabelRef(fmt.Sprintf("%srescale%d", prefix, h)))
		Label(fmt.Sprintf("%svalues%d", prefix, h))
	}
	for h := 0; h < H; h++ {
		b := k.vec()
		VBROADCASTSS(Mem{Base: vsp, Disp: 4 * softmaxChunk * h}, b)
		for i := range U {
			m := Mem{Base: row, Disp: k.lanes * k.esz * i}
			if h > 0 {
				m.Index, m.Scale = voff, 1
			}
			t := k.vec()
			k.load(m, i, t)
			VFMADD231PS(b, t, a[h][i])
			round(a[h][i])
		}
	}
	ADDQ(stride, row)
	ADDQ(Imm(4), msp)
	ADDQ(Imm(4), vsp)
	DECQ(cnt)
	JNZ(LabelRef(prefix + "key"))
	for h := 0; h < H; h++ {
		for i := range U {
			k.store(a[h][i], i, k.accMem(h, i))
		}
	}
	ADDQ(U32(uint32(k.lanes*U*k.esz)), accp)
	ADDQ(U32(uint32(k.lanes*U*k.esz)), vp) // the value rows have acc's type
	return func() {
		for h := 0; h < H; h++ {
			Label(fmt.Sprintf("%srescale%d", prefix, h))
			bm := k.vec()
			VBROADCASTSS(Mem{Base: msp, Disp: 4 * softmaxChunk * h}, bm)
			for i := range U {
				VMULPS(bm, a[h][i], a[h][i])
				round(a[h][i])
			}
			JMP(LabelRef(fmt.Sprintf("%svalues%d", prefix, h)))
		}
	}
}

// blockAVX2 is the order of dotQ40Q80 (Q4_0, IQ4_NL) with AVX2: one float32
// accumulator per output (lane 0 of an XMM). Each block's quants are
// sign-extended to int16, VPMADDWD sums the products in pairs and the pairs
// are added to one int32, exactly (no VPMADDUBSW, whose int16 sums
// saturate); then acc = fma(float32(sum), f16(w.d)*f16(x.d), acc). wquants
// loads the int16 weights of the block of row r (elements 0..15, 16..31).
func (t *tile) blockAVX2(wsz int, wquants func(r, disp int) (reg.VecVirtual, reg.VecVirtual)) {
	t.blockAVX2Q(wsz, q80, 2, false, wquants)
}

// blockAVX2Q is blockAVX2 for activation blocks of xsz bytes whose 32
// quants start at byte xq (Q8_0: 34, 2; Q8_1: 36, 4). With mins (Q5_1's
// weights on Q8_1), each block then adds acc = fma(f16(w.m), f16(x.s), acc),
// w.m the f16 at byte 2 of the weight block and x.s that of the activation
// block: dotQ51Q81's order.
func (t *tile) blockAVX2Q(wsz, xsz, xq int, mins bool, wquants func(r, disp int) (reg.VecVirtual, reg.VecVirtual)) {
	acc := make([][]reg.VecVirtual, t.R)
	for r := range acc {
		acc[r] = make([]reg.VecVirtual, t.C)
		for c := range acc[r] {
			acc[r][c] = XMM()
			VXORPS(acc[r][c], acc[r][c], acc[r][c])
		}
	}
	Label("loop")
	TESTQ(t.n, t.n)
	JZ(LabelRef("done"))
	xd := make([]reg.VecVirtual, t.C)
	for c := range xd {
		xd[c] = XMM()
		VPBROADCASTW(t.x(c, 0), xd[c])
		VCVTPH2PS(xd[c], xd[c])
	}
	for r := 0; r < t.R; r++ {
		wa, wb := wquants(r, 0)
		wd := XMM()
		VPBROADCASTW(t.w(r, 0), wd)
		VCVTPH2PS(wd, wd)
		var wm reg.VecVirtual
		if mins {
			wm = XMM()
			VPBROADCASTW(t.w(r, 2), wm)
			VCVTPH2PS(wm, wm)
		}
		for c := 0; c < t.C; c++ {
			xa, xb := YMM(), YMM()
			VPMOVSXBW(t.x(c, xq), xa)
			VPMOVSXBW(t.x(c, xq+16), xb)
			VPMADDWD(wa, xa, xa)
			VPMADDWD(wb, xb, xb)
			VPADDD(xb, xa, xa)
			s := XMM()
			VEXTRACTI128(Imm(1), xa, s)
			VPADDD(xa.AsX(), s, s)
			h := XMM()
			VPSHUFD(Imm(0x4e), s, h)
			VPADDD(h, s, s)
			VPSHUFD(Imm(0xb1), s, h)
			VPADDD(h, s, s) // lane 0: the exact sum of the block
			VCVTDQ2PS(s, s)
			dd := XMM()
			VMULSS(xd[c], wd, dd)
			VFMADD231SS(dd, s, acc[r][c])
			if mins {
				xm := XMM()
				VPBROADCASTW(t.x(c, 2), xm)
				VCVTPH2PS(xm, xm)
				VFMADD231SS(xm, wm, acc[r][c]) // acc = w.m*x.s + acc, rounded once
			}
		}
	}
	t.advance(wsz, xsz, 1)
	JMP(LabelRef("loop"))
	Label("done")
	op := t.outPtr()
	os := t.outStride()
	for r := range acc {
		for c := range acc[r] {
			if c == 0 {
				VMOVSS(acc[r][c], Mem{Base: op, Disp: 4 * r})
			} else {
				VMOVSS(acc[r][c], Mem{Base: op, Index: os, Scale: 1, Disp: 4 * r})
			}
		}
	}
}

// Panel kernels. Weights of type Q8_0 and Q4_0 are repacked (repack.go in
// package cpu) into panels of 16 rows: for each 32-element block in order,
// the 16 rows' f16 scales (32 bytes), then the quants with row i's bytes in
// int32 lane i of every 64-byte vector — Q8_0: eight vectors, vector k
// holding elements 4k..4k+3 plus 128 (as unsigned bytes); Q4_0: four
// vectors, vector j holding the block's bytes 4j..4j+3 (low nibbles are
// elements 4j.., high nibbles 16+4j..). Activation rows are expanded to 40
// bytes per block: float32 scale, int32 correction (-128 or -8 times the
// sum of the block's quants), the 32 int8 quants. A kernel computes one
// panel against C activation rows: for each block, the correction starts an
// int32 sum per lane, VPDPBUSD adds the products of the unsigned weight
// bytes with the activation's four bytes broadcast, which leaves the exact
// integer dot product of each row's block; then acc = fma(float32(sum),
// wd*xd, acc) per lane. That is dotQ40Q80's order for each of the 16 rows
// (Q4_0, IQ4_NL). Q8_0's panels are q80LanePanel's (lanes.go), in ggml's
// eight-lane order; panelKernel's Q8_0 variant is no longer generated.

// panelSignature is the panel kernels' signature: nb blocks, the panel at
// w, activation rows x, x+xs, …, and row c's 16 outputs at out + c*os.
const panelSignature = "func(nb int, w *byte, x *byte, xs int, out *float32, os int)"

// maxPanelC bounds the activation rows of a panel kernel.
const maxPanelC = 8

const xBlock = 40 // bytes of an expanded activation block

// vpdpbusdBcst emits VPDPBUSD with its signed operand a dword in memory
// broadcast to every lane.
func vpdpbusdBcst(m Mem, u, acc Op) {
	Instruction(&ir.Instruction{
		Opcode:   "VPDPBUSD",
		Suffixes: []string{"BCST"},
		Operands: []Op{m, u, acc},
		Inputs:   []Op{m, u, acc},
		Outputs:  []Op{acc},
		ISA:      []string{"AVX512_VNNI"},
	})
}

// rowsSignature is the signature of the rows kernels (rowsKernel).
const rowsSignature = "func(n int, w *byte, ws int, x *byte, out *float32, rows int)"

// rowsKernel emits name_rows (name_rowsAhead where ahead is set): gen's 1×1
// tile in a loop over rows ≥ 1 weight rows, the first at w, one every ws
// bytes, against the one activation row at x: out[i] = the 1×1 tile of
// weight row i, bit for bit. A matrix-vector product calls it once for a
// run of rows, where it would call the 1×1 tile once a row: each call from
// Go costs a few nanoseconds, and a token of a 110M model is ~127,000 rows.
func rowsKernel(name string, gen func(t *tile)) {
	fn := name + "_rows"
	doc := fmt.Sprintf("%s computes the dot products of rows weight rows with one activation row, each as %s_1x1 does.", fn, name)
	if ahead > 0 {
		fn += "Ahead"
		doc = fmt.Sprintf("%s is %s_rows with a software prefetch %d bytes ahead of its weights.", fn, name, ahead)
	}
	TEXT(fn, NOSPLIT, rowsSignature)
	Pragma("noescape")
	Doc(doc)
	n, w, ws, x := param("n"), param("w"), param("ws"), param("x")
	out, rows := param("out"), param("rows")
	Label("row")
	t := &tile{R: 1, C: 1, n: GP64(), wp: GP64(), xp: GP64(), out: out}
	MOVQ(n, t.n)
	MOVQ(w, t.wp)
	MOVQ(x, t.xp)
	gen(t)
	ADDQ(ws, w)
	ADDQ(Imm(4), out)
	DECQ(rows)
	JNZ(LabelRef("row"))
	ret()
}

// matVecAhead is how far ahead of its weights, in bytes, a matrix-vector
// kernel (one activation row) prefetches in its Ahead variant: a page, so
// that the weight stream does not stall where it crosses into the next
// 4 KiB page, as Intel's hardware prefetchers stop there. On a 2-core
// Intel Xeon (Emerald Rapids) 2048 to 8192 bytes gave the same speeds,
// 1024 less, 512 little (BenchmarkForward BF16 and F16 tg, one thread,
// 35 tok/s without, 52–55 from 2048 on); on AMD's Zen 5 they gained
// nothing outside the noise in session 12 and 9–28 % in session 19
// (docs/performance-history.md, Zen 5), so the Go side picks the Ahead
// variants by vendor (aheadOn and aheadEnv in package cpu).
const matVecAhead = 4096

// halfAhead is matVecAhead for the f16 and bf16 matrix-vector tiles, two
// pages. On a 2-core AMD EPYC Zen 5 (family 26 model 2), one thread, 8192
// bytes made their generation 1.09× llama.cpp's where 4096 made it 0.96×
// (BF16; F16 1.19× against 1.12×: vs-llamacpp bench tg64 against
// llama-bench, medians of 5 alternated rounds, session 20), and
// BenchmarkForward tg 3–15 % faster (BF16 in three alternated runs, F16
// in one); 16384 was no better. The same distance cost F32 (1.06× against 1.18×)
// and Q6_K and left the other panels level, so they keep 4096. On the
// Intel Xeon above, 2048 to 8192 gave the same speeds.
const halfAhead = 8192

// ahead is the prefetch distance of the kernels being emitted: 0, or
// matVecAhead (halfAhead) inside withAhead, where main emits the Ahead
// variants of the float rows kernels and the C = 1 panels. The generators
// read it (panelText, rowsKernel, prefetchAhead) rather than take it as a
// parameter, which every panel generator and its callers would carry for
// the one call in each that emits an Ahead variant.
var ahead int

// withAhead runs emit with ahead set to d, then 0 again; d = 0 emits
// nothing.
func withAhead(d int, emit func()) {
	if d == 0 {
		return
	}
	ahead = d
	defer func() { ahead = 0 }()
	emit()
}

// panelText starts panel kernel name_C (name_CAhead when ahead is set),
// whose doc says it computes what weights against C activation rows, with
// more (" in ggml's eight-lane order", say) after that.
func panelText(name, what string, C int, more string) {
	panelTextAttr(NOSPLIT, name, what, C, more)
}

// panelTextAttr is panelText with TEXT's attribute a: 0 for the kernels
// whose stack passes the nosplit limit.
func panelTextAttr(a attr.Attribute, name, what string, C int, more string) {
	fn := fmt.Sprintf("%s_%d", name, C)
	doc := fmt.Sprintf("%s computes a 16-row panel of %s weights against %d activation rows%s.", fn, what, C, more)
	if ahead > 0 {
		doc = fmt.Sprintf("%sAhead is %s with a software prefetch %d bytes ahead of its weights.", fn, fn, ahead)
		fn += "Ahead"
	}
	TEXT(fn, a, panelSignature)
	Pragma("noescape")
	Doc(doc)
}

// prefetchAhead prefetches, when ahead is set, the lines of the bytes of
// weights at wp+ahead that one iteration of a loop reads at wp (a panel,
// or a 1×1 tile's one weight row).
func prefetchAhead(wp reg.GPVirtual, bytes int) {
	if ahead == 0 {
		return
	}
	for d := 0; d < bytes; d += 64 {
		PREFETCHT0(Mem{Base: wp, Disp: ahead + d})
	}
}

// panelKernel emits name_C for Q8_0 or, with q4, for Q4_0's nibbles; with
// lut as well, for IQ4_NL, whose nibbles (Q4_0's panels) are looked up in
// the levels plus 128 (iq4Table) and whose activations' correction is -128
// times their sum, as Q8_0's.
func panelKernel(name, what string, C int, q4, lut bool) {
	panelText(name, what, C, "")
	nb := param("nb")
	wp := param("w")
	xp := param("x")
	xs := param("xs")
	var xs3, xp4 reg.GPVirtual
	if C > 3 {
		xs3 = GP64()
		LEAQ(Mem{Base: xs, Index: xs, Scale: 2}, xs3)
	}
	if C > 4 {
		xp4 = GP64()
		LEAQ(Mem{Base: xp, Index: xs, Scale: 4}, xp4)
	}
	xm := func(c, disp int) Mem {
		if c < 4 {
			return rowMem(xp, xs, xs3, c, disp)
		}
		return rowMem(xp4, xs, xs3, c-4, disp)
	}
	acc := make([]reg.VecVirtual, C)
	for c := range acc {
		acc[c] = ZMM()
		VXORPS(acc[c], acc[c], acc[c])
	}
	var c0f reg.VecVirtual
	if q4 {
		g := GP32()
		MOVL(U32(0x0f0f0f0f), g)
		c0f = ZMM()
		VPBROADCASTD(g, c0f)
	}
	var tbl reg.VecVirtual
	if lut {
		tbl = iq4Table()
	}
	// With one or two rows, each row's sum is split in two chains (even and
	// odd vectors) added at the end — the same integer — so that VPDPBUSD's
	// latency does not serialise the block.
	split := C <= 2
	blockBytes := 32 + 8*64
	if q4 {
		blockBytes = 32 + 4*64
	}
	Label("loop")
	TESTQ(nb, nb)
	JZ(LabelRef("done"))
	prefetchAhead(wp, blockBytes)
	dd := ZMM()
	VCVTPH2PS(Mem{Base: wp}, dd)
	s := make([]reg.VecVirtual, C)
	s2 := make([]reg.VecVirtual, C)
	for c := range s {
		s[c] = ZMM()
		VPBROADCASTD(xm(c, 4), s[c])
		if split {
			s2[c] = ZMM()
			VPXORD(s2[c], s2[c], s2[c])
		}
	}
	dot := func(k int, wv reg.VecVirtual, xoff int) {
		for c := range s {
			a := s[c]
			if split && k%2 == 1 {
				a = s2[c]
			}
			vpdpbusdBcst(xm(c, 8+xoff), wv, a)
		}
	}
	if !q4 {
		for k := range 8 {
			wv := ZMM()
			VMOVDQU64(Mem{Base: wp, Disp: 32 + 64*k}, wv)
			dot(k, wv, 4*k)
		}
	} else {
		for j := range 4 {
			lo := ZMM()
			VMOVDQU64(Mem{Base: wp, Disp: 32 + 64*j}, lo)
			hi := ZMM()
			VPSRLW(Imm(4), lo, hi)
			VPANDD(c0f, lo, lo)
			VPANDD(c0f, hi, hi)
			if lut {
				VPSHUFB(lo, tbl, lo)
				VPSHUFB(hi, tbl, hi)
			}
			dot(2*j, lo, 4*j)
			dot(2*j+1, hi, 16+4*j)
		}
	}
	for c := range s {
		if split {
			VPADDD(s2[c], s[c], s[c])
		}
		VCVTDQ2PS(s[c], s[c])
		m := ZMM()
		VMULPS_BCST(xm(c, 0), dd, m)
		VFMADD231PS(m, s[c], acc[c])
	}
	ADDQ(U32(blockBytes), wp)
	ADDQ(Imm(xBlock), xp)
	if xp4 != nil {
		ADDQ(Imm(xBlock), xp4)
	}
	DECQ(nb)
	JMP(LabelRef("loop"))
	Label("done")
	op := param("out")
	os := param("os")
	var os3, op4 reg.GPVirtual
	if C > 3 {
		os3 = GP64()
		LEAQ(Mem{Base: os, Index: os, Scale: 2}, os3)
	}
	if C > 4 {
		op4 = GP64()
		LEAQ(Mem{Base: op, Index: os, Scale: 4}, op4)
	}
	for c := range acc {
		if c < 4 {
			VMOVUPS(acc[c], rowMem(op, os, os3, c, 0))
		} else {
			VMOVUPS(acc[c], rowMem(op4, os, os3, c-4, 0))
		}
	}
	ret()
}

// q80AVX2 is the Q8_0 tile kernel for AVX2: blockAVX2Lanes on the stored
// quants, signed.
func q80AVX2(t *tile) {
	t.blockAVX2Lanes(q80, q80, 2, false, true, func(r, disp int) reg.VecVirtual {
		w := YMM()
		VMOVDQU(t.w(r, disp+2), w)
		return w
	})
}

// q40AVX2 widens the 16 bytes of a block to words: the low nibbles are
// elements 0..15, the high ones 16..31, each minus 8.
func q40AVX2(t *tile) {
	g := GP32()
	MOVL(U32(0x000f000f), g)
	c0f := YMM()
	VMOVD(g, c0f.AsX())
	VPBROADCASTD(c0f.AsX(), c0f)
	MOVL(U32(0x00080008), g)
	c08 := YMM()
	VMOVD(g, c08.AsX())
	VPBROADCASTD(c08.AsX(), c08)
	t.blockAVX2(q40, func(r, disp int) (reg.VecVirtual, reg.VecVirtual) {
		a, b := YMM(), YMM()
		VPMOVZXBW(t.w(r, disp+2), a)
		VPSRLW(Imm(4), a, b)
		VPAND(c0f, a, a)
		VPSUBW(c08, a, a)
		VPSUBW(c08, b, b)
		return a, b
	})
}

// f16AVX2 is dotF16's order (DotF32's with each half converted exactly)
// with 16 lanes held in two YMM registers, as f32AVX2. A tail of r < 16
// elements is copied to zeroed stack buffers (AVX2 has no masked 16-bit
// load) and its FMA blended into lanes 0..r-1 only.
func f16AVX2(t *tile) { halfAVX2(t, false, false) }

// bf16AVX2 is dotBF16's order with AVX2, f16AVX2's loop: each bf16 widened
// exactly (zero-extended and shifted left 16) and each product added with
// one FMA, as dotBF16 and bf16AVX512 do.
func bf16AVX2(t *tile) { halfAVX2(t, true, false) }

// f16xAVX2 and bf16xAVX2 are f16AVX2 and bf16AVX2 with float32 activations,
// as f16xAVX512 and bf16xAVX512 are on AVX-512: the activations arrive
// rounded to f16 or bf16 and widened back (roundF16AVX2, roundBF16AVX2), so
// the loop converts only the weights — two conversions (bf16: two
// zero-extensions and two shifts) a step of 16 elements where f16AVX2
// spends four — and a one-row tile (a matrix-vector product's, the rows
// kernels) runs two steps an iteration. On an AMD EPYC Zen 5 held to AVX2
// (STRATA_CPU=avx2), BenchmarkForward BF16 tg one thread ran 8.6 % faster
// than with bf16AVX2, F16 10.5 % (medians of per-round ratios, 8
// alternated runs); the two-step loop alone gained nothing.
func f16xAVX2(t *tile)  { halfAVX2(t, false, true) }
func bf16xAVX2(t *tile) { halfAVX2(t, true, true) }

// halfAVX2 is f16AVX2, or bf16AVX2 with bf16; with f32x, f16xAVX2 or
// bf16xAVX2.
func halfAVX2(t *tile, bf16, f32x bool) {
	load := func(m Mem, y reg.VecVirtual) {
		if bf16 {
			VPMOVZXWD(m, y)
			VPSLLD(Imm(16), y, y)
		} else {
			VCVTPH2PS(m, y)
		}
	}
	xload, xbytes := load, 32 // an activation step's loads and bytes
	if f32x {
		xload, xbytes = func(m Mem, y reg.VecVirtual) { VMOVUPS(m, y) }, 64
	}
	// madd leaves w*x+a in x, rounded once.
	madd := func(a, w, x reg.VecVirtual) { VFMADD213PS(a, w, x) }
	type pair struct{ lo, hi reg.VecVirtual }
	acc := make([][]pair, t.R)
	for r := range acc {
		acc[r] = make([]pair, t.C)
		for c := range acc[r] {
			acc[r][c] = pair{YMM(), YMM()}
			VXORPS(acc[r][c].lo, acc[r][c].lo, acc[r][c].lo)
			VXORPS(acc[r][c].hi, acc[r][c].hi, acc[r][c].hi)
		}
	}
	// The tail's buffer: a zeroed 32 bytes for each weight row and, with
	// half activations, each activation row.
	bufRows := t.R + t.C
	if f32x {
		bufRows = t.R
	}
	buf := AllocLocal(32 * bufRows)
	step := func(s int) {
		xv := make([]pair, t.C)
		for c := range xv {
			xv[c] = pair{YMM(), YMM()}
			xload(t.x(c, xbytes*s), xv[c].lo)
			xload(t.x(c, xbytes*s+xbytes/2), xv[c].hi)
		}
		for r := 0; r < t.R; r++ {
			wlo, whi := YMM(), YMM()
			load(t.w(r, 32*s), wlo)
			load(t.w(r, 32*s+16), whi)
			for c := range xv {
				VFMADD231PS(wlo, xv[c].lo, acc[r][c].lo)
				VFMADD231PS(whi, xv[c].hi, acc[r][c].hi)
			}
		}
	}
	if f32x && t.R == 1 && t.C == 1 {
		Label("loopu")
		CMPQ(t.n, Imm(32))
		JL(LabelRef("loop"))
		prefetchAhead(t.wp, 64)
		step(0)
		step(1)
		t.advance(64, 2*xbytes, 32)
		JMP(LabelRef("loopu"))
	}
	Label("loop")
	CMPQ(t.n, Imm(16))
	JL(LabelRef("tail"))
	step(0)
	t.advance(32, xbytes, 16)
	JMP(LabelRef("loop"))
	Label("tail")
	TESTQ(t.n, t.n)
	JZ(LabelRef("done"))
	// Copy each row's n halves to its zeroed buffer (a 16-half load could
	// cross into an unmapped page); float32 activations load under masks.
	z := YMM()
	VXORPS(z, z, z)
	for i := 0; i < bufRows; i++ {
		VMOVUPS(z, buf.Offset(32*i))
	}
	for i := 0; i < bufRows; i++ {
		var src Mem
		if i < t.R {
			src = t.w(i, 0)
		} else {
			src = t.x(i-t.R, 0)
		}
		p := GP64()
		LEAQ(src, p)
		j := GP64()
		XORQ(j, j)
		h := GP16()
		Label(fmt.Sprintf("copy%d", i))
		MOVW(Mem{Base: p, Index: j, Scale: 2}, h)
		dst := buf.Offset(32 * i)
		dst.Index, dst.Scale = j, 2
		MOVW(h, dst)
		INCQ(j)
		CMPQ(j, t.n)
		JL(LabelRef(fmt.Sprintf("copy%d", i)))
	}
	// Masks for lanes 0..n-1: maskTab + 4*(16-n).
	off := GP64()
	MOVQ(U32(16), off)
	SUBQ(t.n, off)
	tab := GP64()
	LEAQ(maskTab, tab)
	mlo, mhi := YMM(), YMM()
	VMOVDQU(Mem{Base: tab, Index: off, Scale: 4}, mlo)
	VMOVDQU(Mem{Base: tab, Index: off, Scale: 4, Disp: 32}, mhi)
	for r := 0; r < t.R; r++ {
		for hf, m := range []reg.VecVirtual{mlo, mhi} {
			w := YMM()
			load(buf.Offset(32*r+16*hf), w)
			for c := 0; c < t.C; c++ {
				a := acc[r][c].lo
				if hf == 1 {
					a = acc[r][c].hi
				}
				x := YMM()
				if f32x {
					VMASKMOVPS(t.x(c, 32*hf), m, x)
				} else {
					load(buf.Offset(32*(t.R+c)+16*hf), x)
				}
				madd(a, w, x)         // x = w*x + acc
				VBLENDVPS(m, x, a, a) // lanes in the tail take the FMA
			}
		}
	}
	Label("done")
	op := t.outPtr()
	os := t.outStride()
	for r := range acc {
		for c := range acc[r] {
			s := foldY(acc[r][c].lo, acc[r][c].hi)
			if c == 0 {
				VMOVSS(s, Mem{Base: op, Disp: 4 * r})
			} else {
				VMOVSS(s, Mem{Base: op, Index: os, Scale: 1, Disp: 4 * r})
			}
		}
	}
}

// scores16 emits func(hd int, k *byte, stride int, q *byte, out *float32):
// out[r] = the f16 attention score of key r (at k + r*stride) with q, for r
// < 16, in attnDotF16's order (ggml_vec_dot_f16's); hd is a multiple of 64.
// Four keys at a time hold four accumulators each (group g of every 64
// elements in accumulator g), folded g0+g2, g1+g3, then together; the
// sixteen keys' lane folds then run side by side, two keys per register at
// the first level and four at the last, with the very additions of
// reduceLanes; a permutation puts the keys in order.
func scores16() {
	TEXT("scoresF16x16AVX512", NOSPLIT, "func(hd int, k *byte, stride int, q *byte, out *float32)")
	Pragma("noescape")
	Doc("scoresF16x16AVX512 sets out[r] to the f16 attention score of key r with q for r < 16 (hd a multiple of 64).")
	n := param("hd")
	kp := param("k")
	st := param("stride")
	qp := param("q")
	st3 := GP64()
	LEAQ(Mem{Base: st, Index: st, Scale: 2}, st3)
	keys := make([]reg.VecVirtual, 16)
	for g := range 4 {
		kb, qb, cnt := GP64(), GP64(), GP64()
		MOVQ(kp, kb)
		MOVQ(qp, qb)
		MOVQ(n, cnt)
		if g < 3 {
			LEAQ(Mem{Base: kp, Index: st, Scale: 4}, kp) // the next four keys
		}
		acc := groupAccumulators(4)
		Label(fmt.Sprintf("keys%d", g))
		for j := range 4 {
			qz := ZMM()
			VCVTPH2PS(Mem{Base: qb, Disp: 32 * j}, qz)
			for r := range 4 {
				kz := ZMM()
				VCVTPH2PS(rowMem(kb, st, st3, r, 32*j), kz)
				VFMADD231PS(qz, kz, acc[r][j])
			}
		}
		ADDQ(Imm(128), qb)
		ADDQ(Imm(128), kb)
		SUBQ(Imm(64), cnt)
		JNZ(LabelRef(fmt.Sprintf("keys%d", g)))
		for r := range 4 {
			keys[4*g+r] = foldGroups(acc[r])
		}
	}
	// The folds of reduceLanes, sixteen keys at a time: lane j += lane j+8
	// (two keys per register), += lane j+4 (four keys, one per 128-bit
	// lane), += lane j+2, += lane j+1; then lane 4q+i holds key q+4i.
	z := foldLevel(keys, VSHUFF32X4, 0x44, 0xee)
	u := foldLevel(z, VSHUFF32X4, 0x88, 0xdd)
	v := foldLevel(u, VSHUFPS, 0x44, 0xee)
	r := foldLevel(v, VSHUFPS, 0x88, 0xdd)[0]
	perm := GLOBL("scoresPerm", RODATA|NOPTR) // lane 4q+i (key q+4i) to lane q+4i
	for k := range 16 {
		DATA(4*k, U32(uint32(4*(k%4)+k/4)))
	}
	idx := ZMM()
	VMOVDQU32(perm, idx)
	VPERMPS(r, idx, r)
	op := param("out")
	VMOVUPS(r, Mem{Base: op})
	ret()
}

// groupAccumulators returns keys×4 zeroed registers: acc[r][g] is key r's
// accumulator of group g (elements 16g..16g+15 of every 64).
func groupAccumulators(keys int) [][4]reg.VecVirtual {
	acc := make([][4]reg.VecVirtual, keys)
	for r := range acc {
		for g := range 4 {
			acc[r][g] = ZMM()
			VXORPS(acc[r][g], acc[r][g], acc[r][g])
		}
	}
	return acc
}

// foldGroups folds one key's four group accumulators as
// ggml_vec_dot_f16 does: g0 += g2, g1 += g3, g0 += g1.
func foldGroups(g [4]reg.VecVirtual) reg.VecVirtual {
	VADDPS(g[2], g[0], g[0])
	VADDPS(g[3], g[1], g[1])
	VADDPS(g[1], g[0], g[0])
	return g[0]
}

// score1 emits func(hd int, k *byte, q *byte) float32: one key's f16
// attention score in attnDotF16's order, hd a multiple of 64; the lane fold
// is reduceLanes' (upper half onto lower, four times).
func score1() {
	TEXT("scoreF16AVX512", NOSPLIT, "func(hd int, k *byte, q *byte) float32")
	Pragma("noescape")
	Doc("scoreF16AVX512 returns the f16 attention score of one key with q (hd a multiple of 64).")
	n := param("hd")
	kb := param("k")
	qb := param("q")
	acc := groupAccumulators(1)[0]
	Label("loop")
	for j := range 4 {
		qz, kz := ZMM(), ZMM()
		VCVTPH2PS(Mem{Base: qb, Disp: 32 * j}, qz)
		VCVTPH2PS(Mem{Base: kb, Disp: 32 * j}, kz)
		VFMADD231PS(qz, kz, acc[j])
	}
	ADDQ(Imm(128), qb)
	ADDQ(Imm(128), kb)
	SUBQ(Imm(64), n)
	JNZ(LabelRef("loop"))
	x := foldGroups(acc)
	hi := YMM()
	VEXTRACTF64X4(Imm(1), x, hi)
	VADDPS(hi, x.AsY(), hi) // lane j += lane j+8
	h4 := XMM()
	VEXTRACTF128(Imm(1), hi, h4)
	VADDPS(h4, hi.AsX(), h4) // += lane j+4
	h2 := XMM()
	VMOVHLPS(h4, h4, h2)
	VADDPS(h2, h4, h4) // += lane j+2
	h1 := XMM()
	VMOVSHDUP(h4, h1)
	VADDSS(h1, h4, h4) // += lane j+1
	Store(h4, ReturnIndex(0))
	ret()
}

// foldLevel halves a list of registers: out[i] = shuf(lo, in[2i+1], in[2i])
// + shuf(hi, in[2i+1], in[2i]), the shuffles picking the lanes each addition
// of a fold level pairs.
func foldLevel(in []reg.VecVirtual, shuf func(...Op), lo, hi uint8) []reg.VecVirtual {
	out := make([]reg.VecVirtual, len(in)/2)
	for i := range out {
		x, y := ZMM(), ZMM()
		shuf(Imm(uint64(lo)), in[2*i+1], in[2*i], x)
		shuf(Imm(uint64(hi)), in[2*i+1], in[2*i], y)
		out[i] = ZMM()
		VADDPS(y, x, out[i])
	}
	return out
}

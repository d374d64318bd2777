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
// elements for the float types and 32-element blocks for Q8_0 and Q4_0. Each
// output is reduced in exactly the order of the portable kernel of its type
// (see dot.go and dot_quant.go), whatever R and C: an R×C kernel equals R*C
// calls of the 1×1 kernel bit for bit.
package main

import (
	"fmt"
	"math"
	"os"

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
		{"q80VNNI", 4, 4, q80VNNI},
		{"q40VNNI", 4, 4, q40VNNI},
		{"q80VNNIX", 4, 4, q80VNNIX},
		{"q40VNNIX", 4, 4, q40VNNIX},
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
				RET()
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
			RET()
		}
	}
	for r := 1; r <= 2; r++ {
		for c := 1; c <= 2; c++ {
			TEXT(fmt.Sprintf("f16AVX2_%dx%d", r, c), NOSPLIT, signature)
			Pragma("noescape")
			Doc(fmt.Sprintf("f16AVX2_%dx%d computes a %d×%d tile of f16 dot products with AVX2, F16C and FMA.", r, c, r, c))
			f16AVX2(newTile(r, c))
			RET()
		}
	}
	for _, k := range []struct {
		name string
		gen  func(t *tile)
	}{{"q80AVX2", q80AVX2}, {"q40AVX2", q40AVX2}} {
		for r := 1; r <= 2; r++ {
			for c := 1; c <= 2; c++ {
				TEXT(fmt.Sprintf("%s_%dx%d", k.name, r, c), NOSPLIT, signature)
				Pragma("noescape")
				Doc(fmt.Sprintf("%s_%dx%d computes a %d×%d tile of %s dot products with AVX2 and FMA.", k.name, r, c, r, c, k.name))
				k.gen(newTile(r, c))
				RET()
			}
		}
	}
	expConsts()
	expSub()
	swiGLU()
	quantQ80()
	f32ToF16()
	f16Scale()
	for _, H := range []int{1, 2} {
		softmaxValues(true, H)
		softmaxValues(false, H)
	}
	expandQ8X()
	Generate()
}

// expCoef are the constants of expf (see expf in package cpu, whose order
// these kernels follow): the clamp bounds, log2(e), ln 2 split in two, and
// the Taylor coefficients 1/i! for i = 0..11.
var expTab Mem

func expConsts() {
	expTab = GLOBL("expTab", RODATA|NOPTR)
	vals := []float64{-104.5, 89, math.Log2E, ln2Hi, ln2Lo}
	f := 1.0
	for i := 0; i <= 11; i++ {
		if i > 0 {
			f *= float64(i)
		}
		vals = append(vals, 1/f)
	}
	for i, v := range vals {
		DATA(8*i, U64(math.Float64bits(v))) // F64 prints 1 as the integer $(1)
	}
}

const (
	ln2Hi = math.Ln2
	ln2Lo = 2.3190468138462996e-17 // ln 2 - ln2Hi
)

// expZ returns expf of the 16 float32 lanes of z.
func expZ(z reg.VecVirtual) reg.VecVirtual {
	hiY := YMM()
	VEXTRACTF64X4(Imm(1), z, hiY)
	lo, hi := ZMM(), ZMM()
	VCVTPS2PD(z.AsY(), lo)
	VCVTPS2PD(hiY, hi)
	for _, h := range []reg.VecVirtual{lo, hi} {
		VMAXPD_BCST(expTab.Offset(0), h, h) // NaN stays NaN: it is the second source
		VMINPD_BCST(expTab.Offset(8), h, h)
		k := ZMM()
		VMULPD_BCST(expTab.Offset(16), h, k)
		VRNDSCALEPD(Imm(0), k, k)                  // round to nearest even
		VFNMADD231PD_BCST(expTab.Offset(24), k, h) // r = fma(-k, ln2Hi, x)
		VFNMADD231PD_BCST(expTab.Offset(32), k, h) // r = fma(-k, ln2Lo, r)
		p := ZMM()
		VBROADCASTSD(expTab.Offset(8*(5+11)), p)
		for i := 10; i >= 0; i-- {
			VFMADD213PD_BCST(expTab.Offset(8*(5+i)), h, p) // p = fma(p, r, c_i)
		}
		VSCALEFPD(k, p, p)
		VCVTPD2PS(p, h.AsY())
	}
	out := ZMM()
	VINSERTF64X4(Imm(1), hi.AsY(), lo, out)
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
	RET()
}

// swiGLU emits func(n int, gate, up *float32): gate[i] = gate[i] / (1 +
// expf(-gate[i])) * up[i], each operation rounded to float32.
func swiGLU() {
	TEXT("swigluAVX512", NOSPLIT, "func(n int, gate, up *float32)")
	Pragma("noescape")
	Doc("swigluAVX512 sets gate[i] = silu(gate[i]) * up[i] for i < n.")
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
	body := func(k reg.OpmaskVirtual) {
		z, up := ZMM(), ZMM()
		if k == nil {
			VMOVUPS(Mem{Base: g}, z)
			VMOVUPS(Mem{Base: u}, up)
		} else {
			VMOVUPS_Z(Mem{Base: g}, k, z)
			VMOVUPS_Z(Mem{Base: u}, k, up)
		}
		neg := ZMM()
		VPXORD(sign, z, neg)
		e := expZ(neg)
		VADDPS(one, e, e)
		VDIVPS(e, z, z)
		VMULPS(up, z, z)
		if k == nil {
			VMOVUPS(z, Mem{Base: g})
		} else {
			VMOVUPS(z, k, Mem{Base: g})
		}
	}
	Label("loop")
	CMPQ(n, Imm(16))
	JL(LabelRef("tail"))
	body(nil)
	ADDQ(Imm(64), g)
	ADDQ(Imm(64), u)
	SUBQ(Imm(16), n)
	JMP(LabelRef("loop"))
	Label("tail")
	TESTQ(n, n)
	JZ(LabelRef("done"))
	body(tailMask(n))
	Label("done")
	RET()
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
	RET()
}

// tile holds the pointers and strides of one kernel call.
type tile struct {
	R, C   int
	n      reg.GPVirtual
	wp, ws reg.GPVirtual
	ws3    reg.GPVirtual
	xp, xs reg.GPVirtual
	xs3    reg.GPVirtual
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
	ADDQ(Imm(uint64(bytesW)), t.wp)
	ADDQ(Imm(uint64(bytesX)), t.xp)
	SUBQ(Imm(uint64(count)), t.n)
}

// store folds every accumulator (reduceLanes' tree: +8, +4, +2, +1) and
// writes it to out.
func (t *tile) store(acc [][]reg.VecVirtual) {
	op := param("out")
	os := param("os")
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
	op := param("out")
	os := param("os")
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

// bf16AVX512 widens both rows (bf16 << 16) and rounds each product before
// the add, as dotBF16 does.
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
	}, func(w, x, acc reg.VecVirtual, k reg.OpmaskVirtual) {
		p := ZMM()
		VMULPS(w, x, p)
		if k == nil {
			VADDPS(p, acc, acc)
		} else {
			VADDPS(p, acc, k, acc)
		}
	})
}

// vpdpbusd emits VPDPBUSD (AVX512_VNNI), which avo v0.5.0 lacks: acc +=
// the sums of four products of unsigned bytes u and signed bytes s per int32
// lane.
func vpdpbusd(s, u, acc Op) {
	Instruction(&ir.Instruction{
		Opcode:   "VPDPBUSD",
		Operands: []Op{s, u, acc},
		Inputs:   []Op{s, u, acc},
		Outputs:  []Op{acc},
		ISA:      []string{"AVX512_VNNI"},
	})
}

// scales2 returns the float32 vector [f16(row+0) ×8, f16(row+stride) ×8]:
// the scales of blocks 2k and 2k+1 in the lanes of their sums.
func scales2(m0, m1 Mem, kHi reg.OpmaskVirtual) reg.VecVirtual {
	y := YMM()
	VPBROADCASTW(m0, y)
	if kHi != nil {
		VPBROADCASTW(m1, kHi, y)
	}
	z := ZMM()
	VCVTPH2PS(y, z)
	return z
}

// blockLoop emits the two-blocks-per-ZMM loop shared by Q8_0 and Q4_0: lanes
// 0..7 take the eight 4-element sums of block 2k, lanes 8..15 those of block
// 2k+1 (see dotQ80Q80). wquants loads the signed weight quants of two blocks
// (one when single) into a ZMM; wsz is the weight block size.
func (t *tile) blockLoop(wsz int, wquants func(r int, single bool) reg.VecVirtual) {
	acc := t.zeroAcc()
	g := GP32()
	MOVL(U32(0x80808080), g)
	c80 := ZMM()
	VPBROADCASTD(g, c80)
	MOVL(U32(0xff00), g)
	kHi := K()
	KMOVW(g, kHi)
	MOVL(U32(0x00ff), g)
	kLo := K()
	KMOVW(g, kLo)

	body := func(single bool) {
		xu := make([]reg.VecVirtual, t.C)
		xd := make([]reg.VecVirtual, t.C)
		for c := range xu {
			xu[c] = ZMM()
			VBROADCASTI64X4(t.x(c, 2), xu[c])
			if !single {
				VINSERTI64X4(Imm(1), t.x(c, q80+2), xu[c], xu[c])
			}
			VPXORD(c80, xu[c], xu[c]) // x+128 as unsigned bytes
			kk := kHi
			if single {
				kk = nil
			}
			xd[c] = scales2(t.x(c, 0), t.x(c, q80), kk)
		}
		for r := 0; r < t.R; r++ {
			wq := wquants(r, single)
			corr := ZMM() // 128 * (sum of the 4 weights) per lane
			VXORPS(corr, corr, corr)
			vpdpbusd(wq, c80, corr)
			kk := kHi
			if single {
				kk = nil
			}
			wd := scales2(t.w(r, 0), t.w(r, wsz), kk)
			for c := range xu {
				s := ZMM()
				VXORPS(s, s, s)
				vpdpbusd(wq, xu[c], s)
				VPSUBD(corr, s, s) // exact sum of w*x per lane
				VCVTDQ2PS(s, s)
				dd := ZMM()
				VMULPS(xd[c], wd, dd)
				if single {
					VFMADD231PS(dd, s, kLo, acc[r][c])
				} else {
					VFMADD231PS(dd, s, acc[r][c])
				}
			}
		}
	}
	Label("loop")
	CMPQ(t.n, Imm(2))
	JL(LabelRef("tail"))
	body(false)
	t.advance(2*wsz, 2*q80, 2)
	JMP(LabelRef("loop"))
	Label("tail")
	TESTQ(t.n, t.n)
	JZ(LabelRef("done"))
	body(true)
	Label("done")
	t.store(acc)
}

const (
	q80 = 34
	q40 = 18
)

func q80VNNI(t *tile) {
	t.blockLoop(q80, func(r int, single bool) reg.VecVirtual {
		z := ZMM()
		VBROADCASTI64X4(t.w(r, 2), z)
		if !single {
			VINSERTI64X4(Imm(1), t.w(r, q80+2), z, z)
		}
		return z
	})
}

// q40VNNI unpacks each block's 16 bytes to 32 quants (low nibbles are
// elements 0..15, high nibbles 16..31) minus 8.
func q40VNNI(t *tile) {
	g := GP32()
	MOVL(U32(0x0f0f0f0f), g)
	c0f := ZMM()
	VPBROADCASTD(g, c0f)
	MOVL(U32(0x08080808), g)
	c08 := ZMM()
	VPBROADCASTD(g, c08)
	MOVL(U32(0xcc), g)
	kOdd := K() // qwords 2,3 and 6,7: 128-bit lanes 1 and 3
	KMOVW(g, kOdd)
	t.blockLoop(q40, func(r int, single bool) reg.VecVirtual {
		z := ZMM()
		VBROADCASTI32X4(t.w(r, 2), z) // [qs0 qs0 qs0 qs0]
		if !single {
			VINSERTI32X4(Imm(2), t.w(r, q40+2), z, z)
			VINSERTI32X4(Imm(3), t.w(r, q40+2), z, z) // [qs0 qs0 qs1 qs1]
		}
		hi := ZMM()
		VPSRLW(Imm(4), z, hi)
		VMOVDQA64(hi, kOdd, z) // high nibbles into lanes 1 and 3
		VPANDD(c0f, z, z)      // [lo0 hi0 lo1 hi1]
		VPSUBB(c08, z, z)
		return z
	})
}

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
	RET()
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
	RET()
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
	name, esz, accType := "softmaxF32", 4, "*float32"
	if f16 {
		name, esz, accType = "softmaxF16", 2, "*uint16"
	}
	name += fmt.Sprintf("x%dAVX512", H)
	TEXT(name, NOSPLIT, "func(hd int, acc "+accType+", v *byte, voff int, stride int, m int, ms, vs *float32)")
	Pragma("noescape")
	Doc(name + fmt.Sprintf(" accumulates m keys' values of %d heads into acc with Attend's online-softmax weights ms, vs.", H))
	const U = 4
	const chunk = 64 // softmaxChunk: the weights of head 1 follow head 0's
	rem := param("hd")
	accp := param("acc")
	vp := param("v")
	g := GP32()
	MOVL(U32(0x3f800000), g)
	one := XMM()
	VMOVD(g, one)
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
	hdB := GP64() // head 1's accumulator, bytes after head 0's
	if H > 1 {
		Load(Param("hd"), hdB)
		SHLQ(Imm(uint64(map[int]int{2: 1, 4: 2}[esz])), hdB)
	}
	accMem := func(h, i int) Mem {
		m := Mem{Base: accp, Disp: 16 * esz * i}
		if h > 0 {
			m.Index, m.Scale = hdB, 1
		}
		return m
	}
	var a [2][U]reg.VecVirtual
	for h := 0; h < H; h++ {
		for i := range U {
			a[h][i] = ZMM()
			if f16 {
				VCVTPH2PS_Z(accMem(h, i), ks[i], a[h][i])
			} else {
				VMOVUPS_Z(accMem(h, i), ks[i], a[h][i])
			}
		}
	}
	round := func(z reg.VecVirtual) {
		if f16 {
			y := YMM()
			VCVTPS2PH(Imm(0), z, y)
			VCVTPH2PS(y, z)
		}
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
	Label("key")
	for h := 0; h < H; h++ {
		VUCOMISS(Mem{Base: msp, Disp: 4 * chunk * h}, one)
		JNE(LabelRef(fmt.Sprintf("rescale%d", h)))
		JPS(LabelRef(fmt.Sprintf("rescale%d", h)))
		Label(fmt.Sprintf("values%d", h))
	}
	for h := 0; h < H; h++ {
		b := ZMM()
		VBROADCASTSS(Mem{Base: vsp, Disp: 4 * chunk * h}, b)
		for i := range U {
			m := Mem{Base: row, Disp: 16 * esz * i}
			if h > 0 {
				m.Index, m.Scale = voff, 1
			}
			t := ZMM()
			if f16 {
				VCVTPH2PS_Z(m, ks[i], t)
			} else {
				VMOVUPS_Z(m, ks[i], t)
			}
			VFMADD231PS(b, t, a[h][i])
			round(a[h][i])
		}
	}
	ADDQ(stride, row)
	ADDQ(Imm(4), msp)
	ADDQ(Imm(4), vsp)
	DECQ(cnt)
	JNZ(LabelRef("key"))
	for h := 0; h < H; h++ {
		for i := range U {
			if f16 {
				VCVTPS2PH(Imm(0), a[h][i], ks[i], accMem(h, i))
			} else {
				VMOVUPS(a[h][i], ks[i], accMem(h, i))
			}
		}
	}
	ADDQ(U32(16*U*esz), accp)
	ADDQ(U32(16*U*esz), vp) // the value rows have acc's type
	SUBQ(Imm(16*U), rem)
	JG(LabelRef("pass"))
	RET()
	for h := 0; h < H; h++ {
		Label(fmt.Sprintf("rescale%d", h))
		bm := ZMM()
		VBROADCASTSS(Mem{Base: msp, Disp: 4 * chunk * h}, bm)
		for i := range U {
			VMULPS(bm, a[h][i], a[h][i])
			round(a[h][i])
		}
		JMP(LabelRef(fmt.Sprintf("values%d", h)))
	}
}

// expandQ8X emits func(nb int, q *byte, cw uint32, dst *byte): the Q8_0
// activation row q (nb blocks) in the expanded layout of blockLoopX, pair by
// pair: the 64 quants, then 16 int32 lanes of -cw times the sum of each 4
// quants, then the 16 float32 scales; an odd last block leaves the upper
// half zero. cw (128 or 8) is passed as four equal bytes.
func expandQ8X() {
	TEXT("expandQ8XAVX512", NOSPLIT, "func(nb int, q *byte, cw uint32, dst *byte)")
	Pragma("noescape")
	Doc("expandQ8XAVX512 writes nb Q8_0 activation blocks in the expanded layout of the X kernels.")
	n := param("nb")
	q := param("q")
	dst := param("dst")
	g := GP32()
	Load(Param("cw"), g)
	cw := ZMM()
	VPBROADCASTD(g, cw)
	zero := ZMM()
	VPXORD(zero, zero, zero)
	MOVL(U32(0xff00), g)
	kHi := K()
	KMOVW(g, kHi)
	MOVL(U32(0x00ff), g)
	kLo := K()
	KMOVW(g, kLo)
	body := func(single bool) {
		z := ZMM()
		VMOVDQU(Mem{Base: q, Disp: 2}, z.AsY()) // VEX: zeroes the upper half
		if !single {
			VINSERTI64X4(Imm(1), Mem{Base: q, Disp: q80 + 2}, z, z)
		}
		VMOVDQU64(z, Mem{Base: dst})
		s := ZMM()
		VPXORD(s, s, s)
		vpdpbusd(z, cw, s)
		VPSUBD(s, zero, s)
		VMOVDQU64(s, Mem{Base: dst, Disp: 64})
		y := YMM()
		if single {
			VPBROADCASTW_Z(Mem{Base: q}, kLo, y)
		} else {
			VPBROADCASTW(Mem{Base: q}, y)
			VPBROADCASTW(Mem{Base: q, Disp: q80}, kHi, y)
		}
		d := ZMM()
		VCVTPH2PS(y, d)
		VMOVUPS(d, Mem{Base: dst, Disp: 128})
	}
	Label("loop")
	CMPQ(n, Imm(2))
	JL(LabelRef("tail"))
	body(false)
	ADDQ(Imm(2*q80), q)
	ADDQ(U32(xPair), dst)
	SUBQ(Imm(2), n)
	JMP(LabelRef("loop"))
	Label("tail")
	TESTQ(n, n)
	JZ(LabelRef("done"))
	body(true)
	Label("done")
	RET()
}

// xPair is the bytes per pair of blocks of an expanded activation row (see
// expandQ8X in package cpu): 32+32 quants, 16 int32 corrections (-cw times
// the sum of each 4 quants), 16 float32 scales (block 2k's ×8, 2k+1's ×8).
const xPair = 192

// blockLoopX is blockLoop for expanded activation rows, with the roles of
// the operands of VPDPBUSD swapped: the weights are the unsigned bytes
// (w+128 for Q8_0, the raw nibbles for Q4_0) and the activations the signed
// ones, so that the correction (cw times each lane's activation sum) was
// computed once when the row was expanded and starts each integer sum.
// Per weight row and activation row this leaves VPDPBUSD, VCVTDQ2PS, VMULPS
// and VFMADD231PS, with the activation side read from memory. The integer
// sums, scale products and FMAs are blockLoop's, so the results are too.
func (t *tile) blockLoopX(wsz int, wquants func(r int, single bool) reg.VecVirtual) {
	acc := t.zeroAcc()
	g := GP32()
	MOVL(U32(0xff00), g)
	kHi := K()
	KMOVW(g, kHi)
	MOVL(U32(0x00ff), g)
	kLo := K()
	KMOVW(g, kLo)

	body := func(single bool) {
		for r := 0; r < t.R; r++ {
			wu := wquants(r, single)
			kk := kHi
			if single {
				kk = nil
			}
			wd := scales2(t.w(r, 0), t.w(r, wsz), kk)
			for c := 0; c < t.C; c++ {
				s := ZMM()
				VMOVDQU32(t.x(c, 64), s)
				vpdpbusd(t.x(c, 0), wu, s) // exact sum of w*x per lane
				VCVTDQ2PS(s, s)
				dd := ZMM()
				VMULPS(t.x(c, 128), wd, dd)
				if single {
					VFMADD231PS(dd, s, kLo, acc[r][c])
				} else {
					VFMADD231PS(dd, s, acc[r][c])
				}
			}
		}
	}
	Label("loop")
	CMPQ(t.n, Imm(2))
	JL(LabelRef("tail"))
	body(false)
	t.advance(2*wsz, xPair, 2)
	JMP(LabelRef("loop"))
	Label("tail")
	TESTQ(t.n, t.n)
	JZ(LabelRef("done"))
	body(true)
	Label("done")
	t.store(acc)
}

// q80VNNIX is q80VNNI on expanded activations: weights w+128 as unsigned.
func q80VNNIX(t *tile) {
	g := GP32()
	MOVL(U32(0x80808080), g)
	c80 := ZMM()
	VPBROADCASTD(g, c80)
	t.blockLoopX(q80, func(r int, single bool) reg.VecVirtual {
		z := ZMM()
		VBROADCASTI64X4(t.w(r, 2), z)
		if !single {
			VINSERTI64X4(Imm(1), t.w(r, q80+2), z, z)
		}
		VPXORD(c80, z, z)
		return z
	})
}

// q40VNNIX is q40VNNI on expanded activations: the nibbles q are the
// unsigned bytes (the correction of -8 is in the activation row).
func q40VNNIX(t *tile) {
	g := GP32()
	MOVL(U32(0x0f0f0f0f), g)
	c0f := ZMM()
	VPBROADCASTD(g, c0f)
	MOVL(U32(0xcc), g)
	kOdd := K()
	KMOVW(g, kOdd)
	t.blockLoopX(q40, func(r int, single bool) reg.VecVirtual {
		z := ZMM()
		VBROADCASTI32X4(t.w(r, 2), z)
		if !single {
			VINSERTI32X4(Imm(2), t.w(r, q40+2), z, z)
			VINSERTI32X4(Imm(3), t.w(r, q40+2), z, z)
		}
		hi := ZMM()
		VPSRLW(Imm(4), z, hi)
		VMOVDQA64(hi, kOdd, z)
		VPANDD(c0f, z, z)
		return z
	})
}

// blockAVX2 is the Q8_0/Q4_0 order of dotQ80Q80 with AVX2: lanes 0..7 of
// every sum are one YMM (even blocks) and lanes 8..15 another (odd
// blocks). Each block's quants are sign-extended to int16; VPMADDWD sums
// the products in pairs and VPHADDD the pairs in fours, exactly (no
// VPMADDUBSW, whose int16 sums saturate). VPHADDD leaves the eight 4-sums
// of a block in the lane order [g0 g1 g4 g5 | g2 g3 g6 g7], the same for
// every block, so the accumulators hold the lanes permuted and foldPerm
// folds them in reduceLanes' order. wquants loads the int16 weights of
// block disp of row r (elements 0..15, 16..31).
func (t *tile) blockAVX2(wsz int, wquants func(r, disp int) (reg.VecVirtual, reg.VecVirtual)) {
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
	block := func(b int) {
		for r := 0; r < t.R; r++ {
			wa, wb := wquants(r, b*wsz)
			wd := YMM()
			VPBROADCASTW(t.w(r, b*wsz), wd.AsX())
			VCVTPH2PS(wd.AsX(), wd)
			for c := 0; c < t.C; c++ {
				xa, xb := YMM(), YMM()
				VPMOVSXBW(t.x(c, b*q80+2), xa)
				VPMOVSXBW(t.x(c, b*q80+18), xb)
				VPMADDWD(wa, xa, xa)
				VPMADDWD(wb, xb, xb)
				VPHADDD(xb, xa, xa) // [g0 g1 g4 g5 | g2 g3 g6 g7], exact
				VCVTDQ2PS(xa, xa)
				dd := YMM()
				VPBROADCASTW(t.x(c, b*q80), dd.AsX())
				VCVTPH2PS(dd.AsX(), dd)
				VMULPS(dd, wd, dd)
				a := acc[r][c].lo
				if b == 1 {
					a = acc[r][c].hi
				}
				VFMADD231PS(dd, xa, a)
			}
		}
	}
	Label("loop")
	CMPQ(t.n, Imm(2))
	JL(LabelRef("tail"))
	block(0)
	block(1)
	t.advance(2*wsz, 2*q80, 2)
	JMP(LabelRef("loop"))
	Label("tail")
	TESTQ(t.n, t.n)
	JZ(LabelRef("done"))
	block(0)
	Label("done")
	op := param("out")
	os := param("os")
	for r := range acc {
		for c := range acc[r] {
			s := foldPerm(acc[r][c].lo, acc[r][c].hi)
			if c == 0 {
				VMOVSS(s, Mem{Base: op, Disp: 4 * r})
			} else {
				VMOVSS(s, Mem{Base: op, Index: os, Scale: 1, Disp: 4 * r})
			}
		}
	}
}

// foldPerm is reduceLanes on 16 lanes held as lo (0..7) and hi (8..15) in
// the order [0 1 4 5 | 2 3 6 7]: +8 (lo+hi), +4 (positions 0,1,4,5 gain
// 2,3,6,7: VPERMILPS swaps the 64-bit halves of each 128-bit lane), +2
// (positions 0,1 gain 4,5), +1.
func foldPerm(lo, hi reg.VecVirtual) reg.VecVirtual {
	y := YMM()
	VADDPS(hi, lo, y)
	t := YMM()
	VPERMILPS(Imm(0x4e), y, t)
	VADDPS(t, y, y)
	x := XMM()
	VEXTRACTF128(Imm(1), y, x)
	VADDPS(x, y.AsX(), x)
	h := XMM()
	VMOVSHDUP(x, h)
	VADDSS(h, x, x)
	return x
}

func q80AVX2(t *tile) {
	t.blockAVX2(q80, func(r, disp int) (reg.VecVirtual, reg.VecVirtual) {
		a, b := YMM(), YMM()
		VPMOVSXBW(t.w(r, disp+2), a)
		VPMOVSXBW(t.w(r, disp+18), b)
		return a, b
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
func f16AVX2(t *tile) {
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
	buf := AllocLocal(32 * (t.R + t.C))
	Label("loop")
	CMPQ(t.n, Imm(16))
	JL(LabelRef("tail"))
	xv := make([]pair, t.C)
	for c := range xv {
		xv[c] = pair{YMM(), YMM()}
		VCVTPH2PS(t.x(c, 0), xv[c].lo)
		VCVTPH2PS(t.x(c, 16), xv[c].hi)
	}
	for r := 0; r < t.R; r++ {
		wlo, whi := YMM(), YMM()
		VCVTPH2PS(t.w(r, 0), wlo)
		VCVTPH2PS(t.w(r, 16), whi)
		for c := range xv {
			VFMADD231PS(wlo, xv[c].lo, acc[r][c].lo)
			VFMADD231PS(whi, xv[c].hi, acc[r][c].hi)
		}
	}
	t.advance(32, 32, 16)
	JMP(LabelRef("loop"))
	Label("tail")
	TESTQ(t.n, t.n)
	JZ(LabelRef("done"))
	// Copy each row's n halves to a zeroed 32-byte buffer.
	z := YMM()
	VXORPS(z, z, z)
	for i := 0; i < t.R+t.C; i++ {
		VMOVUPS(z, buf.Offset(32*i))
	}
	for i := 0; i < t.R+t.C; i++ {
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
			VCVTPH2PS(buf.Offset(32*r+16*hf), w)
			for c := 0; c < t.C; c++ {
				a := acc[r][c].lo
				if hf == 1 {
					a = acc[r][c].hi
				}
				x := YMM()
				VCVTPH2PS(buf.Offset(32*(t.R+c)+16*hf), x)
				VFMADD213PS(a, w, x)  // x = w*x + acc
				VBLENDVPS(m, x, a, a) // lanes in the tail take the FMA
			}
		}
	}
	Label("done")
	op := param("out")
	os := param("os")
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

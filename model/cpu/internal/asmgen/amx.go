package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	"github.com/mmcloughlin/avo/ir"
	. "github.com/mmcloughlin/avo/operand"
	"github.com/mmcloughlin/avo/reg"
)

// AMX panel kernels. Intel's Advanced Matrix Extensions multiply byte tiles:
// TDPBSSD adds to each int32 of a 16×16 tile C the dot product of a row of
// tile A (16 activation rows of a sub-block's 32 signed quants, or 16 for
// Q6_K) with four-byte groups of tile B (8 rows of 64 bytes, or 4: row k
// holds elements 4k..4k+3 of 16 weight rows, row i's four bytes at 4i).
// The nibble panels (Q4_0, IQ4_NL, IQ4_XS, Q4_K, Q5_K) already hold a
// sub-block in B's layout once its nibbles are split (vector j's low
// nibbles are B's row j, its high nibbles row 4+j; Q4_K's pairs of
// sub-blocks, all eight rows from the low or high nibbles), and Q6_K's
// group vectors are q6KPanel's; the expanded activation rows, at their
// stride, are A. So one TDPBSSD gives the exact integer sums of one
// sub-block for 16 weight rows × 16 activation rows, and the kernel folds
// them in as the VNNI panel kernels of the type do (one fma per block or
// sub-block, in order): the same bits, since integer sums are exact in any
// order. The quants are made signed (Q4_0's nibbles minus 8, the IQ4
// levels as they are, Q6_K's minus 32), so the activations' corrections go
// unused.
//
// On the 2-core Intel Xeon with AMX (family 6 model 167), BenchmarkPanel
// Q4_0 ran a panel against 128 activation rows about 1.6 times as fast as
// the VNNI kernel (16 rows at a time: less, the split nibbles serve fewer
// tiles); the tiles themselves take about a third of the time, the
// TILESTORED of each C tile and the fold the rest (measured by leaving
// each part out).
//
// Go's assembler knows no AMX instruction, so they are emitted as bytes
// (amxBytes). The kernels use physical registers only (avo allocates none
// here): the bytes name registers avo cannot see.

// amxSignature: np panels (contiguous, nb blocks each) against ng groups
// of 16 activation rows x, x+xs, …; panel p's outputs for row c at out +
// c*os + 64p; scratch is 64-byte aligned and starts with the two tile
// configurations the caller wrote (amxConfigure in package cpu).
const amxSignature = "func(np int, nb int, w *byte, x *byte, xs int, ng int, out *float32, os int, scratch *byte)"

// Scratch layout, in bytes from its start: two tile configurations (64
// each: 32-element sub-blocks, then Q6_K's 16-element groups), the
// kernel's counters and pointers (64), three C areas (1024 each), then B's
// rows for each sub-block of a panel (16 bytes an element).
const (
	amxSlots = 128
	amxBArea = 192 + 3*1024
)

func amxC(k int) int { return 192 + 1024*k }

// amxMem is a memory operand of an AMX instruction: [base + index*1 +
// disp], or [base + disp] without an index.
type amxMem struct {
	base, index reg.Physical // index nil: none
	disp        int
}

// gpNum is the hardware number of a 64-bit general register.
func gpNum(r reg.Physical) byte {
	for i, g := range []reg.Physical{reg.RAX, reg.RCX, reg.RDX, reg.RBX, reg.RSP, reg.RBP, reg.RSI, reg.RDI,
		reg.R8, reg.R9, reg.R10, reg.R11, reg.R12, reg.R13, reg.R14, reg.R15} {
		if r == g {
			return byte(i)
		}
	}
	panic("amx: not a 64-bit general register: " + r.Asm())
}

// amxBytes encodes one VEX-encoded AMX instruction (map 0F38, W0, L0): pp
// (0: none, 1: 66, 2: F3, 3: F2), opcode, vvvv (a tile, or 0 when unused:
// encoded as 1111), and ModRM's reg field with either the register r/m rm
// (mod 11) or the memory operand m.
func amxBytes(pp, opcode, vvvv, regField byte, rm *byte, m *amxMem) []byte {
	rx, xx, bx := byte(1), byte(1), byte(1) // inverted REX bits
	var modrm byte
	var tail []byte
	if rm != nil {
		modrm = 0xC0 | regField<<3 | *rm
	} else {
		b := gpNum(m.base)
		if b&8 != 0 {
			bx = 0
		}
		var mod byte
		switch {
		case m.disp == 0 && b&7 != 5:
			mod = 0
		case m.disp >= -128 && m.disp < 128:
			mod = 1
		default:
			mod = 2
		}
		if m.index != nil {
			ix := gpNum(m.index)
			if ix&8 != 0 {
				xx = 0
			}
			modrm = mod<<6 | regField<<3 | 4
			tail = append(tail, (ix&7)<<3|b&7) // scale 1
		} else {
			if b&7 == 4 {
				panic("amx: RSP/R12 base needs a SIB byte")
			}
			modrm = mod<<6 | regField<<3 | b&7
		}
		switch mod {
		case 1:
			tail = append(tail, byte(int8(m.disp)))
		case 2:
			d := uint32(int32(m.disp))
			tail = append(tail, byte(d), byte(d>>8), byte(d>>16), byte(d>>24))
		}
	}
	b1 := rx<<7 | xx<<6 | bx<<5 | 0x02
	b2 := (^vvvv&0xF)<<3 | pp
	return append([]byte{0xC4, b1, b2, opcode, modrm}, tail...)
}

// emitBytes emits b as BYTE directives, with a comment naming the
// instruction.
func emitBytes(what string, b []byte) {
	Comment(what)
	for _, x := range b {
		Instruction(&ir.Instruction{Opcode: "BYTE", Operands: []Op{U8(x)}})
	}
}

func ldtilecfg(base reg.Physical) {
	emitBytes("LDTILECFG ("+base.Asm()+")", amxBytes(0, 0x49, 0, 0, nil, &amxMem{base: base}))
}

func tilerelease() {
	rm := byte(0)
	emitBytes("TILERELEASE", amxBytes(0, 0x49, 0, 0, &rm, nil))
}

func tilezero(t byte) {
	rm := byte(0)
	emitBytes(fmt.Sprintf("TILEZERO TMM%d", t), amxBytes(3, 0x49, 0, t, &rm, nil))
}

func tileloadd(t byte, m amxMem) {
	emitBytes(fmt.Sprintf("TILELOADD TMM%d, %d(%s)(%s*1)", t, m.disp, m.base.Asm(), m.index.Asm()), amxBytes(3, 0x4B, 0, t, nil, &m))
}

func tilestored(m amxMem, t byte) {
	emitBytes(fmt.Sprintf("TILESTORED %d(%s)(%s*1), TMM%d", m.disp, m.base.Asm(), m.index.Asm(), t), amxBytes(2, 0x4B, 0, t, nil, &m))
}

// tdpbssd emits TDPBSSD c, a, b: C += A·B on signed bytes. A is ModRM's
// r/m, B is VEX.vvvv.
func tdpbssd(c, a, b byte) {
	emitBytes(fmt.Sprintf("TDPBSSD TMM%d, TMM%d, TMM%d", c, a, b), amxBytes(3, 0x5E, b, c, &a, nil))
}

// amxLayout describes a panel type the AMX kernels read: blocks of subs
// 32-element sub-blocks, each stored as four vectors of nibbles as Q4_0's
// panels store a block (vector j's low nibbles are elements 4j..4j+3,
// its high nibbles 16+4j..).
type amxLayout struct {
	name, what string
	lut        bool // the nibbles index ggml's IQ4 levels
	minus8     bool // the nibbles are biased by 8 (Q4_0)
	subs       int  // sub-blocks per block: 1 (Q4_0, IQ4_NL) or 8 (K)
	wBytes     int  // a panel block's bytes: f16 scales of the 16 rows at 0
	quants     int  // sub-block s's vectors at quants + 256s
	scales     int  // sub-block s's row scales at scales + 16s (subs > 1)
	xBytes     int  // an expanded activation block's bytes: f32 scale at 0
	xQuants    int  // sub-block s's 32 quants at xQuants + 32s
	// Q4_K and Q5_K: eight vectors for each pair of sub-blocks (2g, 2g+1)
	// at quants + 512g, vector j holding elements 4j..4j+3 of sub-block 2g
	// in its low nibbles and of 2g+1 in its high ones; unsigned 6-bit
	// scales; after each block the mins (see q4KPanel); with five, the
	// fifth bits' masks at q4KPanelBytes + 64s + 8j (see q50Panel).
	pairs, five bool
	// Q6_K: sub-blocks of 16 elements (the groups of its int8 scales),
	// made from the vectors A, B, H at quants + 192g as q6KPanel makes
	// them, minus 32; the tiles of the second configuration.
	q6 bool
}

// subLen is the elements of one of l's sub-blocks: a tile's depth.
func (l amxLayout) subLen() int {
	if l.q6 {
		return 16
	}
	return 32
}

var (
	amxQ40   = amxLayout{name: "q40AMX", what: "Q4_0", minus8: true, subs: 1, wBytes: 32 + 4*64, quants: 32, xBytes: xBlock, xQuants: 8}
	amxIQ4NL = amxLayout{name: "iq4NLAMX", what: "IQ4_NL", lut: true, subs: 1, wBytes: 32 + 4*64, quants: 32, xBytes: xBlock, xQuants: 8}
	amxIQ4XS = amxLayout{name: "iq4XSAMX", what: "IQ4_XS", lut: true, subs: 8, wBytes: iq4XSPanelBytes, quants: 160, scales: 32, xBytes: xKBlock, xQuants: xKQuants}
	amxQ4K   = amxLayout{name: "q4KAMX", what: "Q4_K", subs: 8, wBytes: q4KPanelBytes, quants: 320, scales: 64, xBytes: xKBlock, xQuants: xKQuants, pairs: true}
	amxQ5K   = amxLayout{name: "q5KAMX", what: "Q5_K", subs: 8, wBytes: q5KPanelBytes, quants: 320, scales: 64, xBytes: xKBlock, xQuants: xKQuants, pairs: true, five: true}
	amxQ6K   = amxLayout{name: "q6KAMX", what: "Q6_K", subs: 16, wBytes: q6KPanelBytes, quants: 288, scales: 32, xBytes: xKBlock, xQuants: xKQuants, q6: true}
)

// amxPanel emits the kernel of layout l: np 16-row panels against ng
// groups of 16 activation rows. Each panel's sub-blocks are first split
// into B's rows in scratch, the nibbles made signed bytes (Q4_0's minus 8,
// the IQ4 types' levels), so that TDPBSSD leaves the exact integer sums
// (the activations' corrections go unused) and no tile load waits on the
// stores just before it. Then, for each group, two sets of tiles (TMM0–2,
// TMM3–5: C, A, B) alternate between sub-blocks, each sub-block's sums
// folded in while a later one's tiles run, in sub-block order: the fold of
// the VNNI panel kernels of the type, acc = fma(float32(sum), wd*xd, acc)
// per block for Q4_0 and IQ4_NL, acc = fma(float32(sum)*scale, wd*xd, acc)
// per sub-block for IQ4_XS (foldSum).
func amxPanel(l amxLayout) {
	TEXT(l.name, NOSPLIT, amxSignature)
	Pragma("noescape")
	Doc(fmt.Sprintf("%s computes np 16-row panels of %s weights against ng groups of 16 activation rows with AMX tiles.", l.name, l.what))
	var (
		np, bp, blocks    = reg.R8, reg.R9, reg.R10
		wp, xs, xs3       = reg.RCX, reg.RDI, reg.R11
		r0, r4, r8, r12   = reg.RBX, reg.R12, reg.R13, reg.RDX
		scratch, stride64 = reg.RAX, reg.RSI
		tmp               = reg.R14
		nibble, tbl       = reg.Z31, reg.Z30
		wv, hv, dd, s, m  = reg.Z16, reg.Z17, reg.Z18, reg.Z19, reg.Z20
		sc, dmin, c10     = reg.Z21, reg.Z26, reg.Z29
		mv                = []reg.VecPhysical{reg.Z22, reg.Z23, reg.Z24, reg.Z25}
		acc               = []reg.VecPhysical{reg.Z0, reg.Z1, reg.Z2, reg.Z3, reg.Z4, reg.Z5, reg.Z6, reg.Z7, reg.Z8, reg.Z9, reg.Z10, reg.Z11, reg.Z12, reg.Z13, reg.Z14, reg.Z15}
		rows              = []reg.Physical{r0, r4, r8, r12}
	)
	// Slots in scratch: the groups left, the current group's activations
	// and outputs, the panel's weights and outputs.
	var (
		groupsLeft = Mem{Base: scratch, Disp: amxSlots}
		groupX     = Mem{Base: scratch, Disp: amxSlots + 8}
		groupOut   = Mem{Base: scratch, Disp: amxSlots + 16}
		panelW     = Mem{Base: scratch, Disp: amxSlots + 24}
		panelOut   = Mem{Base: scratch, Disp: amxSlots + 32}
	)
	Load(Param("np"), np)
	Load(Param("w"), wp)
	Load(Param("xs"), xs)
	Load(Param("scratch"), scratch)
	Load(Param("out"), tmp)
	MOVQ(tmp, panelOut)
	LEAQ(Mem{Base: xs, Index: xs, Scale: 2}, xs3)
	MOVL(U32(64), reg.ESI)
	MOVL(U32(0x0f0f0f0f), reg.R10L)
	VPBROADCASTD(reg.R10L, nibble)
	switch {
	case l.lut:
		VBROADCASTI32X4(iq4SignedTable(), tbl)
	case l.minus8:
		MOVL(U32(0x08080808), reg.R10L)
		VPBROADCASTD(reg.R10L, tbl)
	}
	if l.five {
		MOVL(U32(0x10101010), reg.R10L)
		VPBROADCASTD(reg.R10L, c10)
	}
	if l.q6 {
		LEAQ(Mem{Base: scratch, Disp: 64}, tmp)
		ldtilecfg(tmp)
	} else {
		ldtilecfg(scratch)
	}
	subB := 16 * l.subLen() // bytes of a sub-block's B
	// row is activation row i's bytes at disp within the current block.
	row := func(i, disp int) Mem {
		m := Mem{Base: rows[i/4], Disp: disp}
		switch i % 4 {
		case 1:
			m.Index, m.Scale = xs, 1
		case 2:
			m.Index, m.Scale = xs, 2
		case 3:
			m.Index, m.Scale = xs3, 1
		}
		return m
	}
	// tiles runs sub-block sub of the current block on tile set k (TMM0–2
	// or TMM3–5: C, A, B): C = A·B, stored to C area a.
	tiles := func(sub, k, a int) {
		tc, ta, tb := byte(3*k), byte(3*k+1), byte(3*k+2)
		tileloadd(tb, amxMem{base: bp, index: stride64, disp: subB * sub})
		tileloadd(ta, amxMem{base: r0, index: xs, disp: l.xQuants + l.subLen()*sub})
		tilezero(tc)
		tdpbssd(tc, ta, tb)
		tilestored(amxMem{base: scratch, index: stride64, disp: amxC(a)}, tc)
	}
	// fold adds the sums in C area a, of sub-block sub of the block lag
	// blocks before the current one, to the accumulators.
	fold := func(sub, a, lag int) {
		if sub == 0 || l.subs == 1 {
			VCVTPH2PS(Mem{Base: wp, Disp: -lag * l.wBytes}, dd)
		}
		if l.subs > 1 {
			if l.pairs {
				VPMOVZXBD(Mem{Base: wp, Disp: -lag*l.wBytes + l.scales + 16*sub}, sc)
			} else {
				VPMOVSXBD(Mem{Base: wp, Disp: -lag*l.wBytes + l.scales + 16*sub}, sc)
			}
			VCVTDQ2PS(sc, sc)
		}
		for i, acc := range acc {
			VCVTDQ2PS(Mem{Base: scratch, Disp: amxC(a) + 64*i}, s)
			if l.subs > 1 {
				VMULPS(sc, s, s)
			}
			VMULPS_BCST(row(i, -lag*l.xBytes), dd, m)
			VFMADD231PS(m, s, acc)
		}
	}
	// fold the mins of the block lag blocks back (Q4_K, Q5_K), after its
	// sub-blocks: acc -= mins*dm, rounded once, as q4KPanel does.
	foldMins := func(lag int) {
		if !l.pairs {
			return
		}
		for k, v := range mv {
			VPMOVZXBW(Mem{Base: wp, Disp: -lag*l.wBytes + 192 + 32*k}, v)
		}
		VCVTPH2PS(Mem{Base: wp, Disp: -lag*l.wBytes + 32}, dmin)
		for i, acc := range acc {
			VPXORD(s, s, s)
			for k, v := range mv {
				vpdpwssdBcst(row(i, -lag*l.xBytes+xKSums+4*k), v, s)
			}
			VCVTDQ2PS(s, s)
			VMULPS_BCST(row(i, -lag*l.xBytes), dmin, m)
			VFNMADD231PS(m, s, acc)
		}
	}
	next := func() {
		ADDQ(U32(l.wBytes), wp)
		ADDQ(U32(subB*l.subs), bp)
		for _, r := range rows {
			ADDQ(U32(l.xBytes), r)
		}
		DECQ(blocks)
	}

	Label("panel")
	// B's rows for every sub-block of the panel.
	MOVQ(wp, panelW)
	LEAQ(Mem{Base: scratch, Disp: amxBArea}, bp)
	Load(Param("nb"), blocks)
	Label("split")
	// nibbles splits the vector at m into its low nibbles (wv) and high
	// ones (hv), as bytes.
	nibbles := func(m Mem) {
		VMOVDQU64(m, wv)
		VPSRLW(Imm(4), wv, hv)
		VPANDD(nibble, wv, wv)
		VPANDD(nibble, hv, hv)
	}
	switch {
	case l.pairs: // vector j of pair g: row j of sub-blocks 2g (low) and 2g+1 (high)
		for g := range 4 {
			for j := range 8 {
				nibbles(Mem{Base: wp, Disp: l.quants + 512*g + 64*j})
				if l.five {
					KMOVQ(Mem{Base: wp, Disp: q4KPanelBytes + 64*(2*g) + 8*j}, reg.K1)
					VPADDB(c10, wv, reg.K1, wv)
					KMOVQ(Mem{Base: wp, Disp: q4KPanelBytes + 64*(2*g+1) + 8*j}, reg.K1)
					VPADDB(c10, hv, reg.K1, hv)
				}
				VMOVDQU64(wv, Mem{Base: bp, Disp: 512*(2*g) + 64*j})
				VMOVDQU64(hv, Mem{Base: bp, Disp: 512*(2*g+1) + 64*j})
			}
		}
	case l.q6:
		for g := range l.subs {
			q6KWeights(Mem{Base: wp, Disp: l.quants + 192*g}, bp, subB*g)
		}
	default: // vector j of a sub-block: its rows j (low) and 4+j (high)
		for sub := range l.subs {
			for j := range 4 {
				nibbles(Mem{Base: wp, Disp: l.quants + 256*sub + 64*j})
				if l.lut {
					VPSHUFB(wv, tbl, wv)
					VPSHUFB(hv, tbl, hv)
				} else if l.minus8 {
					VPSUBB(tbl, wv, wv)
					VPSUBB(tbl, hv, hv)
				}
				VMOVDQU64(wv, Mem{Base: bp, Disp: 512*sub + 64*j})
				VMOVDQU64(hv, Mem{Base: bp, Disp: 512*sub + 64*(4+j)})
			}
		}
	}
	ADDQ(U32(l.wBytes), wp)
	ADDQ(U32(subB*l.subs), bp)
	DECQ(blocks)
	JNZ(LabelRef("split"))
	Load(Param("ng"), tmp)
	MOVQ(tmp, groupsLeft)
	Load(Param("x"), tmp)
	MOVQ(tmp, groupX)
	MOVQ(panelOut, tmp)
	MOVQ(tmp, groupOut)

	Label("group")
	MOVQ(groupX, r0)
	LEAQ(Mem{Base: r0, Index: xs, Scale: 4}, r4)
	LEAQ(Mem{Base: r4, Index: xs, Scale: 4}, r8)
	LEAQ(Mem{Base: r8, Index: xs, Scale: 4}, r12)
	MOVQ(panelW, wp)
	LEAQ(Mem{Base: scratch, Disp: amxBArea}, bp)
	for _, a := range acc {
		VXORPS(a, a, a)
	}
	Load(Param("nb"), blocks)
	if l.subs == 1 {
		// Block b runs on tile set b%2 into C area b%3 and is folded in
		// two blocks later, so that its tiles have long been stored when
		// the loads read them.
		tiles(0, 0, 0)
		next()
		JZ(LabelRef("one"))
		tiles(0, 1, 1)
		next()
		JZ(LabelRef("exit1"))
		Label("block")
		for u := range 6 {
			b := 2 + u
			tiles(0, b%2, b%3)
			fold(0, (b-2)%3, 2)
			next()
			JZ(LabelRef(fmt.Sprintf("exit%d", b%3)))
		}
		JMP(LabelRef("block"))
		// Block b was the last (C area b%3): fold b-1, then b.
		for a := range 3 {
			Label(fmt.Sprintf("exit%d", a))
			fold(0, (a+2)%3, 2)
			fold(0, a, 1)
			JMP(LabelRef("store"))
		}
		Label("one")
		fold(0, 0, 1)
	} else {
		// Sub-block s runs on tile set s%2 into C area s%2 and is folded
		// in after the next one's tiles; the block's last (odd) one after
		// the next block's first.
		JMP(LabelRef("first"))
		Label("block")
		tiles(0, 0, 0)
		fold(l.subs-1, 1, 1)
		foldMins(1)
		JMP(LabelRef("rest"))
		Label("first")
		tiles(0, 0, 0)
		Label("rest")
		for sub := 1; sub < l.subs; sub++ {
			tiles(sub, sub%2, sub%2)
			fold(sub-1, (sub-1)%2, 0)
		}
		next()
		JNZ(LabelRef("block"))
		fold(l.subs-1, 1, 1)
		foldMins(1)
	}
	Label("store")
	// Row i's 16 outputs at the group's out + i*os.
	Load(Param("os"), r4)
	LEAQ(Mem{Base: r4, Index: r4, Scale: 2}, r8)
	MOVQ(groupOut, r0)
	for i, a := range acc {
		if i > 0 && i%4 == 0 {
			LEAQ(Mem{Base: r0, Index: r4, Scale: 4}, r0)
		}
		m := Mem{Base: r0}
		switch i % 4 {
		case 1:
			m.Index, m.Scale = r4, 1
		case 2:
			m.Index, m.Scale = r4, 2
		case 3:
			m.Index, m.Scale = r8, 1
		}
		VMOVUPS(a, m)
	}
	// The next group: 16 rows on in x and out.
	SHLQ(Imm(4), r4)
	ADDQ(r4, groupOut)
	MOVQ(xs, tmp)
	SHLQ(Imm(4), tmp)
	ADDQ(tmp, groupX)
	DECQ(groupsLeft)
	JNZ(LabelRef("group"))
	// The next panel: its weights follow this one's (wp is there), its
	// outputs 16 floats on.
	ADDQ(Imm(64), panelOut)
	DECQ(np)
	JNZ(LabelRef("panel"))
	tilerelease()
	ret()
}

// q6KWeights stores group g's four weight vectors of a Q6_K panel (A at a,
// B and H after it), made as q6KPanel makes them and less 32 (signed), at
// bp+disp: B's four rows for the group. It uses Z16–Z17, Z19–Z20,
// Z22–Z25 and Z27–Z28, which the fold leaves alone outside its loop.
func q6KWeights(a Mem, bp reg.Physical, disp int) {
	m0f, m33, c32 := reg.Z31, reg.Z28, reg.Z27
	MOVL(U32(0x33333333), reg.R14L)
	VPBROADCASTD(reg.R14L, m33)
	MOVL(U32(0x20202020), reg.R14L)
	VPBROADCASTD(reg.R14L, c32)
	A, B, H := a, a.Offset(64), a.Offset(128)
	sel := func(src Op, dst reg.VecPhysical) { VPTERNLOGD(Imm(0xb8), src, m0f, dst) }
	hlo, hhi, w0, w1, a1, w3, b1 := reg.Z16, reg.Z17, reg.Z19, reg.Z20, reg.Z22, reg.Z23, reg.Z24
	VPANDD(H, m33, hlo)
	VPANDND(H, m33, hhi)
	VPSLLW(Imm(4), hlo, w0)
	sel(A, w0)
	VPSLLW(Imm(2), hhi, w1)
	VPSRLW(Imm(4), A, a1)
	sel(a1, w1)
	w2 := hlo
	sel(B, w2)
	VPSRLW(Imm(2), hhi, w3)
	VPSRLW(Imm(4), B, b1)
	sel(b1, w3)
	for k, w := range []reg.VecPhysical{w0, w1, w2, w3} {
		VPSUBB(c32, w, w)
		VMOVDQU64(w, Mem{Base: bp, Disp: disp + 64*k})
	}
}

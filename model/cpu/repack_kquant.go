package cpu

import (
	"encoding/binary"

	"github.com/strata-llm/strata/model/ggml"
)

// Repacked K-quants. The panel kernels read Q4_K, Q5_K, Q6_K and IQ4_XS
// matrices in panels of panelRows rows, one 256-element super-block after another; in
// each, the quants of row i sit in int32 lane i of 64-byte vectors, four
// elements to a lane, so that one VPDPBUSD multiplies four elements of 16
// rows by four activation quants. A panel takes as many bytes as its 16
// rows did, give or take the unpacked scales, and the rows past the end of
// the matrix are zeros (zero scales, zero quants).
//
// Q4_K, q4KPanelBytes per super-block:
//
//	[0:32)       the 16 rows' d (f16)
//	[32:64)      the 16 rows' dmin (f16)
//	[64:192)     scales: sub-block s's 16 six-bit scales at 64+16s, one byte per row
//	[192:320)    mins: for k < 4, row i's min(2k) and min(2k+1) at 192+32k+2i, +1
//	[320:2368)   quants: for each pair of sub-blocks (2g, 2g+1), eight
//	             vectors; vector j holds row i's stored bytes
//	             qs[32g+4j .. 32g+4j+3] unchanged in lane i (their low nibbles
//	             are elements 4j..4j+3 of sub-block 2g, their high nibbles
//	             the same of sub-block 2g+1)
//
// Q5_K, q5KPanelBytes per super-block: Q4_K's panel of the same scales,
// mins and nibbles, then
//
//	[2368:2880)  the quants' fifth bits: for sub-block s and quant vector j
//	             (as above), a 64-bit mask at 2368+64s+8j with bit 4i+k set
//	             when the quant that byte k of lane i stands for has bit 4
//	             set (Q5_0's masks, repack_q5.go); the kernels add 16 there
//
// or, in the planes layout (panelSet.planes: the AVX2 kernels, which have
// no mask registers, and the VNNI kernels of CPUs without AMX, on which
// loading the masks held them back), Q4_K's head [0:320), then
//
//	[320:832)    the fifth bits as planes: for quant vector j, a vector at
//	             320+64j holding row i's stored high bits qh[4j .. 4j+3]
//	             in lane i: bit s of byte k of lane i is bit 4 of the quant
//	             that byte k of lane i of vector j stands for in sub-block s
//	[832:2880)   Q4_K's nibbles, 512 bytes on
//
// so that the kernels read a super-block front to back.
//
// Q6_K, q6KPanelBytes per super-block:
//
//	[0:32)       the 16 rows' d (f16)
//	[32:288)     scales: group g's 16 int8 scales at 32+16g, one byte per row
//	[288:3360)   quants: for each group g of 16 elements, three vectors A, B,
//	             H at 288+192g; with q(e) the unsigned 6-bit quant of row i's
//	             element 16g+e, byte k of lane i of A is the low four bits of
//	             q(k) and, above them, of q(4+k); of B the same of q(8+k) and
//	             q(12+k); of H the high two bits of q(k), q(4+k), q(8+k) and
//	             q(12+k), from bit 0 up
//
// IQ4_XS, iq4XSPanelBytes per super-block:
//
//	[0:32)       the 16 rows' d (f16)
//	[32:160)     scales: sub-block s's 16 scales minus 32 (int8) at 32+16s
//	[160:2208)   quants: for each sub-block s, four vectors at 160+256s+64j,
//	             vector j holding row i's stored bytes qs[16s+4j ..
//	             16s+4j+3] in lane i (their low nibbles index elements
//	             4j..4j+3 of the sub-block, their high nibbles 16+4j..), as
//	             Q4_0's panels hold a block; the kernels look the levels up
//	             plus 128 (unsigned) and start each sum at -128 times the
//	             activations' sum
//
// Q2_K and Q3_K keep their 2-bit parts in one vector L per group g of 16
// elements: byte k of lane i holds the low two bits of row i's elements
// 16g+k, 16g+4+k, 16g+8+k and 16g+12+k at bits 0, 2, 4 and 6, so that
// weight vector j (elements 16g+4j..16g+4j+3, four to a lane) is L shifted
// right by 2j, masked to two bits. Q2_K, q2KPanelBytes per super-block:
//
//	[0:32)       the 16 rows' d (f16)
//	[32:64)      the 16 rows' dmin (f16)
//	[64:320)     scales: group g's 16 scale bytes as stored (scale in the
//	             low nibble, min in the high) at 64+16g
//	[320:1344)   L of group g at 320+64g
//
// Q3_K, q3KPanelBytes per super-block:
//
//	[0:32)       the 16 rows' d (f16)
//	[32:288)     scales: group g's 16 scales minus 32 (int8) at 32+16g
//	[288:800)    the high bits as planes: vector 4h+j at 288+64(4h+j)
//	             holds row i's stored hmask bytes 16h+4j .. 16h+4j+3 in
//	             lane i, so that bit g/2 of byte k of lane i of vector
//	             4(g%2)+j is the hmask bit of row i's element 16g+4j+k (set:
//	             its quant is the low bits; clear, the low bits minus 4); the
//	             kernels OR in 4 there, which makes the quants plus 4 (0..7),
//	             and start each group's sum at -4 times its activation sum.
//	             (Masks of one bit per byte, as Q5_0's, took a KMOVQ per
//	             vector, which held the VNNI kernel to a quarter of Q4_K's
//	             speed per byte on an AMD EPYC Zen 4, and six instructions
//	             per vector to expand in the AVX2 one.)
//	[800:1824)   L of group g at 800+64g
//
// The activation rows are Q8_K super-blocks expanded to xKBlock bytes (see
// expandRowK) that carry the sums the kernels need beside the quants.
const (
	q4KPanelBytes = 2368
	q5KPanelBytes = q4KPanelBytes + 8*64
	// Q5_K's planes layout: the planes, then the nibbles.
	q5KPlanes, q5KPlaneQuants = 320, 320 + 8*64
	q6KPanelBytes             = 3360
	iq4XSPanelBytes           = 32 + 8*16 + 8*256
	q2KPanelBytes             = 64 + 256 + 16*64
	q3KPanelBytes             = 32 + 256 + 16*64 + 16*32
	// Q3_K's planes and L vectors.
	q3KPlanes, q3KL = 288, 288 + 8*64
)

// xKBlock is the bytes of one super-block of an expanded K-quant activation
// row: the float32 d, the eight 32-element sums of the quants (int16),
// sixteen corrections -32 times each 16-element sum (int32), then the 256
// int8 quants.
const (
	xKBlock  = 340
	xKSums   = 4
	xKCorr   = 20
	xKQuants = 84
)

// isKPanel reports whether t repacks into K-quant panels (256-element
// super-blocks, Q8_K activations).
func isKPanel(t ggml.Type) bool {
	switch t {
	case ggml.Q2_K, ggml.Q3_K, ggml.Q4_K, ggml.Q5_K, ggml.Q6_K, ggml.IQ4_XS:
		return true
	}
	return false
}

// kPanelBytes returns the bytes of a stored super-block of the K-panel type
// t and of one super-block of its panel.
func kPanelBytes(t ggml.Type) (stored, panel int) {
	switch t {
	case ggml.Q4_K:
		return q4KBytes, q4KPanelBytes
	case ggml.Q5_K:
		return q5KBytes, q5KPanelBytes
	case ggml.IQ4_XS:
		return iq4XBytes, iq4XSPanelBytes
	case ggml.Q2_K:
		return q2KBytes, q2KPanelBytes
	case ggml.Q3_K:
		return q3KBytes, q3KPanelBytes
	}
	return q6KBytes, q6KPanelBytes
}

// repackK returns the rows×cols matrix data of the K-panel type t in
// panels, Q5_K's fifth bits in planes where planes is set.
func repackK(t ggml.Type, rows, cols int, data []byte, planes bool) []byte {
	nb := cols / ggml.QKK
	bsz, pbb := kPanelBytes(t)
	panels := (rows + panelRows - 1) / panelRows
	out := make([]byte, panels*nb*pbb)
	for p := range panels {
		for b := range nb {
			dst := out[(p*nb+b)*pbb : (p*nb+b+1)*pbb]
			for i := range min(panelRows, rows-p*panelRows) {
				r := p*panelRows + i
				src := data[(r*nb+b)*bsz : (r*nb+b+1)*bsz]
				switch t {
				case ggml.Q4_K:
					repackQ4KRow(i, src[:16], src[16:144], dst, 320)
				case ggml.Q5_K:
					repackQ5KRow(i, src, dst, planes)
				case ggml.IQ4_XS:
					repackIQ4XSRow(i, src, dst)
				case ggml.Q2_K:
					repackQ2KRow(i, src, dst)
				case ggml.Q3_K:
					repackQ3KRow(i, src, dst)
				default:
					repackQ6KRow(i, src, dst)
				}
			}
		}
	}
	return out
}

// repackQ4KRow writes one Q4_K super-block of a panel's row i, from its
// head (d, dmin and the packed scales, 16 bytes) and its 128 bytes of
// nibbles, the nibbles' vectors from byte qoff (320; Q5_K's planes
// layout, q5KPlaneQuants); Q5_K's panels share it.
func repackQ4KRow(i int, head, qs, dst []byte, qoff int) {
	copy(dst[2*i:2*i+2], head[0:2])
	copy(dst[32+2*i:32+2*i+2], head[2:4])
	for s := range 8 {
		sc, m := ggml.Q4KScaleMin(s, head[4:16])
		dst[64+16*s+i] = sc
		dst[192+32*(s/2)+2*i+s%2] = m
	}
	for g := range 4 {
		for j := range 8 {
			o := qoff + 512*g + 64*j + 4*i
			copy(dst[o:o+4], qs[32*g+4*j:32*g+4*j+4])
		}
	}
}

// repackQ5KRow writes one Q5_K super-block of a panel's row i: Q4_K's
// panel of its low four bits, and its fifth bits (bit s of qh[l] for
// element l of sub-block s) into the masks, four bits of row i in each,
// or as they are stored into the planes.
func repackQ5KRow(i int, src, dst []byte, planes bool) {
	qh := src[16:48]
	if planes {
		repackQ4KRow(i, src[:16], src[48:176], dst, q5KPlaneQuants)
		for j := range 8 {
			o := q5KPlanes + 64*j + 4*i
			copy(dst[o:o+4], qh[4*j:4*j+4])
		}
		return
	}
	repackQ4KRow(i, src[:16], src[48:176], dst, 320)
	for s := range 8 {
		for j := range 8 {
			var bits byte
			for k := range 4 {
				bits |= qh[4*j+k] >> s & 1 << k
			}
			dst[q4KPanelBytes+64*s+8*j+i/2] |= bits << (4 * (i % 2))
		}
	}
}

// crumbs writes the 2-bit parts of a Q2_K or Q3_K super-block's 256
// quants, stored in qs (64 bytes: element 128h+32j+l in bits 2j..2j+1 of
// qs[32h+l]), into the L vectors at dst+off+64g for row i (see above).
func crumbs(i int, qs []byte, dst []byte, off int) {
	for g := range 16 {
		for k := range 4 {
			var b byte
			for j := range 4 {
				e := 16*g + 4*j + k
				b |= qs[32*(e/128)+e%32] >> (2 * (e % 128 / 32)) & 3 << (2 * j)
			}
			dst[off+64*g+4*i+k] = b
		}
	}
}

// repackQ2KRow writes one Q2_K super-block of a panel's row i.
func repackQ2KRow(i int, src, dst []byte) {
	copy(dst[2*i:2*i+2], src[80:82])
	copy(dst[32+2*i:32+2*i+2], src[82:84])
	for g := range 16 {
		dst[64+16*g+i] = src[g]
	}
	crumbs(i, src[16:80], dst, 320)
}

// repackQ3KRow writes one Q3_K super-block of a panel's row i.
func repackQ3KRow(i int, src, dst []byte) {
	copy(dst[2*i:2*i+2], src[108:110])
	sc := ggml.Q3KScales(src[96:108])
	for g := range 16 {
		dst[32+16*g+i] = byte(sc[g])
	}
	crumbs(i, src[32:96], dst, q3KL)
	hm := src[0:32]
	for v := range 8 {
		o := q3KPlanes + 64*v + 4*i
		copy(dst[o:o+4], hm[4*v:4*v+4])
	}
}

// repackIQ4XSRow writes one IQ4_XS super-block of a panel's row i.
func repackIQ4XSRow(i int, src, dst []byte) {
	copy(dst[2*i:2*i+2], src[0:2])
	sh := binary.LittleEndian.Uint16(src[2:])
	for s := range 8 {
		dst[32+16*s+i] = byte(int8(ggml.IQ4XSScale(sh, src[4:8], s)))
		for j := range 4 {
			o := 160 + 256*s + 64*j + 4*i
			copy(dst[o:o+4], src[8+16*s+4*j:8+16*s+4*j+4])
		}
	}
}

// q6KQuants unpacks a Q6_K super-block's quants, unsigned (0..63): element
// e = 128h + 32k + l (l < 32) has its low four bits in nibble k/2 of
// ql[64h + 32(k%2) + l] and its high two at bits 2k of qh[32h + l].
func q6KQuants(blk []byte, q *[ggml.QKK]byte) {
	ql, qh := (*[128]byte)(blk[0:]), (*[64]byte)(blk[128:])
	for h := range 2 {
		for l := range 32 {
			a, b, c := ql[64*h+l], ql[64*h+32+l], qh[32*h+l]
			e := 128*h + l
			q[e] = a&0xf | c&3<<4
			q[e+32] = b&0xf | c>>2&3<<4
			q[e+64] = a>>4 | c>>4&3<<4
			q[e+96] = b>>4 | c>>6<<4
		}
	}
}

// repackQ6KRow writes one Q6_K super-block of a panel's row i.
func repackQ6KRow(i int, src, dst []byte) {
	copy(dst[2*i:2*i+2], src[208:210])
	var q [ggml.QKK]byte
	q6KQuants(src, &q)
	for g := range 16 {
		dst[32+16*g+i] = src[192+g]
		base := 288 + 192*g + 4*i
		e := q[16*g : 16*g+16]
		a, b, h := dst[base:base+4], dst[base+64:base+68], dst[base+128:base+132]
		for k := range 4 {
			q0, q1, q2, q3 := e[k], e[4+k], e[8+k], e[12+k]
			a[k] = q0&0xf | q1<<4
			b[k] = q2&0xf | q3<<4
			h[k] = q0>>4 | q1>>4<<2 | q2>>4<<4 | q3>>4<<6
		}
	}
}

// expandRowK writes the Q8_K activation row q (nb super-blocks) to dst in
// the K-quant panel kernels' layout (xKBlock bytes per super-block).
func expandRowK(nb int, q, dst []byte) {
	_, _ = q[nb*q8KBytes-1], dst[nb*xKBlock-1]
	for b := range nb {
		src := q[b*q8KBytes : (b+1)*q8KBytes]
		d := dst[b*xKBlock : (b+1)*xKBlock]
		copy(d[:4], src[:4])
		var sums [16]int32
		for g := range sums {
			for _, v := range src[4+16*g : 4+16*g+16] {
				sums[g] += int32(int8(v))
			}
			binary.LittleEndian.PutUint32(d[xKCorr+4*g:], uint32(-32*sums[g]))
		}
		for s := range 8 {
			binary.LittleEndian.PutUint16(d[xKSums+2*s:], uint16(sums[2*s]+sums[2*s+1]))
		}
		copy(d[xKQuants:], src[4:4+256])
	}
}

// quantExpandK converts the activation row src (whole super-blocks) to dst
// in the K-quant panel kernels' layout: ggml.QuantizeActivationRow's Q8_K,
// expanded as expandRowK does. The AVX-512 and AVX2 quantizers write the
// layout directly, with the same bits; the portable path converts through
// q, which must hold a Q8_K row of len(src) elements.
func quantExpandK(src []float32, dst, q []byte) {
	nb := len(src) / ggml.QKK
	_ = dst[nb*xKBlock-1]
	switch {
	case haveElementwise():
		quantQ8KXAVX512(nb, &src[0], &dst[0])
		return
	case haveElementwiseAVX2():
		quantQ8KXAVX2(nb, &src[0], &dst[0])
		return
	}
	ConvertActivation(ggml.Q4_K, src, q[:nb*q8KBytes])
	expandRowK(nb, q, dst)
}

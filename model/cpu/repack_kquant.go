package cpu

import (
	"encoding/binary"

	"github.com/strata-llm/strata/model/ggml"
)

// Repacked K-quants. The panel kernels read Q4_K and Q6_K matrices in
// panels of panelRows rows, one 256-element super-block after another; in
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
// The activation rows are Q8_K super-blocks expanded to xKBlock bytes (see
// expandRowK) that carry the sums the kernels need beside the quants.
const (
	q4KPanelBytes = 2368
	q6KPanelBytes = 3360
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

// isKPanel reports whether t repacks into K-quant panels.
func isKPanel(t ggml.Type) bool { return t == ggml.Q4_K || t == ggml.Q6_K }

// repackK returns the rows×cols matrix data of type t (Q4_K or Q6_K) in
// panels.
func repackK(t ggml.Type, rows, cols int, data []byte) []byte {
	nb := cols / ggml.QKK
	bsz, pbb := q4KBytes, q4KPanelBytes
	if t == ggml.Q6_K {
		bsz, pbb = q6KBytes, q6KPanelBytes
	}
	panels := (rows + panelRows - 1) / panelRows
	out := make([]byte, panels*nb*pbb)
	for p := range panels {
		for b := range nb {
			dst := out[(p*nb+b)*pbb : (p*nb+b+1)*pbb]
			for i := range min(panelRows, rows-p*panelRows) {
				r := p*panelRows + i
				src := data[(r*nb+b)*bsz : (r*nb+b+1)*bsz]
				if t == ggml.Q4_K {
					repackQ4KRow(i, src, dst)
				} else {
					repackQ6KRow(i, src, dst)
				}
			}
		}
	}
	return out
}

// repackQ4KRow writes one Q4_K super-block of a panel's row i.
func repackQ4KRow(i int, src, dst []byte) {
	copy(dst[2*i:2*i+2], src[0:2])
	copy(dst[32+2*i:32+2*i+2], src[2:4])
	for s := range 8 {
		sc, m := ggml.Q4KScaleMin(s, src[4:16])
		dst[64+16*s+i] = sc
		dst[192+32*(s/2)+2*i+s%2] = m
	}
	for g := range 4 {
		for j := range 8 {
			o := 320 + 512*g + 64*j + 4*i
			copy(dst[o:o+4], src[16+32*g+4*j:16+32*g+4*j+4])
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
// expanded as expandRowK does. The AVX-512 quantizer writes the layout
// directly, with the same bits; the portable path converts through q, which
// must hold a Q8_K row of len(src) elements.
func quantExpandK(src []float32, dst, q []byte) {
	nb := len(src) / ggml.QKK
	_ = dst[nb*xKBlock-1]
	if haveElementwise() {
		if nb > 0 {
			quantQ8KXAVX512(nb, &src[0], &dst[0])
		}
		return
	}
	ConvertActivation(ggml.Q4_K, src, q[:nb*q8KBytes])
	expandRowK(nb, q, dst)
}

package cpu

import (
	"encoding/binary"

	"github.com/strata-llm/strata/model/ggml"
)

// Repacked Q5_0. A panel block of q50PanelBytes holds, for one 32-element
// block of 16 rows:
//
//	[0:32)     the 16 rows' d (f16)
//	[32:96)    eight 64-bit masks of the fifth bits: mask v has bit 4i+k set
//	           when the quant that byte k of lane i of weight vector v
//	           stands for has its bit 4 set
//	[96:352)   the quants as Q4_0's panels hold them: vector j has row i's
//	           stored bytes qs[4j .. 4j+3] in lane i
//
// Weight vector v < 4 is the low nibbles of vector v (elements 4v..4v+3),
// v >= 4 the high nibbles of vector v-4 (elements 16+4(v-4)..); the kernel
// adds 16 to the bytes its mask selects (VPADDB under the mask), which
// makes the unsigned 5-bit quants, and the activation's correction -16
// times its sum takes the offset off. A panel takes as many bytes as its 16
// rows did.
//
// In the planes layout (panelSet.planes: the AVX2 kernels, which have no
// mask registers) [32:96) holds the same bits transposed: byte 4i+k, one
// for each byte of a weight vector, has bit v set when the quant that byte
// of vector v stands for has its bit 4 set, so that a shift and a mask give
// any vector's fifth bits.
//
// A Q5_1 panel block (q51PanelBytes) is Q5_0's with the 16 rows' f16 mins
// inserted after their d (so everything after them 32 bytes on); its
// kernel starts the sums at zero (the quants are unsigned) and adds the
// min times the activation block's s, which expandRow puts where Q5_0's
// correction is.
const (
	q50PanelBytes = panelRows * q50Bytes
	q51PanelBytes = panelRows * q51Bytes
)

// repackQ50 returns the rows×cols Q5_0 or (t) Q5_1 matrix data in panels,
// the fifth bits in planes where planes is set.
func repackQ50(t ggml.Type, rows, cols int, data []byte, planes bool) []byte {
	nb := cols / ggml.QK
	bsz, pbb, off := q50Bytes, q50PanelBytes, 0
	if t == ggml.Q5_1 {
		bsz, pbb, off = q51Bytes, q51PanelBytes, 2
	}
	panels := (rows + panelRows - 1) / panelRows
	out := make([]byte, panels*nb*pbb)
	for p := range panels {
		for b := range nb {
			dst := out[(p*nb+b)*pbb : (p*nb+b+1)*pbb]
			var masks [8]uint64
			for i := range min(panelRows, rows-p*panelRows) {
				r := p*panelRows + i
				src := data[(r*nb+b)*bsz : (r*nb+b+1)*bsz]
				copy(dst[2*i:2*i+2], src[0:2])
				if off > 0 {
					copy(dst[32+2*i:32+2*i+2], src[2:4])
				}
				qh := binary.LittleEndian.Uint32(src[2+off:])
				for j := range 4 {
					copy(dst[16*off+96+64*j+4*i:16*off+96+64*j+4*i+4], src[off+6+4*j:off+6+4*j+4])
				}
				// Byte k of lane i of weight vector v stands for the element
				// whose fifth bit is qh's bit k+4v (v < 4: the low nibbles'
				// elements 4v+k, v >= 4: the high ones', 16+4(v-4)+k).
				if planes {
					for k := range 4 {
						dst[16*off+32+4*i+k] = everyFourth(qh >> k)
					}
					continue
				}
				for v := range 8 {
					for k := range 4 {
						masks[v] |= uint64(qh>>(k+4*v)&1) << (4*i + k)
					}
				}
			}
			if !planes {
				for v, m := range masks {
					binary.LittleEndian.PutUint64(dst[16*off+32+8*v:], m)
				}
			}
		}
	}
	return out
}

// everyFourth returns bits 0, 4, 8, …, 28 of x as bits 0..7 of a byte (a
// PEXT by 0x11111111, in three shift-and-mask steps): the planes byte of
// one lane byte, its bit v the fifth bit of weight vector v.
func everyFourth(x uint32) byte {
	x &= 0x11111111
	x = (x | x>>3) & 0x03030303
	x = (x | x>>6) & 0x000f000f
	return byte(x | x>>12)
}

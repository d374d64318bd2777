package cpu

import (
	"encoding/binary"
	"math"
	"math/bits"

	"github.com/strata-llm/strata/model/ggml"
)

// Repacked weights. The panel kernels (see panelFunc) read Q8_0 and Q4_0
// matrices in panels of panelRows rows: for each 32-element block in order,
// the 16 rows' f16 scales (32 bytes), then the quants with row i's four
// bytes in int32 lane i of every 64-byte vector. Q8_0 has eight vectors,
// vector k holding elements 4k..4k+3 plus 128, so that they are VPDPBUSD's
// unsigned bytes; Q4_0 has four, vector j holding the block's stored bytes
// 4j..4j+3 unchanged (their low nibbles are elements 4j..4j+3, their high
// nibbles 16+4j..16+4j+3); IQ4_NL's panels are Q4_0's, its nibbles indexing
// the levels. A panel takes as many bytes as its 16 rows did,
// so a repacked matrix is the stored one rounded up to whole panels (the
// rows past the end have zero scales and zero weights). The layout lets one
// instruction multiply four elements of 16 rows, and streams every panel
// front to back. Q5_0 (repack_q5.go) adds the quants' fifth bits to Q4_0's
// layout; Q4_K and Q6_K (repack_kquant.go) have panels of 256-element
// super-blocks.
const panelRows = 16

// panelBlockBytes is the bytes of one block of a panel of type t.
func panelBlockBytes(t ggml.Type) int {
	switch t {
	case ggml.Q4_0, ggml.IQ4_NL:
		return panelRows * q40Bytes
	case ggml.Q5_0:
		return q50PanelBytes
	case ggml.Q5_1:
		return q51PanelBytes
	}
	if isKPanel(t) {
		_, pb := kPanelBytes(t)
		return pb
	}
	return panelRows * q80Bytes
}

// panelBlock is the elements of one block of a panel of type t: 32, or 256
// for the K-quants.
func panelBlock(t ggml.Type) int {
	if isKPanel(t) {
		return ggml.QKK
	}
	return ggml.QK
}

// expandedBlockBytes is the bytes of one block of an activation row
// expanded for the panel kernels of type t (see expandRow).
func expandedBlockBytes(t ggml.Type) int {
	if isKPanel(t) {
		return xKBlock
	}
	if t == ggml.Q8_0 || t == ggml.Q5_0 {
		return xQ80Lanes
	}
	return xBlock
}

// repack returns the rows×cols matrix data of type t (Q8_0, Q4_0, IQ4_NL,
// Q5_0 or a K-panel type; see repack_q5.go and repack_kquant.go for the
// last ones) in the panels that ps's kernels read.
func (ps *panelSet) repack(t ggml.Type, rows, cols int, data []byte) []byte {
	if isKPanel(t) {
		return repackK(t, rows, cols, data, ps.planes)
	}
	if t == ggml.Q5_0 || t == ggml.Q5_1 {
		return repackQ50(t, rows, cols, data, ps.planes)
	}
	nb := cols / ggml.QK
	bsz, pbb := q80Bytes, panelBlockBytes(t)
	if t != ggml.Q8_0 {
		bsz = q40Bytes // Q4_0, IQ4_NL
	}
	panels := (rows + panelRows - 1) / panelRows
	out := make([]byte, panels*nb*pbb)
	for p := range panels {
		for b := range nb {
			dst := out[(p*nb+b)*pbb : (p*nb+b+1)*pbb]
			for i := range panelRows {
				r := p*panelRows + i
				if r >= rows {
					if t == ggml.Q8_0 { // quants of zero, plus 128
						for k := range 8 {
							copy(dst[32+64*k+4*i:32+64*k+4*i+4], []byte{0x80, 0x80, 0x80, 0x80})
						}
					}
					continue // Q4_0, IQ4_NL: nibbles of zero times a zero scale
				}
				src := data[(r*nb+b)*bsz : (r*nb+b+1)*bsz]
				dst[2*i], dst[2*i+1] = src[0], src[1]
				if t == ggml.Q8_0 {
					for k := range 8 {
						for e := range 4 {
							dst[32+64*k+4*i+e] = src[2+4*k+e] ^ 0x80
						}
					}
				} else {
					for j := range 4 {
						copy(dst[32+64*j+4*i:32+64*j+4*i+4], src[2+4*j:2+4*j+4])
					}
				}
			}
		}
	}
	return out
}

// xBlock is the bytes of one block of an expanded activation row: the
// float32 scale, the int32 correction, the 32 int8 quants.
const xBlock = 40

// expandRow writes the Q8_0 activation row q (nb blocks) to dst in the
// panel kernels' layout for weights of type t. The correction is minus the
// sum of the block's quants times 128 (IQ4_NL: the kernels look its levels
// up plus 128) or 8 (Q4_0: the nibbles are the weights plus 8), so that it
// starts each block's integer sum at the exact value to subtract; Q8_0 and
// Q5_0 have one such correction per group of four (expandRowQ80Lanes),
// Q5_1 none (expandRowQ81). For the K-quants q is a Q8_K
// row of nb super-blocks (see expandRowK).
func expandRow(t ggml.Type, nb int, q, dst []byte) {
	if isKPanel(t) {
		expandRowK(nb, q, dst)
		return
	}
	if t == ggml.Q5_1 {
		expandRowQ81(nb, q, dst)
		return
	}
	switch t {
	case ggml.Q8_0:
		expandRowQ80Lanes(nb, q, dst, 128)
		return
	case ggml.Q5_0:
		expandRowQ80Lanes(nb, q, dst, 16)
		return
	}
	cw := int32(128)
	if t == ggml.Q4_0 {
		cw = 8
	}
	_, _ = q[nb*q80Bytes-1], dst[nb*xBlock-1]
	for b := range nb {
		src := (*[q80Bytes]byte)(q[b*q80Bytes:])
		d := (*[xBlock]byte)(dst[b*xBlock:])
		binary.LittleEndian.PutUint32(d[:], math.Float32bits(f16Table[binary.LittleEndian.Uint16(src[:])]))
		var sum int32
		for k := 0; k < 32; k += 8 { // the quants, eight at a time
			v := binary.LittleEndian.Uint64(src[2+k:])
			sum += sumInt8x8(v)
			binary.LittleEndian.PutUint64(d[8+k:], v)
		}
		binary.LittleEndian.PutUint32(d[4:], uint32(-cw*sum))
	}
}

// sumInt8x8 returns the sum of the eight signed bytes of v: the unsigned
// bytes added in 16-bit lanes (at most 510 each, then 2040 in the top
// lane), less 256 for each byte whose sign bit is set.
func sumInt8x8(v uint64) int32 {
	const lo = 0x00ff00ff00ff00ff
	u := v&lo + v>>8&lo
	u = u * 0x0001000100010001 >> 48
	return int32(u) - 256*int32(bits.OnesCount64(v&0x8080808080808080))
}

// sumInt8x4 is sumInt8x8 of four bytes.
func sumInt8x4(v uint32) int32 {
	u := v&0x00ff00ff + v>>8&0x00ff00ff
	u = (u + u>>16) & 0xffff
	return int32(u) - 256*int32(bits.OnesCount32(v&0x80808080))
}

// xQ80Lanes is the bytes of one block of an activation row expanded for
// the Q8_0 and Q5_0 panel kernels (q80LanePanel and q50Panel in
// internal/asmgen): the float32 scale, eight int32 corrections and the 32
// int8 quants.
const xQ80Lanes = 68

// expandRowQ80Lanes writes the Q8_0 activation row q (nb blocks) to dst in
// the lane panel kernels' layout: per block the float32 scale, for each
// group k of four quants -cw times their sum (Q8_0's weights are stored
// plus 128, Q5_0's unsigned 5-bit quants are the weights plus 16, so it
// starts lane k's integer sum at the exact value to subtract), then the 32
// quants.
func expandRowQ80Lanes(nb int, q, dst []byte, cw int32) {
	_, _ = q[nb*q80Bytes-1], dst[nb*xQ80Lanes-1]
	for b := range nb {
		src := (*[q80Bytes]byte)(q[b*q80Bytes:])
		d := (*[xQ80Lanes]byte)(dst[b*xQ80Lanes:])
		binary.LittleEndian.PutUint32(d[:], math.Float32bits(f16Table[binary.LittleEndian.Uint16(src[:])]))
		for k := range 8 {
			v := binary.LittleEndian.Uint32(src[2+4*k:])
			binary.LittleEndian.PutUint32(d[4+4*k:], uint32(-cw*sumInt8x4(v)))
			binary.LittleEndian.PutUint32(d[36+4*k:], v)
		}
	}
}

// expandRowQ81 writes the Q8_1 activation row q (nb blocks) to dst in the
// Q5_1 panel kernels' layout: per block the float32 d, the float32 s (d
// times the sum of the quants, as Q8_1 stores it in f16) and the 32 quants.
func expandRowQ81(nb int, q, dst []byte) {
	_, _ = q[nb*q81Bytes-1], dst[nb*xBlock-1]
	for b := range nb {
		src := q[b*q81Bytes : (b+1)*q81Bytes]
		d := dst[b*xBlock : (b+1)*xBlock]
		binary.LittleEndian.PutUint32(d, math.Float32bits(f16Table[binary.LittleEndian.Uint16(src)]))
		binary.LittleEndian.PutUint32(d[4:], math.Float32bits(f16Table[binary.LittleEndian.Uint16(src[2:])]))
		copy(d[8:], src[4:])
	}
}

package ggml

import "encoding/binary"

// IQ4Values is ggml's kvalues_iq4nl: the sixteen non-linear levels that the
// 4-bit indices of IQ4_NL and IQ4_XS stand for.
var IQ4Values = [16]int8{-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113}

// IQ4XSScale returns the 6-bit scale of 32-element sub-block j (0..7) of an
// IQ4_XS super-block minus 32: its low four bits are nibble j%2 of
// scales_l[j/2], its high two bits bits 2j..2j+1 of the little-endian
// scales_h word.
func IQ4XSScale(scalesH uint16, scalesL []byte, j int) int32 {
	lo := int32(scalesL[j/2]>>(4*(j%2))) & 0xf
	hi := int32(scalesH>>(2*j)) & 3
	return lo | hi<<4 - 32
}

// dequantIQ4NL is dequantize_row_iq4_nl for one block: d*level, element j
// (j < 16) from the low nibble of qs[j], element j+16 from its high nibble.
func dequantIQ4NL(blk []byte, y []float32) {
	d := f16At(blk, 0)
	qs := blk[2 : 2+QK/2]
	for j := range QK / 2 {
		y[j] = d * float32(IQ4Values[qs[j]&0xf])
		y[j+16] = d * float32(IQ4Values[qs[j]>>4])
	}
}

// dequantIQ4XS is dequantize_row_iq4_xs for one super-block: sub-block j
// (32 elements, 16 bytes of qs laid out as an IQ4_NL block's) has the value
// (d*scale(j))*level.
func dequantIQ4XS(blk []byte, y []float32) {
	d := f16At(blk, 0)
	sh := binary.LittleEndian.Uint16(blk[2:])
	sl := blk[4:8]
	qs := blk[8:136]
	for j := range 8 {
		dl := d * float32(IQ4XSScale(sh, sl, j))
		q := qs[16*j : 16*j+16]
		out := y[32*j : 32*j+32]
		for l := range 16 {
			out[l] = dl * float32(IQ4Values[q[l]&0xf])
			out[l+16] = dl * float32(IQ4Values[q[l]>>4])
		}
	}
}

// bestIndexIQ4 is ggml's best_index_int8 over IQ4Values: the index of the
// level nearest x, the upper one on a tie.
func bestIndexIQ4(x float32) uint8 {
	v := &IQ4Values
	if x <= float32(v[0]) {
		return 0
	}
	if x >= float32(v[15]) {
		return 15
	}
	lo, hi := 0, 15
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		if x < float32(v[mid]) {
			hi = mid
		} else {
			lo = mid
		}
	}
	if x-float32(v[hi-1]) < float32(v[hi])-x {
		return uint8(hi - 1)
	}
	return uint8(hi)
}

// iq4Block is the search of ggml's quantize_row_iq4_nl_impl for one
// 32-element block without an importance matrix (weights x²) and with
// ntry 7: the scale mapping the first value of largest magnitude to the
// level -127, then the least-squares scales of the 15 maps (t-127)/max,
// t = -7..7, keeping the best. It writes the block's indices for the first
// mapping to L and returns the scale (0 for a block below groupMaxEps).
func iq4Block(x []float32, L []uint8) float32 {
	const ntry = 7
	var amax, mx float32
	for _, v := range x[:QK] {
		if ax := abs32(v); ax > amax {
			amax, mx = ax, v
		}
	}
	if amax < groupMaxEps {
		return 0
	}
	fit := func(id float32, L []uint8) (sumQX, sumQ2 float32) {
		for j, v := range x[:QK] {
			l := bestIndexIQ4(float32(id * v))
			if L != nil {
				L[j] = l
			}
			q := float32(IQ4Values[l])
			w := float32(v * v)
			sumQX += float32(float32(w*q) * v)
			sumQ2 += float32(float32(w*q) * q)
		}
		return sumQX, sumQ2
	}
	d := -mx / float32(IQ4Values[0])
	sumQX, sumQ2 := fit(1/d, L)
	d = 0
	if sumQ2 > 0 {
		d = sumQX / sumQ2
	}
	best := float32(d * sumQX)
	for t := -ntry; t <= ntry; t++ {
		id := float32(t+int(IQ4Values[0])) / mx
		sumQX, sumQ2 = fit(id, nil)
		if sumQ2 > 0 && float32(sumQX*sumQX) > float32(best*sumQ2) {
			d = sumQX / sumQ2
			best = float32(d * sumQX)
		}
	}
	return d
}

// packIQ4 packs 32 indices into 16 bytes: element j in the low nibble of
// byte j, element j+16 in its high nibble.
func packIQ4(L []uint8, qs []byte) {
	for j := range QK / 2 {
		qs[j] = L[j] | L[j+16]<<4
	}
}

// quantIQ4NL quantizes one IQ4_NL block as llama-quantize does without an
// importance matrix (ggml's quantize_iq4_nl, ntry 7): d = iq4Block's scale,
// stored as f16, and each element the level nearest x/d (x*(1/d)).
// ggml's quantize_row_iq4_nl_ref runs the same search with ntry -1 (no
// search); llama-quantize's files are the ones strata reads.
func quantIQ4NL(x []float32, blk []byte) {
	var L [QK]uint8
	d := iq4Block(x, L[:])
	binary.LittleEndian.PutUint16(blk, F32ToF16(d))
	var id float32
	if d != 0 {
		id = 1 / d
	}
	for j, v := range x[:QK] {
		L[j] = bestIndexIQ4(float32(id * v))
	}
	packIQ4(L[:], blk[2:2+QK/2])
}

// quantIQ4XSRef is quantize_row_iq4_xs_ref (quantize_iq4_xs without an
// importance matrix, ntry 7) for one super-block: each 32-element sub-block's
// scale from iq4Block; d = -(the scale of largest magnitude)/32, stored as
// f16; each sub-block's scale as l = nearest_int(scale/d) in -32..31, stored
// plus 32; each element the level nearest x/(d*l) computed with the float32 d.
func quantIQ4XSRef(x []float32, blk []byte) {
	var L [QKK]uint8
	var scales [8]float32
	var amax, maxScale float32
	for j := range 8 {
		scales[j] = iq4Block(x[32*j:32*j+32], L[32*j:32*j+32])
		if a := abs32(scales[j]); a > amax {
			amax, maxScale = a, scales[j]
		}
	}
	d := -maxScale / 32
	binary.LittleEndian.PutUint16(blk, F32ToF16(d))
	var id float32
	if d != 0 {
		id = 1 / d
	}
	var sh uint16
	sl := blk[4:8]
	clear(sl)
	for j := range 8 {
		l := clampInt(nearestInt(float32(id*scales[j])), -32, 31)
		dl := d * float32(l)
		var idl float32
		if dl != 0 {
			idl = 1 / dl
		}
		for i := 32 * j; i < 32*j+32; i++ {
			L[i] = bestIndexIQ4(float32(idl * x[i]))
		}
		l += 32
		sl[j/2] |= byte(l&0xf) << (4 * (j % 2))
		sh |= uint16(l>>4) << (2 * j)
	}
	binary.LittleEndian.PutUint16(blk[2:], sh)
	for j := range 8 {
		packIQ4(L[32*j:], blk[8+16*j:8+16*j+16])
	}
}

package ggml

import (
	"encoding/binary"
	"math"
)

// The K-quants' block formats other than Q4_K and Q6_K (see quant.go), and the
// reference quantizers of all five. Every float operation below is a float32
// operation rounded on its own, as ggml-base computes them (no fused
// multiply-add): the explicit float32 conversions keep Go from fusing.

// Q3KScales unpacks the sixteen 6-bit scales of a Q3_K super-block from its
// 12-byte scales field and returns them minus 32. Scale j has its low four
// bits in the low nibble of byte j (j < 8) or the high nibble of byte j-8,
// and its high two bits at bit 2*(j/4) of byte 8 + j%4.
func Q3KScales(scales []byte) [16]int8 {
	var s [16]int8
	for j := range 16 {
		lo := scales[j%8]
		if j >= 8 {
			lo >>= 4
		}
		hi := scales[8+j%4] >> (2 * (j / 4)) & 3
		s[j] = int8(lo&0xf|hi<<4) - 32
	}
	return s
}

// dequantQ2K is dequantize_row_q2_K for one super-block. Element e =
// 128h + 32j + l (l < 32) is bits 2j..2j+1 of qs[32h + l]; its 16-element
// group g = e/16 has scale scales[g]&15 and min scales[g]>>4, and the value is
// (d*scale)*q - dmin*min.
func dequantQ2K(blk []byte, y []float32) {
	sc := blk[0:16]
	qs := blk[16:80]
	d := f16At(blk, 80)
	dmin := f16At(blk, 82)
	for e := range QKK {
		q := qs[32*(e/128)+e%32] >> (2 * (e % 128 / 32)) & 3
		s := sc[e/16]
		dl, ml := d*float32(s&0xf), dmin*float32(s>>4)
		y[e] = float32(dl*float32(q)) - ml
	}
}

// dequantQ3K is dequantize_row_q3_K for one super-block. Element e =
// 128h + 32j + l (l < 32) has its low two bits at bits 2j..2j+1 of
// qs[32h + l] and its high bit at bit e/32 of hmask[l]; the 3-bit value is
// low - 4 when that bit is clear and low when it is set, and the value is
// (d*scale(e/16))*q.
func dequantQ3K(blk []byte, y []float32) {
	hm := blk[0:32]
	qs := blk[32:96]
	scales := Q3KScales(blk[96:108])
	d := f16At(blk, 108)
	for e := range QKK {
		y[e] = float32(d*float32(scales[e/16])) * float32(Q3KQuant(hm, qs, e))
	}
}

// Q3KQuant returns element e of a Q3_K super-block's quants, in -4..3.
func Q3KQuant(hm, qs []byte, e int) int32 {
	q := int32(qs[32*(e/128)+e%32]>>(2*(e%128/32))) & 3
	if hm[e%32]>>(e/32)&1 == 0 {
		q -= 4
	}
	return q
}

// Q5KQuant returns element e of a Q5_K super-block's quants, in 0..31: the
// low nibble (e%64 < 32) or high nibble of qs[32(e/64) + e%32], with bit e/32
// of qh[e%32] as bit 4.
func Q5KQuant(qh, qs []byte, e int) int32 {
	lo := qs[32*(e/64)+e%32]
	if e%64 >= 32 {
		lo >>= 4
	}
	return int32(lo&0xf) | int32(qh[e%32]>>(e/32)&1)<<4
}

// dequantQ5K is dequantize_row_q5_K for one super-block: element e of
// 32-element sub-block s = e/32 is (d*scale(s))*q - dmin*min(s), with the 6-bit
// scales and mins packed as Q4_K's.
func dequantQ5K(blk []byte, y []float32) {
	d := f16At(blk, 0)
	dmin := f16At(blk, 2)
	scales := blk[4:16]
	qh := blk[16:48]
	qs := blk[48:176]
	for s := range 8 {
		sc, m := Q4KScaleMin(s, scales)
		d1, m1 := d*float32(sc), dmin*float32(m)
		for e := 32 * s; e < 32*s+32; e++ {
			y[e] = float32(d1*float32(Q5KQuant(qh, qs, e))) - m1
		}
	}
}

// nearestInt is ggml's nearest_int: round half to even through the float32
// addition of 1.5*2^23, valid for |f| <= 2^22.
func nearestInt(f float32) int {
	val := f + 12582912
	return int(int32(math.Float32bits(val)&0x007fffff) - 0x00400000)
}

// clampInt returns v limited to [lo, hi].
func clampInt(v, lo, hi int) int { return max(lo, min(hi, v)) }

// makeQKX2 is ggml's make_qkx2_quants: it fits x (n values, weights w) with
// scale*L + min, L in 0..nmax, min <= 0, trying nstep+1 scales
// (rmin + rdelta*is + nmax)/(max - min), and returns the scale and -min.
func makeQKX2(nmax int, x, w []float32, L, aux []uint8, rmin, rdelta float32, nstep int, mad bool) (float32, float32) {
	n := len(x)
	lo, hi := x[0], x[0]
	sumW := w[0]
	sumX := float32(sumW * x[0])
	for i := 1; i < n; i++ {
		if x[i] < lo {
			lo = x[i]
		}
		if x[i] > hi {
			hi = x[i]
		}
		sumW += w[i]
		sumX += float32(w[i] * x[i])
	}
	if lo > 0 {
		lo = 0
	}
	if hi == lo {
		clear(L[:n])
		return 0, -lo
	}
	iscale := float32(nmax) / (hi - lo)
	scale := 1 / iscale
	errOf := func(scale, lo float32, L []uint8) float32 {
		var e float32
		for i := range n {
			diff := float32(float32(scale*float32(L[i]))+lo) - x[i]
			if mad {
				diff = abs32(diff)
			} else {
				diff = float32(diff * diff)
			}
			e += float32(w[i] * diff)
		}
		return e
	}
	for i := range n {
		L[i] = uint8(clampInt(nearestInt(float32(iscale*(x[i]-lo))), 0, nmax))
	}
	best := errOf(scale, lo, L)
	for is := 0; is <= nstep; is++ {
		iscale = (float32(rmin+float32(rdelta*float32(is))) + float32(nmax)) / (hi - lo)
		var sumL, sumL2, sumXL float32
		for i := range n {
			l := clampInt(nearestInt(float32(iscale*(x[i]-lo))), 0, nmax)
			aux[i] = uint8(l)
			wl := float32(w[i] * float32(l))
			sumL += wl
			sumL2 += float32(wl * float32(l))
			sumXL += float32(wl * x[i])
		}
		D := float32(sumW*sumL2) - float32(sumL*sumL)
		if D > 0 {
			thisScale := (float32(sumW*sumXL) - float32(sumX*sumL)) / D
			thisMin := (float32(sumL2*sumX) - float32(sumL*sumXL)) / D
			if thisMin > 0 {
				thisMin = 0
				thisScale = sumXL / sumL2
			}
			if cur := errOf(thisScale, thisMin, aux); cur < best {
				copy(L[:n], aux[:n])
				best, scale, lo = cur, thisScale, thisMin
			}
		}
	}
	return scale, -lo
}

// makeQX is ggml's make_qx_quants with rmse_type 1 and no weights (weights
// x²): symmetric quants L in 0..2*nmax-1 (stored plus nmax), refined over 18
// candidate scales; it returns the scale.
func makeQX(nmax int, x []float32, L []int8) float32 {
	var amax, mx float32
	for _, v := range x {
		if ax := abs32(v); ax > amax {
			amax, mx = ax, v
		}
	}
	if amax < groupMaxEps {
		clear(L[:len(x)])
		return 0
	}
	fit := func(iscale float32) (sumLX, sumL2 float32) {
		for _, v := range x {
			l := float32(clampInt(nearestInt(float32(iscale*v)), -nmax, nmax-1))
			w := float32(v * v)
			sumLX += float32(float32(w*v) * l)
			sumL2 += float32(float32(w*l) * l)
		}
		return sumLX, sumL2
	}
	set := func(iscale float32) {
		for i, v := range x {
			L[i] = int8(nmax + clampInt(nearestInt(float32(iscale*v)), -nmax, nmax-1))
		}
	}
	iscale := -float32(nmax) / mx
	set(iscale)
	sumLX, sumL2 := fit(iscale)
	var scale float32
	if sumL2 != 0 {
		scale = sumLX / sumL2
	}
	best := float32(scale * sumLX)
	for is := -9; is <= 9; is++ {
		if is == 0 {
			continue
		}
		iscale = -(float32(nmax) + float32(0.1*float32(is))) / mx
		sumLX, sumL2 = fit(iscale)
		if sumL2 > 0 && float32(sumLX*sumLX) > float32(best*sumL2) {
			set(iscale)
			scale = sumLX / sumL2
			best = float32(scale * sumLX)
		}
	}
	return scale
}

// makeQ3 is ggml's make_q3_quants with do_rmse: symmetric quants L in
// -nmax..nmax-1 (returned plus nmax), refined one element at a time for up to
// five passes with weights x²; it returns the scale.
func makeQ3(nmax int, x []float32, L []int8) float32 {
	var amax, mx float32
	for _, v := range x {
		if ax := abs32(v); ax > amax {
			amax, mx = ax, v
		}
	}
	if amax < groupMaxEps {
		clear(L[:len(x)])
		return 0
	}
	iscale := -float32(nmax) / mx
	var sumLX, sumL2 float32
	for i, v := range x {
		l := clampInt(nearestInt(float32(iscale*v)), -nmax, nmax-1)
		L[i] = int8(l)
		w := float32(v * v)
		sumLX += float32(float32(w*v) * float32(l))
		sumL2 += float32(float32(w*float32(l)) * float32(l))
	}
	for range 5 {
		changed := 0
		for i, v := range x {
			w := float32(v * v)
			slx := sumLX - float32(float32(w*v)*float32(L[i]))
			if !(slx > 0) {
				continue
			}
			sl2 := sumL2 - float32(float32(w*float32(L[i]))*float32(L[i]))
			nl := clampInt(nearestInt(float32(v*sl2)/slx), -nmax, nmax-1)
			if nl == int(L[i]) {
				continue
			}
			slx += float32(float32(w*v) * float32(nl))
			sl2 += float32(float32(w*float32(nl)) * float32(nl))
			if sl2 > 0 && float32(float32(slx*slx)*sumL2) > float32(float32(sumLX*sumLX)*sl2) {
				L[i] = int8(nl)
				sumLX, sumL2 = slx, sl2
				changed++
			}
		}
		if changed == 0 {
			break
		}
	}
	for i := range x {
		L[i] += int8(nmax)
	}
	if sumL2 > 0 {
		return sumLX / sumL2
	}
	return 0
}

// groupMaxEps is ggml's GROUP_MAX_EPS: a group whose largest magnitude is
// below it quantizes to zeros.
const groupMaxEps = 1e-15

// quantQ2KRef is quantize_row_q2_K_ref for one super-block: each 16-element
// group is fitted by makeQKX2 (nmax 3, weights |x|, mean absolute error);
// the groups' scales and mins are quantized to 4 bits against the largest of
// each, and the elements re-quantized with the stored scales.
func quantQ2KRef(x []float32, blk []byte) {
	var L [QKK]uint8
	var aux [16]uint8
	var w [16]float32
	var scales, mins [16]float32
	var maxScale, maxMin float32
	for j := range 16 {
		xs := x[16*j : 16*j+16]
		for l, v := range xs {
			w[l] = abs32(v)
		}
		scales[j], mins[j] = makeQKX2(3, xs, w[:], L[16*j:], aux[:], -0.5, 0.1, 15, true)
		if scales[j] > maxScale {
			maxScale = scales[j]
		}
		if mins[j] > maxMin {
			maxMin = mins[j]
		}
	}
	sc := blk[0:16]
	clear(sc)
	var d, dmin uint16
	if maxScale > 0 {
		iscale := 15 / maxScale
		for j := range 16 {
			sc[j] = byte(nearestInt(float32(iscale * scales[j])))
		}
		d = F32ToF16(maxScale / 15)
	}
	if maxMin > 0 {
		iscale := 15 / maxMin
		for j := range 16 {
			sc[j] |= byte(nearestInt(float32(iscale*mins[j])) << 4)
		}
		dmin = F32ToF16(maxMin / 15)
	}
	binary.LittleEndian.PutUint16(blk[80:], d)
	binary.LittleEndian.PutUint16(blk[82:], dmin)
	for j := range 16 {
		dl := F16ToF32(d) * float32(sc[j]&0xf)
		if dl == 0 {
			continue
		}
		dm := F16ToF32(dmin) * float32(sc[j]>>4)
		for i := 16 * j; i < 16*j+16; i++ {
			L[i] = uint8(clampInt(nearestInt((x[i]+dm)/dl), 0, 3))
		}
	}
	qs := blk[16:80]
	for h := range 2 {
		for l := range 32 {
			e := 128*h + l
			qs[32*h+l] = L[e] | L[e+32]<<2 | L[e+64]<<4 | L[e+96]<<6
		}
	}
}

// quantQ3KRef is quantize_row_q3_K_ref for one super-block: each 16-element
// group is fitted by makeQ3 (nmax 4); the scales are quantized to 6 bits
// against the one of largest magnitude (d = max/-32), and the elements
// re-quantized with the stored scales.
func quantQ3KRef(x []float32, blk []byte) {
	var L [QKK]int8
	var scales [16]float32
	var amax, maxScale float32
	for j := range 16 {
		scales[j] = makeQ3(4, x[16*j:16*j+16], L[16*j:])
		if s := abs32(scales[j]); s > amax {
			amax, maxScale = s, scales[j]
		}
	}
	sc := blk[96:108]
	clear(sc)
	var d uint16
	if maxScale != 0 {
		iscale := -32 / maxScale
		for j := range 16 {
			l := int8(nearestInt(float32(iscale * scales[j])))
			l = int8(clampInt(int(l), -32, 31) + 32)
			if j < 8 {
				sc[j] = byte(l) & 0xf
			} else {
				sc[j-8] |= (byte(l) & 0xf) << 4
			}
			sc[8+j%4] |= byte(l>>4) << (2 * (j / 4))
		}
		d = F32ToF16(1 / iscale)
	}
	binary.LittleEndian.PutUint16(blk[108:], d)
	stored := Q3KScales(sc)
	for j := range 16 {
		dl := F16ToF32(d) * float32(stored[j])
		if dl == 0 {
			continue
		}
		for i := 16 * j; i < 16*j+16; i++ {
			L[i] = int8(clampInt(nearestInt(x[i]/dl), -4, 3) + 4)
		}
	}
	hm := blk[0:32]
	clear(hm)
	for e := range QKK {
		if L[e] > 3 {
			hm[e%32] |= 1 << (e / 32)
			L[e] -= 4
		}
	}
	qs := blk[32:96]
	for h := range 2 {
		for l := range 32 {
			e := 128*h + l
			qs[32*h+l] = byte(L[e] | L[e+32]<<2 | L[e+64]<<4 | L[e+96]<<6)
		}
	}
}

// quantQ45KRef is quantize_row_q4_K_ref (nmax 15) and quantize_row_q5_K_ref
// (nmax 31) up to the packing of the quants: each 32-element sub-block is
// fitted by makeQKX2 with weights sqrt(mean x²) + |x|; scales and mins are
// quantized to 6 bits against the largest of each and packed into the 12-byte
// field at blk[4:16] (d and dmin at blk[0:4]); the elements are re-quantized
// with the stored scales into L.
func quantQ45KRef(x []float32, blk []byte, nmax int, L *[QKK]uint8) {
	var aux [32]uint8
	var w [32]float32
	var scales, mins [8]float32
	var maxScale, maxMin float32
	rmin, nstep := float32(-1), 20
	if nmax == 31 {
		rmin, nstep = -0.5, 15
	}
	for j := range 8 {
		xs := x[32*j : 32*j+32]
		var sumX2 float32
		for _, v := range xs {
			sumX2 += float32(v * v)
		}
		av := float32(math.Sqrt(float64(sumX2 / 32)))
		for l, v := range xs {
			w[l] = av + abs32(v)
		}
		scales[j], mins[j] = makeQKX2(nmax, xs, w[:], L[32*j:], aux[:], rmin, 0.1, nstep, false)
		if scales[j] > maxScale {
			maxScale = scales[j]
		}
		if mins[j] > maxMin {
			maxMin = mins[j]
		}
	}
	var invScale, invMin float32
	if maxScale > 0 {
		invScale = 63 / maxScale
	}
	if maxMin > 0 {
		invMin = 63 / maxMin
	}
	sc := blk[4:16]
	for j := range 8 {
		ls := min(63, uint8(nearestInt(float32(invScale*scales[j]))))
		lm := min(63, uint8(nearestInt(float32(invMin*mins[j]))))
		if j < 4 {
			sc[j], sc[j+4] = ls, lm
		} else {
			sc[j+4] = ls&0xf | (lm&0xf)<<4
			sc[j-4] |= (ls >> 4) << 6
			sc[j] |= (lm >> 4) << 6
		}
	}
	d, dmin := F32ToF16(maxScale/63), F32ToF16(maxMin/63)
	binary.LittleEndian.PutUint16(blk, d)
	binary.LittleEndian.PutUint16(blk[2:], dmin)
	for j := range 8 {
		s, m := Q4KScaleMin(j, sc)
		dl := F16ToF32(d) * float32(s)
		if dl == 0 {
			continue
		}
		dm := F16ToF32(dmin) * float32(m)
		for i := 32 * j; i < 32*j+32; i++ {
			L[i] = uint8(clampInt(nearestInt((x[i]+dm)/dl), 0, nmax))
		}
	}
}

// quantQ4KRef is quantize_row_q4_K_ref for one super-block.
func quantQ4KRef(x []float32, blk []byte) {
	var L [QKK]uint8
	quantQ45KRef(x, blk, 15, &L)
	qs := blk[16:144]
	for g := range 4 {
		for l := range 32 {
			qs[32*g+l] = L[64*g+l] | L[64*g+32+l]<<4
		}
	}
}

// quantQ5KRef is quantize_row_q5_K_ref for one super-block.
func quantQ5KRef(x []float32, blk []byte) {
	var L [QKK]uint8
	quantQ45KRef(x, blk, 31, &L)
	qh := blk[16:48]
	qs := blk[48:176]
	clear(qh)
	for e := range QKK {
		if L[e] > 15 {
			qh[e%32] |= 1 << (e / 32)
		}
	}
	for g := range 4 {
		for l := range 32 {
			qs[32*g+l] = L[64*g+l]&0xf | (L[64*g+32+l]&0xf)<<4
		}
	}
}

// quantQ6KRef is quantize_row_q6_K_ref for one super-block: each 16-element
// group is fitted by makeQX (nmax 32); the scales are quantized to int8
// against the one of largest magnitude (d = max/-128), and the elements
// re-quantized with the stored scales.
func quantQ6KRef(x []float32, blk []byte) {
	var L [QKK]int8
	var scales [16]float32
	var amax, maxScale float32
	for j := range 16 {
		scales[j] = makeQX(32, x[16*j:16*j+16], L[16*j:])
		if s := abs32(scales[j]); s > amax {
			amax, maxScale = s, scales[j]
		}
	}
	clear(blk[:q6KBytes])
	if amax < groupMaxEps {
		return
	}
	iscale := -128 / maxScale
	d := F32ToF16(1 / iscale)
	binary.LittleEndian.PutUint16(blk[208:], d)
	sc := blk[192:208]
	for j := range 16 {
		sc[j] = byte(int8(min(127, nearestInt(float32(iscale*scales[j])))))
	}
	for j := range 16 {
		dl := F16ToF32(d) * float32(int8(sc[j]))
		if dl == 0 {
			continue
		}
		for i := 16 * j; i < 16*j+16; i++ {
			L[i] = int8(clampInt(nearestInt(x[i]/dl), -32, 31) + 32)
		}
	}
	ql := blk[0:128]
	qh := blk[128:192]
	for h := range 2 {
		for l := range 32 {
			e := 128*h + l
			q1, q2, q3, q4 := byte(L[e]), byte(L[e+32]), byte(L[e+64]), byte(L[e+96])
			ql[64*h+l] = q1&0xf | (q3&0xf)<<4
			ql[64*h+32+l] = q2&0xf | (q4&0xf)<<4
			qh[32*h+l] = q1>>4 | (q2>>4)<<2 | (q3>>4)<<4 | (q4>>4)<<6
		}
	}
}

package main

import (
	"flag"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"

	. "github.com/mmcloughlin/avo/build"
	"github.com/mmcloughlin/avo/ir"
	. "github.com/mmcloughlin/avo/operand"
)

// AVX-VNNI. CPUs with AVX2 but no AVX-512 — Intel's client cores from
// Alder Lake on, its E-core Xeons — have VPDPBUSD on YMM registers in a VEX
// encoding (AVX-VNNI), while Go's assembler encodes VPDPBUSD only as EVEX,
// which needs AVX512_VNNI and AVX512VL. The kernels whose names hold
// avxVNNIMark are written with avo's VPDPBUSD (register operands only,
// Y0–Y15, the registers a VEX prefix can name) and, once avo has allocated
// their registers and written the file, vexVNNI rewrites each of those
// instructions as the bytes of its VEX encoding.
const avxVNNIMark = "AVXVNNI"

// avxVNNIName returns the AVX-VNNI twin of the AVX2 kernel name (its
// "AVX2" made avxVNNIMark) and the doc's words for its instruction sets.
func avxVNNIName(name string) (string, string) {
	return strings.Replace(name, "AVX2", avxVNNIMark, 1), " with AVX2 and AVX-VNNI"
}

// vpdpbusdLine matches a register-only VPDPBUSD as avo prints it: the
// signed bytes (ModRM's r/m), the unsigned bytes (VEX.vvvv), the int32
// accumulator (ModRM's reg).
var vpdpbusdLine = regexp.MustCompile(`^(\s*)VPDPBUSD\s+Y(\d+),\s*Y(\d+),\s*Y(\d+)\s*$`)

// vexVPDPBUSD is the VEX encoding of VPDPBUSD acc, u, s (Intel's operand
// order: acc += the products of u's unsigned bytes with s's signed bytes,
// four to an int32): VEX.256.66.0F38.W0 50 /r.
func vexVPDPBUSD(s, u, acc int) []byte {
	inv := func(r int) byte { return byte(^r>>3) & 1 } // VEX's inverted high bits
	return []byte{
		0xC4,
		inv(acc)<<7 | 1<<6 | inv(s)<<5 | 0x02, // R̄ X̄ B̄, map 0F38
		byte(^u&15)<<3 | 1<<2 | 0x01,          // W0, v̄v̄v̄v̄, L1 (256 bits), pp 66
		0x50,
		0xC0 | byte(acc&7)<<3 | byte(s&7), // ModRM: registers
	}
}

// vexVNNI rewrites the VPDPBUSD instructions of the AVX-VNNI kernels in the
// assembly file avo wrote (-out) as VEX-encoded bytes, and fails where one
// is not register-only in Y0–Y15, or where a VPDPBUSD that must stay EVEX
// (AVX-512) sits in such a kernel.
func vexVNNI() error {
	f := flag.Lookup("out")
	if f == nil || f.Value.String() == "" || f.Value.String() == "-" {
		return fmt.Errorf("asmgen: -out names no file to rewrite")
	}
	path := f.Value.String()
	src, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	lines := strings.Split(string(src), "\n")
	in, n := false, 0
	for i, l := range lines {
		if strings.HasPrefix(l, "TEXT ") {
			in = strings.Contains(l, avxVNNIMark)
			continue
		}
		if !in || !strings.Contains(l, "VPDPBUSD") {
			continue
		}
		m := vpdpbusdLine.FindStringSubmatch(l)
		if m == nil {
			return fmt.Errorf("asmgen: %s:%d: an AVX-VNNI kernel's VPDPBUSD must be register-only: %q", path, i+1, l)
		}
		var r [3]int
		for k := range r {
			r[k], _ = strconv.Atoi(m[2+k])
			if r[k] > 15 {
				return fmt.Errorf("asmgen: %s:%d: Y%d cannot be VEX-encoded: %q", path, i+1, r[k], l)
			}
		}
		var b strings.Builder
		b.WriteString(m[1])
		for k, x := range vexVPDPBUSD(r[0], r[1], r[2]) {
			if k > 0 {
				b.WriteString("; ")
			}
			fmt.Fprintf(&b, "BYTE $0x%02x", x)
		}
		fmt.Fprintf(&b, " // VPDPBUSD Y%d, Y%d, Y%d (VEX: AVX-VNNI)", r[0], r[1], r[2])
		lines[i] = b.String()
		n++
	}
	if n == 0 {
		return fmt.Errorf("asmgen: no AVX-VNNI VPDPBUSD found to rewrite in %s", path)
	}
	return os.WriteFile(path, []byte(strings.Join(lines, "\n")), 0o644)
}

// vpdpbusdY emits VPDPBUSD s, u, acc on YMM registers: acc's int32 lanes
// add the four products of u's unsigned bytes with s's signed bytes. In
// an AVX-VNNI kernel (a name with avxVNNIMark) vexVNNI makes it VEX.
func vpdpbusdY(s, u, acc Op) {
	Instruction(&ir.Instruction{
		Opcode:   "VPDPBUSD",
		Operands: []Op{s, u, acc},
		Inputs:   []Op{s, u, acc},
		Outputs:  []Op{acc},
		ISA:      []string{"AVX_VNNI"},
	})
}

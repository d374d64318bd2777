//go:build amd64 && !purego

package cpu

import (
	"strings"

	"golang.org/x/sys/cpu"

	"github.com/strata-llm/strata/model/ggml"
)

// Instruction sets the generated kernels need. Every AVX-512 CPU has BMI2
// (the tail masks use BZHI); VPDPBUSD needs AVX512_VNNI.
var (
	haveAVX512 = cpu.X86.HasAVX512F && cpu.X86.HasAVX512BW && cpu.X86.HasAVX512DQ &&
		cpu.X86.HasAVX512VL && cpu.X86.HasBMI2
	haveVNNI = haveAVX512 && cpu.X86.HasAVX512VNNI
	haveAVX2 = cpu.X86.HasAVX2 && cpu.X86.HasFMA
	// haveF16C adds VCVTPH2PS, which the AVX2 block kernels use for the
	// scales (every AVX2 CPU has it).
	haveF16C = haveAVX2 && cpu.X86.HasF16C
	// haveAVXVNNI adds VPDPBUSD on YMM registers in its VEX encoding
	// (AVX-VNNI: Intel's client cores from Alder Lake on and its E-core
	// Xeons, AVX2 CPUs without AVX-512), which the AVX-VNNI panel kernels
	// use for prompts.
	haveAVXVNNI = haveF16C && cpu.X86.HasAVXVNNI
	// haveAMX adds the AMX tile instructions (TDPBSSD and the tile loads
	// and stores), which the AMX panel kernels use beside AVX-512, once
	// Linux has let this process use tile data (requestAMX).
	haveAMX = haveVNNI && cpu.X86.HasAMXTile && cpu.X86.HasAMXInt8 && requestAMX()
)

// cpuIdentity returns CPUID's vendor ("intel", "amd" or "") and family
// (the base family, plus the extended family where the base is 15: 25 is
// AMD's Zen 3 and 4, 26 Zen 5). It runs cpuVendor, which ends with
// VZEROUPPER, only on a CPU with AVX; without AVX it returns "", 0.
func cpuIdentity() (vendor string, family uint32) {
	if !cpu.X86.HasAVX {
		return "", 0
	}
	b, d, c, sig := cpuVendor()
	switch {
	case b == 0x756e6547 && d == 0x49656e69 && c == 0x6c65746e: // "Genu" "ineI" "ntel"
		vendor = "intel"
	case b == 0x68747541 && d == 0x69746e65 && c == 0x444d4163: // "Auth" "enti" "cAMD"
		vendor = "amd"
	}
	family = sig >> 8 & 0xf
	if family == 0xf {
		family += sig >> 20 & 0xff
	}
	return vendor, family
}

// aheadAuto is aheadEnv's default: on for Intel CPUs, whose prefetchers
// stop at every 4 KiB page, and for AMD's from Zen 5 (family 26) on, where
// the prefetching kernels were measured faster in session 19; off
// elsewhere, Zen 4 included, where they were not measured.
func aheadAuto() bool {
	vendor, family := cpuIdentity()
	return vendor == "intel" || vendor == "amd" && family >= 26
}

// archTiles returns the fastest kernels this CPU runs for weights of type t,
// or nil.
func archTiles(t ggml.Type) *tileSet {
	switch t {
	case ggml.F32:
		if haveAVX512 && !avx2Only {
			return &f32AVX512
		}
		if haveAVX2 {
			return &f32AVX2
		}
	case ggml.F16:
		if haveAVX512 && !avx2Only {
			return &f16AVX512
		}
		if haveF16C {
			return &f16AVX2
		}
	case ggml.BF16:
		if haveAVX512 && !avx2Only {
			return &bf16AVX512
		}
		if haveAVX2 {
			return &bf16AVX2
		}
	case ggml.Q8_0:
		if haveF16C {
			return &q80AVX2
		}
	case ggml.Q4_0:
		if haveF16C {
			return &q40AVX2
		}
	case ggml.Q5_0:
		if haveF16C {
			return &q50AVX2
		}
	case ggml.IQ4_NL:
		if haveF16C {
			return &iq4NLAVX2
		}
	case ggml.Q5_1:
		if haveF16C {
			return &q51AVX2
		}
	}
	return nil
}

// archPanels returns the kernels for repacked weights of type t, or nil.
// Every panel type has AVX2 panel kernels as well, and AVX-VNNI twins of
// their prompt kernels.
func archPanels(t ggml.Type) *panelSet {
	if !haveVNNI || avx2Only {
		if !haveF16C {
			return nil
		}
		sets, ok := avx2PanelSets[t]
		switch {
		case !ok:
			return nil
		case haveAVXVNNI && !noAVXVNNI:
			return sets[1]
		}
		return sets[0]
	}
	switch t {
	case ggml.Q8_0:
		return &q80Panels
	case ggml.Q4_0:
		return &q40Panels
	case ggml.Q5_0:
		return &q50Panels
	case ggml.Q5_1:
		return &q51Panels
	case ggml.Q4_K:
		return &q4KPanels
	case ggml.Q5_K:
		if haveAMX && !noAMX {
			return &q5KPanels // masks: the AMX kernel reads them
		}
		return &q5KPlanePanels
	case ggml.Q6_K:
		return &q6KPanels
	case ggml.IQ4_XS:
		return &iq4XSPanels
	case ggml.IQ4_NL:
		return &iq4NLPanels
	case ggml.Q2_K:
		return &q2KPanels
	case ggml.Q3_K:
		return &q3KPanels
	}
	return nil
}

var q80Panels = panelSet{name: "q80VNNI", ahead: q80LanePanel_1Ahead, k: [maxPanelC]panelFunc{
	q80LanePanel_1, q80LanePanel_2, q80LanePanel_3, q80LanePanel_4, q80LanePanel_5, q80LanePanel_6, q80LanePanel_7, q80LanePanel_8,
}}

var q40Panels = panelSet{name: "q40VNNI", ahead: q40Panel_1Ahead, amx: q40AMX, k: [maxPanelC]panelFunc{
	q40Panel_1, q40Panel_2, q40Panel_3, q40Panel_4, q40Panel_5, q40Panel_6, q40Panel_7, q40Panel_8,
}}

var q50Panels = panelSet{name: "q50VNNI", ahead: q50Panel_1Ahead, k: [maxPanelC]panelFunc{
	q50Panel_1, q50Panel_2, q50Panel_3, q50Panel_4, q50Panel_5, q50Panel_6, q50Panel_7, q50Panel_8,
}}

var q4KPanels = panelSet{name: "q4KVNNI", ahead: q4KPanel_1Ahead, amx: q4KAMX, k: [maxPanelC]panelFunc{
	q4KPanel_1, q4KPanel_2, q4KPanel_3, q4KPanel_4, q4KPanel_5, q4KPanel_6, q4KPanel_7, q4KPanel_8,
}}

var q5KPanels = panelSet{name: "q5KVNNI", ahead: q5KPanel_1Ahead, amx: q5KAMX, k: [maxPanelC]panelFunc{
	q5KPanel_1, q5KPanel_2, q5KPanel_3, q5KPanel_4, q5KPanel_5, q5KPanel_6, q5KPanel_7, q5KPanel_8,
}}

// q5KPlanePanels is Q5_K's VNNI kernels on the AVX2 kernels' panels (the
// fifth bits in planes), for CPUs without AMX: on an AMD EPYC Zen 4 the
// masks' KMOVQ loads held the matrix-vector kernel to a third of Q4_K's
// speed per byte.
var q5KPlanePanels = panelSet{name: "q5KVNNIPlanes", planes: true, ahead: q5KPlanePanel_1Ahead, k: [maxPanelC]panelFunc{
	q5KPlanePanel_1, q5KPlanePanel_2, q5KPlanePanel_3, q5KPlanePanel_4, q5KPlanePanel_5, q5KPlanePanel_6, q5KPlanePanel_7, q5KPlanePanel_8,
}}

var q51Panels = panelSet{name: "q51VNNI", ahead: q51Panel_1Ahead, k: [maxPanelC]panelFunc{
	q51Panel_1, q51Panel_2, q51Panel_3, q51Panel_4, q51Panel_5, q51Panel_6, q51Panel_7, q51Panel_8,
}}

var q2KPanels = panelSet{name: "q2KVNNI", ahead: q2KPanel_1Ahead, k: [maxPanelC]panelFunc{
	q2KPanel_1, q2KPanel_2, q2KPanel_3, q2KPanel_4, q2KPanel_5, q2KPanel_6, q2KPanel_7, q2KPanel_8,
}}

var q3KPanels = panelSet{name: "q3KVNNI", ahead: q3KPanel_1Ahead, k: [maxPanelC]panelFunc{
	q3KPanel_1, q3KPanel_2, q3KPanel_3, q3KPanel_4, q3KPanel_5, q3KPanel_6, q3KPanel_7, q3KPanel_8,
}}

var iq4XSPanels = panelSet{name: "iq4XSVNNI", ahead: iq4XSPanel_1Ahead, amx: iq4XSAMX, k: [maxPanelC]panelFunc{
	iq4XSPanel_1, iq4XSPanel_2, iq4XSPanel_3, iq4XSPanel_4, iq4XSPanel_5, iq4XSPanel_6, iq4XSPanel_7, iq4XSPanel_8,
}}

var iq4NLPanels = panelSet{name: "iq4NLVNNI", ahead: iq4NLPanel_1Ahead, amx: iq4NLAMX, k: [maxPanelC]panelFunc{
	iq4NLPanel_1, iq4NLPanel_2, iq4NLPanel_3, iq4NLPanel_4, iq4NLPanel_5, iq4NLPanel_6, iq4NLPanel_7, iq4NLPanel_8,
}}

var q6KPanels = panelSet{name: "q6KVNNI", ahead: q6KPanel_1Ahead, amx: q6KAMX, amxMin: 32, k: [maxPanelC]panelFunc{
	q6KPanel_1, q6KPanel_2, q6KPanel_3, q6KPanel_4, q6KPanel_5, q6KPanel_6, q6KPanel_7, q6KPanel_8,
}}

var q4KPanelsAVX2 = panelSet{name: "q4KAVX2", ahead: q4KPanelAVX2_1Ahead, k: [maxPanelC]panelFunc{
	q4KPanelAVX2_1, q4KPanelAVX2_2, q4KPanelAVX2_3, q4KPanelAVX2_4, q4KPanelAVX2_5, q4KPanelAVX2_6, q4KPanelAVX2_7, q4KPanelAVX2_8,
}}

var q5KPanelsAVX2 = panelSet{name: "q5KAVX2", ahead: q5KPanelAVX2_1Ahead, planes: true, k: [maxPanelC]panelFunc{
	q5KPanelAVX2_1, q5KPanelAVX2_2, q5KPanelAVX2_3, q5KPanelAVX2_4, q5KPanelAVX2_5, q5KPanelAVX2_6, q5KPanelAVX2_7, q5KPanelAVX2_8,
}}

var q6KPanelsAVX2 = panelSet{name: "q6KAVX2", ahead: q6KPanelAVX2_1Ahead, k: [maxPanelC]panelFunc{
	q6KPanelAVX2_1, q6KPanelAVX2_2, q6KPanelAVX2_3, q6KPanelAVX2_4, q6KPanelAVX2_5, q6KPanelAVX2_6, q6KPanelAVX2_7, q6KPanelAVX2_8,
}}

var q2KPanelsAVX2 = panelSet{name: "q2KAVX2", ahead: q2KPanelAVX2_1Ahead, k: [maxPanelC]panelFunc{
	q2KPanelAVX2_1, q2KPanelAVX2_2, q2KPanelAVX2_3, q2KPanelAVX2_4, q2KPanelAVX2_5, q2KPanelAVX2_6, q2KPanelAVX2_7, q2KPanelAVX2_8,
}}

var q3KPanelsAVX2 = panelSet{name: "q3KAVX2", ahead: q3KPanelAVX2_1Ahead, k: [maxPanelC]panelFunc{
	q3KPanelAVX2_1, q3KPanelAVX2_2, q3KPanelAVX2_3, q3KPanelAVX2_4, q3KPanelAVX2_5, q3KPanelAVX2_6, q3KPanelAVX2_7, q3KPanelAVX2_8,
}}

var q40PanelsAVX2 = panelSet{name: "q40AVX2", ahead: q40PanelAVX2_1Ahead, k: [maxPanelC]panelFunc{
	q40PanelAVX2_1, q40PanelAVX2_2, q40PanelAVX2_3, q40PanelAVX2_4, q40PanelAVX2_5, q40PanelAVX2_6, q40PanelAVX2_7, q40PanelAVX2_8,
}}

// The AVX2 Q5_0 and Q5_1 panels read the fifth bits in planes
// (repack_q5.go).
var q50PanelsAVX2 = panelSet{name: "q50PanelsAVX2", ahead: q50PanelAVX2_1Ahead, planes: true, k: [maxPanelC]panelFunc{
	q50PanelAVX2_1, q50PanelAVX2_2, q50PanelAVX2_3, q50PanelAVX2_4, q50PanelAVX2_5, q50PanelAVX2_6, q50PanelAVX2_7, q50PanelAVX2_8,
}}

var q51PanelsAVX2 = panelSet{name: "q51PanelsAVX2", ahead: q51PanelAVX2_1Ahead, planes: true, k: [maxPanelC]panelFunc{
	q51PanelAVX2_1, q51PanelAVX2_2, q51PanelAVX2_3, q51PanelAVX2_4, q51PanelAVX2_5, q51PanelAVX2_6, q51PanelAVX2_7, q51PanelAVX2_8,
}}

var q80PanelsAVX2 = panelSet{name: "q80PanelsAVX2", ahead: q80PanelAVX2_1Ahead, k: [maxPanelC]panelFunc{
	q80PanelAVX2_1, q80PanelAVX2_2, q80PanelAVX2_3, q80PanelAVX2_4, q80PanelAVX2_5, q80PanelAVX2_6, q80PanelAVX2_7, q80PanelAVX2_8,
}}

var iq4NLPanelsAVX2 = panelSet{name: "iq4NLAVX2", ahead: iq4NLPanelAVX2_1Ahead, k: [maxPanelC]panelFunc{
	iq4NLPanelAVX2_1, iq4NLPanelAVX2_2, iq4NLPanelAVX2_3, iq4NLPanelAVX2_4, iq4NLPanelAVX2_5, iq4NLPanelAVX2_6, iq4NLPanelAVX2_7, iq4NLPanelAVX2_8,
}}

var iq4XSPanelsAVX2 = panelSet{name: "iq4XSAVX2", ahead: iq4XSPanelAVX2_1Ahead, k: [maxPanelC]panelFunc{
	iq4XSPanelAVX2_1, iq4XSPanelAVX2_2, iq4XSPanelAVX2_3, iq4XSPanelAVX2_4, iq4XSPanelAVX2_5, iq4XSPanelAVX2_6, iq4XSPanelAVX2_7, iq4XSPanelAVX2_8,
}}

// avx2PanelSets is every panel type's AVX2 set and its AVX-VNNI twin,
// which CPUs with AVX2 but no AVX-512 VNNI run: the AVX2 set with its
// prompt kernels (C >= 2) in VPDPBUSD (asmgen's q4PanelAVX2,
// lanePanelAVX2, iq4XSPanelAVX2, q23KPanelAVX2, q4KPanelAVX2,
// q6KPanelAVX2), the same layouts and bits; one activation row runs the
// AVX2 kernel.
var avx2PanelSets = map[ggml.Type][2]*panelSet{
	ggml.Q4_0: withAVXVNNI(&q40PanelsAVX2,
		q40PanelAVXVNNI_2, q40PanelAVXVNNI_3, q40PanelAVXVNNI_4, q40PanelAVXVNNI_5, q40PanelAVXVNNI_6, q40PanelAVXVNNI_7, q40PanelAVXVNNI_8),
	ggml.IQ4_NL: withAVXVNNI(&iq4NLPanelsAVX2,
		iq4NLPanelAVXVNNI_2, iq4NLPanelAVXVNNI_3, iq4NLPanelAVXVNNI_4, iq4NLPanelAVXVNNI_5, iq4NLPanelAVXVNNI_6, iq4NLPanelAVXVNNI_7, iq4NLPanelAVXVNNI_8),
	ggml.Q5_0: withAVXVNNI(&q50PanelsAVX2,
		q50PanelAVXVNNI_2, q50PanelAVXVNNI_3, q50PanelAVXVNNI_4, q50PanelAVXVNNI_5, q50PanelAVXVNNI_6, q50PanelAVXVNNI_7, q50PanelAVXVNNI_8),
	ggml.Q5_1: withAVXVNNI(&q51PanelsAVX2,
		q51PanelAVXVNNI_2, q51PanelAVXVNNI_3, q51PanelAVXVNNI_4, q51PanelAVXVNNI_5, q51PanelAVXVNNI_6, q51PanelAVXVNNI_7, q51PanelAVXVNNI_8),
	ggml.Q8_0: withAVXVNNI(&q80PanelsAVX2,
		q80PanelAVXVNNI_2, q80PanelAVXVNNI_3, q80PanelAVXVNNI_4, q80PanelAVXVNNI_5, q80PanelAVXVNNI_6, q80PanelAVXVNNI_7, q80PanelAVXVNNI_8),
	ggml.IQ4_XS: withAVXVNNI(&iq4XSPanelsAVX2,
		iq4XSPanelAVXVNNI_2, iq4XSPanelAVXVNNI_3, iq4XSPanelAVXVNNI_4, iq4XSPanelAVXVNNI_5, iq4XSPanelAVXVNNI_6, iq4XSPanelAVXVNNI_7, iq4XSPanelAVXVNNI_8),
	ggml.Q2_K: withAVXVNNI(&q2KPanelsAVX2,
		q2KPanelAVXVNNI_2, q2KPanelAVXVNNI_3, q2KPanelAVXVNNI_4, q2KPanelAVXVNNI_5, q2KPanelAVXVNNI_6, q2KPanelAVXVNNI_7, q2KPanelAVXVNNI_8),
	ggml.Q3_K: withAVXVNNI(&q3KPanelsAVX2,
		q3KPanelAVXVNNI_2, q3KPanelAVXVNNI_3, q3KPanelAVXVNNI_4, q3KPanelAVXVNNI_5, q3KPanelAVXVNNI_6, q3KPanelAVXVNNI_7, q3KPanelAVXVNNI_8),
	ggml.Q4_K: withAVXVNNI(&q4KPanelsAVX2,
		q4KPanelAVXVNNI_2, q4KPanelAVXVNNI_3, q4KPanelAVXVNNI_4, q4KPanelAVXVNNI_5, q4KPanelAVXVNNI_6, q4KPanelAVXVNNI_7, q4KPanelAVXVNNI_8),
	ggml.Q5_K: withAVXVNNI(&q5KPanelsAVX2,
		q5KPanelAVXVNNI_2, q5KPanelAVXVNNI_3, q5KPanelAVXVNNI_4, q5KPanelAVXVNNI_5, q5KPanelAVXVNNI_6, q5KPanelAVXVNNI_7, q5KPanelAVXVNNI_8),
	ggml.Q6_K: withAVXVNNI(&q6KPanelsAVX2,
		q6KPanelAVXVNNI_2, q6KPanelAVXVNNI_3, q6KPanelAVXVNNI_4, q6KPanelAVXVNNI_5, q6KPanelAVXVNNI_6, q6KPanelAVXVNNI_7, q6KPanelAVXVNNI_8),
}

// withAVXVNNI returns base and its AVX-VNNI twin: base with k as its
// kernels for 2 to maxPanelC activation rows, its name's "AVX2" made
// "AVXVNNI".
func withAVXVNNI(base *panelSet, k ...panelFunc) [2]*panelSet {
	if len(k) != maxPanelC-1 {
		panic("cpu: " + base.name + ": want an AVX-VNNI kernel for each of 2 to maxPanelC activation rows")
	}
	ps := *base
	ps.name = strings.Replace(base.name, "AVX2", "AVXVNNI", 1)
	copy(ps.k[1:], k)
	return [2]*panelSet{base, &ps}
}

// avx2Only makes archTiles skip the AVX-512 kernels, so that tests run the
// AVX2 ones on an AVX-512 machine.
var avx2Only bool

var f32AVX2 = tileSet{one: f32AVX21, vec: f32AVX2_rows, ahead: f32AVX2_rowsAhead, name: "f32AVX2", unit: 1, maxR: 2, maxC: 2, k: [maxTile][maxTile]tileFunc{
	{f32AVX2_1x1, f32AVX2_1x2},
	{f32AVX2_2x1, f32AVX2_2x2},
}}

func f32AVX21(n int, w, x *byte) float32 {
	var out float32
	f32AVX2_1x1(n, w, 0, x, 0, &out, 0)
	return out
}

var f32AVX512 = tileSet{one: f32AVX5121, vec: f32AVX512_rows, ahead: f32AVX512_rowsAhead, name: "f32AVX512", unit: 1, maxR: 4, maxC: 4, k: [maxTile][maxTile]tileFunc{
	{f32AVX512_1x1, f32AVX512_1x2, f32AVX512_1x3, f32AVX512_1x4},
	{f32AVX512_2x1, f32AVX512_2x2, f32AVX512_2x3, f32AVX512_2x4},
	{f32AVX512_3x1, f32AVX512_3x2, f32AVX512_3x3, f32AVX512_3x4},
	{f32AVX512_4x1, f32AVX512_4x2, f32AVX512_4x3, f32AVX512_4x4},
}}

var f16AVX512 = tileSet{one: f16AVX5121, name: "f16AVX512", unit: 1, maxR: 4, maxC: 4, k: [maxTile][maxTile]tileFunc{
	{f16AVX512_1x1, f16AVX512_1x2, f16AVX512_1x3, f16AVX512_1x4},
	{f16AVX512_2x1, f16AVX512_2x2, f16AVX512_2x3, f16AVX512_2x4},
	{f16AVX512_3x1, f16AVX512_3x2, f16AVX512_3x3, f16AVX512_3x4},
	{f16AVX512_4x1, f16AVX512_4x2, f16AVX512_4x3, f16AVX512_4x4},
}}

var bf16AVX512 = tileSet{one: bf16AVX5121, name: "bf16AVX512", unit: 1, maxR: 4, maxC: 4, k: [maxTile][maxTile]tileFunc{
	{bf16AVX512_1x1, bf16AVX512_1x2, bf16AVX512_1x3, bf16AVX512_1x4},
	{bf16AVX512_2x1, bf16AVX512_2x2, bf16AVX512_2x3, bf16AVX512_2x4},
	{bf16AVX512_3x1, bf16AVX512_3x2, bf16AVX512_3x3, bf16AVX512_3x4},
	{bf16AVX512_4x1, bf16AVX512_4x2, bf16AVX512_4x3, bf16AVX512_4x4},
}}

// f16xAVX512 and bf16xAVX512 are the matrix kernels of f16 and bf16
// weights: their activation rows are float32, rounded to the weights'
// dot-product type first (tileSet.round).
var f16xAVX512 = tileSet{round: roundF16AVX512, vec: f16xAVX512_rows, ahead: f16xAVX512_rowsAhead, name: "f16xAVX512", unit: 1, maxR: 4, maxC: 4, f32x: true, k: [maxTile][maxTile]tileFunc{
	{f16xAVX512_1x1, f16xAVX512_1x2, f16xAVX512_1x3, f16xAVX512_1x4},
	{f16xAVX512_2x1, f16xAVX512_2x2, f16xAVX512_2x3, f16xAVX512_2x4},
	{f16xAVX512_3x1, f16xAVX512_3x2, f16xAVX512_3x3, f16xAVX512_3x4},
	{f16xAVX512_4x1, f16xAVX512_4x2, f16xAVX512_4x3, f16xAVX512_4x4},
}}

var bf16xAVX512 = tileSet{round: roundBF16AVX512, vec: bf16xAVX512_rows, ahead: bf16xAVX512_rowsAhead, name: "bf16xAVX512", unit: 1, maxR: 4, maxC: 4, f32x: true, k: [maxTile][maxTile]tileFunc{
	{bf16xAVX512_1x1, bf16xAVX512_1x2, bf16xAVX512_1x3, bf16xAVX512_1x4},
	{bf16xAVX512_2x1, bf16xAVX512_2x2, bf16xAVX512_2x3, bf16xAVX512_2x4},
	{bf16xAVX512_3x1, bf16xAVX512_3x2, bf16xAVX512_3x3, bf16xAVX512_3x4},
	{bf16xAVX512_4x1, bf16xAVX512_4x2, bf16xAVX512_4x3, bf16xAVX512_4x4},
}}

// f16xAVX2 and bf16xAVX2 are f16xAVX512 and bf16xAVX512 on AVX2.
var f16xAVX2 = tileSet{round: roundF16AVX2, vec: f16xAVX2_rows, ahead: f16xAVX2_rowsAhead, name: "f16xAVX2", unit: 1, maxR: 2, maxC: 2, f32x: true, k: [maxTile][maxTile]tileFunc{
	{f16xAVX2_1x1, f16xAVX2_1x2},
	{f16xAVX2_2x1, f16xAVX2_2x2},
}}

var bf16xAVX2 = tileSet{round: roundBF16AVX2, vec: bf16xAVX2_rows, ahead: bf16xAVX2_rowsAhead, name: "bf16xAVX2", unit: 1, maxR: 2, maxC: 2, f32x: true, k: [maxTile][maxTile]tileFunc{
	{bf16xAVX2_1x1, bf16xAVX2_1x2},
	{bf16xAVX2_2x1, bf16xAVX2_2x2},
}}

// archMatTiles returns the matrix kernels with float32 activations for
// weights of type t, or nil where MatMul runs archTiles' kernels.
func archMatTiles(t ggml.Type) *tileSet {
	avx512 := haveAVX512 && !avx2Only
	switch {
	case t == ggml.F16 && avx512:
		return &f16xAVX512
	case t == ggml.BF16 && avx512:
		return &bf16xAVX512
	case t == ggml.F16 && haveF16C:
		return &f16xAVX2
	case t == ggml.BF16 && haveAVX2:
		return &bf16xAVX2
	}
	return nil
}

func f32AVX5121(n int, w, x *byte) float32 {
	var out float32
	f32AVX512_1x1(n, w, 0, x, 0, &out, 0)
	return out
}

func f16AVX5121(n int, w, x *byte) float32 {
	var out float32
	f16AVX512_1x1(n, w, 0, x, 0, &out, 0)
	return out
}

func bf16AVX5121(n int, w, x *byte) float32 {
	var out float32
	bf16AVX512_1x1(n, w, 0, x, 0, &out, 0)
	return out
}

var q80AVX2 = tileSet{one: q80AVX21, name: "q80AVX2", unit: 32, maxR: 2, maxC: 2, k: [maxTile][maxTile]tileFunc{
	{q80AVX2_1x1, q80AVX2_1x2},
	{q80AVX2_2x1, q80AVX2_2x2},
}}

var q40AVX2 = tileSet{one: q40AVX21, name: "q40AVX2", unit: 32, maxR: 2, maxC: 2, k: [maxTile][maxTile]tileFunc{
	{q40AVX2_1x1, q40AVX2_1x2},
	{q40AVX2_2x1, q40AVX2_2x2},
}}

var q50AVX2 = tileSet{one: q50AVX21, name: "q50AVX2", unit: 32, maxR: 2, maxC: 2, k: [maxTile][maxTile]tileFunc{
	{q50AVX2_1x1, q50AVX2_1x2},
	{q50AVX2_2x1, q50AVX2_2x2},
}}

func q50AVX21(n int, w, x *byte) float32 {
	var out float32
	q50AVX2_1x1(n, w, 0, x, 0, &out, 0)
	return out
}

func q80AVX21(n int, w, x *byte) float32 {
	var out float32
	q80AVX2_1x1(n, w, 0, x, 0, &out, 0)
	return out
}

func q40AVX21(n int, w, x *byte) float32 {
	var out float32
	q40AVX2_1x1(n, w, 0, x, 0, &out, 0)
	return out
}

var f16AVX2 = tileSet{one: f16AVX21, name: "f16AVX2", unit: 1, maxR: 2, maxC: 2, k: [maxTile][maxTile]tileFunc{
	{f16AVX2_1x1, f16AVX2_1x2},
	{f16AVX2_2x1, f16AVX2_2x2},
}}

func f16AVX21(n int, w, x *byte) float32 {
	var out float32
	f16AVX2_1x1(n, w, 0, x, 0, &out, 0)
	return out
}

var bf16AVX2 = tileSet{one: bf16AVX21, name: "bf16AVX2", unit: 1, maxR: 2, maxC: 2, k: [maxTile][maxTile]tileFunc{
	{bf16AVX2_1x1, bf16AVX2_1x2},
	{bf16AVX2_2x1, bf16AVX2_2x2},
}}

func bf16AVX21(n int, w, x *byte) float32 {
	var out float32
	bf16AVX2_1x1(n, w, 0, x, 0, &out, 0)
	return out
}

var iq4NLAVX2 = tileSet{one: iq4NLAVX21, name: "iq4NLAVX2", unit: 32, maxR: 2, maxC: 2, k: [maxTile][maxTile]tileFunc{
	{iq4NLAVX2_1x1, iq4NLAVX2_1x2},
	{iq4NLAVX2_2x1, iq4NLAVX2_2x2},
}}

func iq4NLAVX21(n int, w, x *byte) float32 {
	var out float32
	iq4NLAVX2_1x1(n, w, 0, x, 0, &out, 0)
	return out
}

var q51AVX2 = tileSet{one: q51AVX21, name: "q51AVX2", unit: 32, maxR: 2, maxC: 2, k: [maxTile][maxTile]tileFunc{
	{q51AVX2_1x1, q51AVX2_1x2},
	{q51AVX2_2x1, q51AVX2_2x2},
}}

func q51AVX21(n int, w, x *byte) float32 {
	var out float32
	q51AVX2_1x1(n, w, 0, x, 0, &out, 0)
	return out
}

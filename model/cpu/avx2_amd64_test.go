//go:build amd64 && !purego

package cpu

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/cpu"

	"github.com/strata-llm/strata/model/ggml"
)

// TestAVX2KernelsForEveryType: with the AVX-512 kernels off, as on a CPU
// with AVX2 but no AVX-512, every weight type strata reads runs an AVX2
// kernel, none the portable one.
func TestAVX2KernelsForEveryType(t *testing.T) {
	if !haveF16C {
		t.Skip("no AVX2, FMA and F16C")
	}
	// Whatever STRATA_CPU the test process runs under (portable included),
	// this test is about the AVX2 kernels.
	savedAVX2, savedPortable := avx2Only, portableOnly
	avx2Only, portableOnly = true, false
	defer func() { avx2Only, portableOnly = savedAVX2, savedPortable }()
	for _, typ := range []ggml.Type{ggml.F32, ggml.F16, ggml.BF16, ggml.Q8_0, ggml.Q4_0,
		ggml.Q5_0, ggml.Q5_1, ggml.IQ4_NL, ggml.Q2_K, ggml.Q3_K, ggml.Q4_K, ggml.Q5_K, ggml.Q6_K, ggml.IQ4_XS} {
		if isa := ISA(typ); !strings.HasSuffix(isa, "AVX2") && !strings.HasSuffix(isa, "AVXVNNI") {
			t.Errorf("%s runs %s with AVX2 only", typ, isa)
		}
	}
}

// TestSetKernels checks the values of STRATA_CPU.
func TestSetKernels(t *testing.T) {
	defer func() { avx2Only, portableOnly, noAMX, noAVXVNNI = false, false, false, false }()
	vnni := "AVX2" // Q4_0's and Q2_K's kernels under "avxvnni"
	if haveAVXVNNI {
		vnni = "AVXVNNI"
	}
	for _, tc := range []struct {
		v                                string
		avx2, portable, noAMX, noAVXVNNI bool
		isaSuffix, q40Suffix, wrong      string
	}{
		{v: "avx2", avx2: true, noAMX: true, noAVXVNNI: true, isaSuffix: "AVX2", q40Suffix: "AVX2"},
		{v: " AVX2 ", avx2: true, noAMX: true, noAVXVNNI: true, isaSuffix: "AVX2", q40Suffix: "AVX2"},
		{v: "avxvnni", avx2: true, noAMX: true, isaSuffix: vnni, q40Suffix: vnni},
		{v: "portable", portable: true, noAMX: true, noAVXVNNI: true, isaSuffix: "portable", q40Suffix: "portable"},
		{v: "avx512", noAMX: true},
		{v: "auto"},
		{v: ""},
		{v: "avx10", wrong: `STRATA_CPU="avx10": want avx512, avxvnni, avx2, portable or auto`},
	} {
		avx2Only, portableOnly, noAMX, noAVXVNNI = true, true, true, true // a bad value changes nothing
		err := setKernels(tc.v)
		if tc.wrong != "" {
			if err == nil || err.Error() != tc.wrong {
				t.Errorf("%q: error %v, want %q", tc.v, err, tc.wrong)
			}
			if !avx2Only || !portableOnly || !noAMX || !noAVXVNNI {
				t.Errorf("%q changed the kernels", tc.v)
			}
			continue
		}
		if err != nil || avx2Only != tc.avx2 || portableOnly != tc.portable || noAMX != tc.noAMX || noAVXVNNI != tc.noAVXVNNI {
			t.Errorf("%q: avx2Only %v, portableOnly %v, noAMX %v, noAVXVNNI %v, error %v", tc.v, avx2Only, portableOnly, noAMX, noAVXVNNI, err)
		}
		if isa := ISA(ggml.Q2_K); haveF16C && tc.isaSuffix != "" && !strings.HasSuffix(isa, tc.isaSuffix) {
			t.Errorf("%q: Q2_K runs %s", tc.v, isa)
		}
		if isa := ISA(ggml.Q4_0); haveF16C && tc.q40Suffix != "" && !strings.HasSuffix(isa, tc.q40Suffix) {
			t.Errorf("%q: Q4_0 runs %s, want a name ending %s", tc.v, isa, tc.q40Suffix)
		}
		// Q4_0 runs AMX tiles where the CPU has them, unless held back.
		if isa, amx := ISA(ggml.Q4_0), haveAMX && !tc.noAMX; strings.HasSuffix(isa, "+AMX") != amx {
			t.Errorf("%q: Q4_0 runs %s (AMX %v)", tc.v, isa, amx)
		}
	}
}

// TestSetAhead checks the values of STRATA_PREFETCH, and that the default
// follows the vendor and family CPUID names, compared with /proc/cpuinfo's.
func TestSetAhead(t *testing.T) {
	defer func(saved bool) { aheadOn = saved }(aheadOn)
	for _, tc := range []struct {
		v     string
		want  bool
		wrong string
	}{
		{v: "on", want: true},
		{v: " OFF ", want: false},
		{v: "auto", want: aheadAuto()},
		{v: "", want: aheadAuto()},
		{v: "yes", wrong: `STRATA_PREFETCH="yes": want on, off or auto`},
	} {
		for _, before := range []bool{false, true} {
			aheadOn = before
			err := setAhead(tc.v)
			if tc.wrong != "" {
				if err == nil || err.Error() != tc.wrong {
					t.Errorf("%q: error %v, want %q", tc.v, err, tc.wrong)
				}
				if aheadOn != before {
					t.Errorf("%q changed the setting", tc.v)
				}
				continue
			}
			if err != nil || aheadOn != tc.want {
				t.Errorf("%q: aheadOn %v, error %v; want %v", tc.v, aheadOn, err, tc.want)
			}
		}
	}
	vendor, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		t.Skip("no /proc/cpuinfo to compare CPUID's vendor with")
	}
	info := string(vendor)
	family := -1
	for line := range strings.Lines(info) {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "cpu family" {
			family, _ = strconv.Atoi(strings.TrimSpace(v))
			break
		}
	}
	intel := strings.Contains(info, "GenuineIntel")
	amd := strings.Contains(info, "AuthenticAMD")
	gotVendor, gotFamily := cpuIdentity()
	if cpu.X86.HasAVX {
		want := ""
		switch {
		case intel:
			want = "intel"
		case amd:
			want = "amd"
		}
		if gotVendor != want {
			t.Errorf("cpuIdentity vendor %q; /proc/cpuinfo says %q", gotVendor, want)
		}
		if int(gotFamily) != family {
			t.Errorf("cpuIdentity family %d; /proc/cpuinfo says %d", gotFamily, family)
		}
	}
	if got, want := aheadAuto(), cpu.X86.HasAVX && (intel || amd && family >= 26); got != want {
		t.Errorf("aheadAuto() = %v; /proc/cpuinfo says Intel, or AMD family %d, with AVX: want %v", got, family, want)
	}
}

func init() {
	// Q5_K's VNNI kernels on the masks run only where the CPU has AMX
	// (archPanels); test them, and the plane ones, on every VNNI CPU.
	morePanels = func(t ggml.Type) []*panelSet {
		if t != ggml.Q5_K || !haveVNNI || avx2Only {
			return nil
		}
		if archPanels(t) == &q5KPanels {
			return []*panelSet{&q5KPlanePanels}
		}
		return []*panelSet{&q5KPanels}
	}
}

package shard

import (
	"strings"
	"testing"
)

func TestName(t *testing.T) {
	for _, ok := range []string{"", "gpu-box-1", "räkna 2", strings.Repeat("n", MaxNameLen)} {
		if err := checkName(ok); err != nil {
			t.Errorf("checkName(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{strings.Repeat("n", MaxNameLen+1), "a\nb", "a\x00b", "\xff"} {
		if err := checkName(bad); err == nil {
			t.Errorf("checkName(%q) accepted", bad)
		}
	}
	d := defaultName("0123456789abcdef0123456789abcdef")
	if !strings.HasSuffix(d, "-012345") || checkName(d) != nil {
		t.Errorf("defaultName = %q, want host-012345", d)
	}
}

package membership

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestMetaRoundTrip(t *testing.T) {
	for _, m := range []Meta{
		{Role: RoleCoordinator, NodeID: "coord", Incarnation: 1, GRPCAddr: "10.0.0.1:7070", Protocol: 1},
		{Role: RoleShard, NodeID: "shard-7f3a", Incarnation: 1<<64 - 1, GRPCAddr: "[fe80::1%eth0]:7071", Protocol: 1<<32 - 1},
		{Role: RoleShard, NodeID: "x"},
		{Role: RoleShard, NodeID: strings.Repeat("n", 200), GRPCAddr: strings.Repeat("a", 280)},
	} {
		b, err := m.Encode()
		if err != nil {
			t.Fatalf("Encode(%+v): %v", m, err)
		}
		if len(b) > MaxMetaBytes {
			t.Fatalf("%d bytes encoded", len(b))
		}
		got, err := DecodeMeta(b)
		if err != nil {
			t.Fatalf("DecodeMeta: %v", err)
		}
		if diff := cmp.Diff(got, m); diff != "" {
			t.Fatalf("round trip (-got +want):\n%s", diff)
		}
		// A newer peer may append fields: they are ignored.
		if got, err := DecodeMeta(append(b, 9, 9, 9)); err != nil || got != m {
			t.Fatalf("with trailing bytes: got %+v, %v", got, err)
		}
	}
	typical, _ := Meta{Role: RoleShard, NodeID: "shard-0123456789abcdef", Incarnation: 1<<63 + 5, GRPCAddr: "192.168.100.200:7071", Protocol: 1}.Encode()
	if len(typical) > 64 {
		t.Errorf("typical metadata is %d bytes; expected a compact encoding", len(typical))
	}
}

func TestMetaLeavingFlag(t *testing.T) {
	m := Meta{Role: RoleShard, NodeID: "n", Incarnation: 5, GRPCAddr: "h:1", Protocol: 1}
	for _, flags := range []byte{0, flagLeaving, flagLeaving | 0x80} {
		b, err := m.encode(flags)
		if err != nil {
			t.Fatal(err)
		}
		got, gotFlags, err := decodeMeta(b)
		if err != nil || got != m || gotFlags != flags {
			t.Fatalf("flags %#x: got %+v, %#x, %v", flags, got, gotFlags, err)
		}
	}
}

func TestMetaEncodeErrors(t *testing.T) {
	for name, m := range map[string]Meta{
		"no role":   {NodeID: "a"},
		"bad role":  {Role: 3, NodeID: "a"},
		"no id":     {Role: RoleShard},
		"too large": {Role: RoleShard, NodeID: "a", GRPCAddr: strings.Repeat("x", MaxMetaBytes)},
	} {
		if _, err := m.Encode(); !errors.Is(err, ErrBadMeta) {
			t.Errorf("%s: got %v, want ErrBadMeta", name, err)
		}
	}
}

func TestDecodeMetaErrors(t *testing.T) {
	good, _ := Meta{Role: RoleShard, NodeID: "node", GRPCAddr: "h:1", Protocol: 1}.Encode()
	for name, b := range map[string][]byte{
		"empty":        nil,
		"two bytes":    {metaFormat, 2},
		"format":       append([]byte{2}, good[1:]...),
		"role":         append([]byte{metaFormat, 0}, good[2:]...),
		"truncated":    good[:len(good)-1],
		"bad varint":   {metaFormat, 2, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
		"long string":  {metaFormat, 2, 0, 0, 1, 0x7f, 'a'},
		"empty id":     {metaFormat, 2, 0, 0, 1, 0, 0},
		"protocol big": {metaFormat, 2, 0, 0, 0x80, 0x80, 0x80, 0x80, 0x10, 1, 'a', 0},
		"too large":    make([]byte, MaxMetaBytes+1),
	} {
		if m, err := DecodeMeta(b); !errors.Is(err, ErrBadMeta) {
			t.Errorf("%s: got %+v, %v; want ErrBadMeta", name, m, err)
		}
	}
}

// FuzzDecodeMeta: DecodeMeta never panics, and whatever it accepts
// re-encodes to bytes it decodes the same way.
func FuzzDecodeMeta(f *testing.F) {
	good, _ := Meta{Role: RoleShard, NodeID: "node", Incarnation: 77, GRPCAddr: "h:1", Protocol: 1}.Encode()
	f.Add(good)
	f.Add([]byte{metaFormat, 1, flagLeaving, 0, 0, 1, 'c', 0})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeMeta(b)
		if err != nil {
			return
		}
		e, err := m.Encode()
		if err != nil {
			// Only the size check can refuse what decoded fine.
			if !strings.Contains(err.Error(), "limit") {
				t.Fatalf("decoded %+v but Encode: %v", m, err)
			}
			return
		}
		if m2, err := DecodeMeta(e); err != nil || m2 != m {
			t.Fatalf("re-decode: %+v, %v; want %+v", m2, err, m)
		}
	})
}

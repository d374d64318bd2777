package membership

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/hashicorp/memberlist"
)

// MaxMetaBytes is memberlist's limit on a node's metadata (512 bytes);
// memberlist panics on more, so New refuses it first.
const MaxMetaBytes = memberlist.MetaMaxSize

// metaFormat is the first byte of encoded metadata. Fields are only ever
// appended, and decoders ignore bytes after the fields they know; a change
// that older readers would misread takes a new format number.
const metaFormat = 1

// Role says what a member is.
type Role uint8

// Roles.
const (
	RoleCoordinator Role = 1
	RoleShard       Role = 2
)

// String returns "coordinator", "shard" or "role(N)".
func (r Role) String() string {
	switch r {
	case RoleCoordinator:
		return "coordinator"
	case RoleShard:
		return "shard"
	}
	return fmt.Sprintf("role(%d)", uint8(r))
}

// Meta is what a member tells the cluster about itself through gossip. It
// stays small (MaxMetaBytes); devices and model files go in the gRPC
// Register call instead.
type Meta struct {
	Role Role
	// NodeID is the node's persistent identity (from its data dir).
	NodeID string
	// Incarnation is random per process: a new incarnation under an old
	// NodeID is a lost node plus a new one.
	Incarnation uint64
	// GRPCAddr is host:port of the member's gRPC server (the coordinator's
	// --grpc, a shard's stage endpoint), reachable by the other members.
	GRPCAddr string
	// Protocol is the member's transport.ProtocolVersion.
	Protocol uint32
}

// ErrBadMeta is wrapped by every metadata encoding and decoding error.
var ErrBadMeta = errors.New("membership: bad metadata")

// flagLeaving in the flags byte says the member announced a graceful
// leave (see Node.Leave). Unknown flag bits are ignored.
const flagLeaving = 1 << 0

// Encode returns m's compact encoding: a format byte, the role, a flags
// byte (0 here), then incarnation and protocol as uvarints, then NodeID and
// GRPCAddr each as a uvarint length and bytes. It fails for an unknown
// role, an empty NodeID, or an encoding over MaxMetaBytes.
func (m Meta) Encode() ([]byte, error) { return m.encode(0) }

func (m Meta) encode(flags byte) ([]byte, error) {
	if m.Role != RoleCoordinator && m.Role != RoleShard {
		return nil, fmt.Errorf("%w: role %d is neither coordinator (1) nor shard (2)", ErrBadMeta, uint8(m.Role))
	}
	if m.NodeID == "" {
		return nil, fmt.Errorf("%w: empty node ID", ErrBadMeta)
	}
	b := make([]byte, 0, 3+4*binary.MaxVarintLen64+len(m.NodeID)+len(m.GRPCAddr))
	b = append(b, metaFormat, byte(m.Role), flags)
	b = binary.AppendUvarint(b, m.Incarnation)
	b = binary.AppendUvarint(b, uint64(m.Protocol))
	b = binary.AppendUvarint(b, uint64(len(m.NodeID)))
	b = append(b, m.NodeID...)
	b = binary.AppendUvarint(b, uint64(len(m.GRPCAddr)))
	b = append(b, m.GRPCAddr...)
	if len(b) > MaxMetaBytes {
		return nil, fmt.Errorf("%w: %d bytes encoded, limit %d (node ID %d bytes, gRPC address %d bytes)",
			ErrBadMeta, len(b), MaxMetaBytes, len(m.NodeID), len(m.GRPCAddr))
	}
	return b, nil
}

// DecodeMeta decodes what Encode produced, checking every length against
// the bytes left. Bytes after the known fields are ignored (a newer peer's
// additions). It never panics.
func DecodeMeta(b []byte) (Meta, error) {
	m, _, err := decodeMeta(b)
	return m, err
}

func decodeMeta(b []byte) (Meta, byte, error) {
	m, err := decodeMetaFields(b)
	if err != nil {
		return Meta{}, 0, err
	}
	return m, b[2], nil
}

func decodeMetaFields(b []byte) (Meta, error) {
	var m Meta
	if len(b) > MaxMetaBytes {
		return m, fmt.Errorf("%w: %d bytes, limit %d", ErrBadMeta, len(b), MaxMetaBytes)
	}
	if len(b) < 3 {
		return m, fmt.Errorf("%w: %d bytes, want at least 3", ErrBadMeta, len(b))
	}
	if b[0] != metaFormat {
		return m, fmt.Errorf("%w: format %d, this build reads %d", ErrBadMeta, b[0], metaFormat)
	}
	m.Role = Role(b[1])
	if m.Role != RoleCoordinator && m.Role != RoleShard {
		return Meta{}, fmt.Errorf("%w: unknown role %d", ErrBadMeta, b[1])
	}
	d := metaDecoder{b: b, off: 3} // after format, role, flags
	m.Incarnation = d.uvarint("incarnation")
	p := d.uvarint("protocol")
	if p > 1<<32-1 && d.err == nil {
		d.err = fmt.Errorf("%w: protocol %d overflows uint32", ErrBadMeta, p)
	}
	m.Protocol = uint32(p)
	m.NodeID = d.str("node ID")
	m.GRPCAddr = d.str("gRPC address")
	if d.err != nil {
		return Meta{}, d.err
	}
	if m.NodeID == "" {
		return Meta{}, fmt.Errorf("%w: empty node ID", ErrBadMeta)
	}
	return m, nil
}

// metaDecoder reads fields in order; after the first error it reads
// nothing and keeps that error.
type metaDecoder struct {
	b   []byte
	off int
	err error
}

func (d *metaDecoder) uvarint(field string) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b[d.off:])
	if n <= 0 {
		d.err = fmt.Errorf("%w: %s at offset %d: bad uvarint", ErrBadMeta, field, d.off)
		return 0
	}
	d.off += n
	return v
}

func (d *metaDecoder) str(field string) string {
	n := d.uvarint(field + " length")
	if d.err != nil {
		return ""
	}
	if n > uint64(len(d.b)-d.off) {
		d.err = fmt.Errorf("%w: %s at offset %d: length %d, %d bytes left", ErrBadMeta, field, d.off, n, len(d.b)-d.off)
		return ""
	}
	s := string(d.b[d.off : d.off+int(n)])
	d.off += int(n)
	return s
}

package transport

import (
	"net"
	"strconv"
	"time"

	"github.com/strata-llm/strata/transport/pb"
)

// This file checks the control plane's messages — Register, stream hellos,
// the control streams both ways — before a receiver uses them: strings
// against their limits and alphabets, counts against the named limits,
// enums against their values. Each check returns a *RefusedError naming
// the first violation and never panics.

// idByte reports whether c may appear in a node or shard ID: letters,
// digits and . _ : - (IDs become log fields, JSON and metric labels).
func idByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == ':' || c == '-'
}

// CheckID refuses an ID (node_id, shard_id) that is empty, longer than
// MaxIDLen or has a byte outside [A-Za-z0-9._:-].
func CheckID(field, s string) error {
	if s == "" || len(s) > MaxIDLen {
		return refuse(CodeBadString, "%s of %d bytes, want 1 to %d", field, len(s), MaxIDLen)
	}
	for i := 0; i < len(s); i++ {
		if !idByte(s[i]) {
			return refuse(CodeBadString, "%s has byte 0x%02x at %d, want [A-Za-z0-9._:-]", field, s[i], i)
		}
	}
	return nil
}

func checkOptionalID(field, s string) error {
	if s == "" {
		return nil
	}
	return CheckID(field, s)
}

// checkName refuses a name longer than max or with a control character.
func checkName(field, s string, max int) error {
	if len(s) > max {
		return refuse(CodeBadString, "%s of %d bytes, limit %d", field, len(s), max)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] == 0x7f {
			return refuse(CodeBadString, "%s has control byte 0x%02x at %d", field, s[i], i)
		}
	}
	return nil
}

// checkAddr refuses a host:port that is empty, longer than MaxAddrLen, has
// no valid port, or has a control character.
func checkAddr(field, s string) error {
	if s == "" {
		return refuse(CodeBadString, "%s is empty", field)
	}
	if err := checkName(field, s, MaxAddrLen); err != nil {
		return err
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return refuse(CodeBadString, "%s is not host:port", field)
	}
	if p, err := strconv.Atoi(port); err != nil || p <= 0 || p > 65535 || host == "" {
		return refuse(CodeBadString, "%s names no host or no port in 1..65535", field)
	}
	return nil
}

// isSHA256 reports whether s is 64 lower-case hex digits.
func isSHA256(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !(s[i] >= '0' && s[i] <= '9' || s[i] >= 'a' && s[i] <= 'f') {
			return false
		}
	}
	return true
}

// CheckRegister refuses a RegisterRequest the registry must not keep: a
// node ID that fails CheckID, a gRPC address that is not a bounded
// host:port, no memory, a device or GPU name over MaxNameLen, more than
// MaxGPUs GPUs or MaxModels model files, a model hash that is not SHA-256
// hex, a model name over MaxNameLen, a calibration checkCalibration
// refuses. The protocol version is the caller's to judge.
func CheckRegister(r *pb.RegisterRequest) error {
	if err := CheckID("node_id", r.GetNodeId()); err != nil {
		return err
	}
	if len(r.GetNodeId()) > MaxIDLen-17 {
		return refuse(CodeBadString, "node_id of %d bytes, limit %d", len(r.GetNodeId()), MaxIDLen-17)
	}
	if err := checkAddr("grpc_addr", r.GetGrpcAddr()); err != nil {
		return err
	}
	d := r.GetDevices()
	switch {
	case d.GetMemoryBytes() == 0:
		return refuse(CodeBadField, "devices.memory_bytes is 0")
	case len(d.GetGpus()) > MaxGPUs:
		return refuse(CodeTooLarge, "%d GPUs, limit %d", len(d.GetGpus()), MaxGPUs)
	case len(r.GetModels()) > MaxModels:
		return refuse(CodeTooLarge, "%d model files, limit %d", len(r.GetModels()), MaxModels)
	}
	if err := checkName("devices.device", d.GetDevice(), MaxNameLen); err != nil {
		return err
	}
	for _, g := range d.GetGpus() {
		if err := checkName("gpus.name", g.GetName(), MaxNameLen); err != nil {
			return err
		}
	}
	for _, m := range r.GetModels() {
		if !isSHA256(m.GetSha256()) {
			return refuse(CodeBadString, "models.sha256 is not 64 lower-case hex digits")
		}
		if err := checkName("models.name", m.GetName(), MaxNameLen); err != nil {
			return err
		}
	}
	return checkCalibration(r.GetCalibration())
}

// MaxCalibrationNs bounds each time in a Calibration: a minute per layer
// is no shard placement can use.
const MaxCalibrationNs = uint64(time.Minute)

// maxCalibrationLayers bounds calibration.layers (a shard measures a few).
const maxCalibrationLayers = 1 << 16

// checkCalibration refuses a calibration (when present) whose model hash
// is not SHA-256 hex, that measured no layer or more than maxCalibrationLayers, whose
// times are not in 1..MaxCalibrationNs or whose prefill chunk is not in
// 1..MaxBatchTokens tokens.
func checkCalibration(c *pb.Calibration) error {
	if c == nil {
		return nil
	}
	ok := func(ns uint64) bool { return ns >= 1 && ns <= MaxCalibrationNs }
	switch {
	case !isSHA256(c.GetModelSha256()):
		return refuse(CodeBadString, "calibration.model_sha256 is not 64 lower-case hex digits")
	case c.GetLayers() < 1 || c.GetLayers() > maxCalibrationLayers:
		return refuse(CodeBadField, "calibration.layers must be in 1..%d, got %d", maxCalibrationLayers, c.GetLayers())
	case !ok(c.GetDecode1Ns()) || !ok(c.GetDecode8Ns()) || !ok(c.GetPrefillNs()):
		return refuse(CodeBadField, "calibration times must be in 1..%d ns, got %d, %d and %d", MaxCalibrationNs, c.GetDecode1Ns(), c.GetDecode8Ns(), c.GetPrefillNs())
	case c.GetPrefillTokens() < 1 || c.GetPrefillTokens() > MaxBatchTokens:
		return refuse(CodeBadField, "calibration.prefill_tokens must be in 1..%d, got %d", MaxBatchTokens, c.GetPrefillTokens())
	}
	return nil
}

// CheckHello refuses a StreamHello whose shard or node ID fails CheckID.
// Its epoch and incarnation are the caller's to judge.
func CheckHello(h *pb.StreamHello) error {
	if h == nil {
		return refuse(CodeBadField, "no hello")
	}
	if err := CheckID("shard_id", h.GetShardId()); err != nil {
		return err
	}
	return CheckID("node_id", h.GetNodeId())
}

// CheckFromShard refuses a control-stream message from a shard (after its
// hello) that is empty or malformed: a heartbeat listing more than
// MaxLiveSeqs live sequences or counters keyed outside the Reason enum; a
// status of an unknown state, progress outside [0, 1] or an error text over
// MaxTextLen; a BatchFailed that FailedFromWire refuses for epoch; a second
// hello.
func CheckFromShard(m *pb.ShardToCoordinator, epoch uint64) error {
	switch {
	case m.GetHeartbeat() != nil:
		hb := m.GetHeartbeat()
		if len(hb.GetLiveSeqs()) > MaxLiveSeqs {
			return refuse(CodeTooLarge, "heartbeat lists %d live sequences, limit %d", len(hb.GetLiveSeqs()), MaxLiveSeqs)
		}
		if len(hb.GetCounters().GetTombstonesApplied()) > NumReasons {
			return refuse(CodeTooLarge, "heartbeat counts %d tombstone reasons", len(hb.GetCounters().GetTombstonesApplied()))
		}
		for k := range hb.GetCounters().GetTombstonesApplied() {
			if _, ok := ParseReason(k); !ok {
				return refuse(CodeBadReason, "heartbeat counts tombstones of an unknown reason")
			}
		}
	case m.GetStatus() != nil:
		st := m.GetStatus()
		if _, ok := pb.Status_State_name[int32(st.GetState())]; !ok {
			return refuse(CodeBadField, "status state %d", int32(st.GetState()))
		}
		if p := st.GetProgress(); !(p >= 0 && p <= 1) {
			return refuse(CodeBadField, "status progress %v", p)
		}
		if err := checkText("status.error", st.GetError()); err != nil {
			return err
		}
	case m.GetAck() != nil:
	case m.GetFailed() != nil:
		_, err := FailedFromWire(m.GetFailed(), epoch)
		return err
	case m.GetHello() != nil:
		return refuse(CodeBadField, "a second hello")
	default:
		return refuse(CodeBadField, "empty control message")
	}
	return nil
}

// checkText refuses free text over MaxTextLen bytes.
func checkText(field, s string) error {
	if len(s) > MaxTextLen {
		return refuse(CodeBadString, "%s of %d bytes, limit %d", field, len(s), MaxTextLen)
	}
	return nil
}

// CheckFromCoordinator refuses a control-stream message from the
// coordinator that is empty or malformed: backstop tombstones that
// TombstonesFromWire refuses; a heartbeat reply naming more than
// MaxLiveSeqs unknown sequences or a negative lease. An Assign is checked
// against the model by the shard that loads it.
func CheckFromCoordinator(m *pb.CoordinatorToShard) error {
	switch {
	case m.GetAssign() != nil:
		a := m.GetAssign()
		if err := checkOptionalAddr("assign.next_addr", a.GetNextAddr()); err != nil {
			return err
		}
		if err := checkText("assign.upstream_node_id", a.GetUpstreamNodeId()); err != nil {
			return err
		}
	case m.GetTombstones() != nil:
		_, err := TombstonesFromWire(m.GetTombstones().GetTombstones())
		return err
	case m.GetHeartbeatReply() != nil:
		r := m.GetHeartbeatReply()
		if len(r.GetUnknownSeqs()) > MaxLiveSeqs {
			return refuse(CodeTooLarge, "heartbeat reply names %d unknown sequences, limit %d", len(r.GetUnknownSeqs()), MaxLiveSeqs)
		}
		if r.GetLeaseMs() < 0 {
			return refuse(CodeBadField, "heartbeat reply lease %d ms", r.GetLeaseMs())
		}
	default:
		return refuse(CodeBadField, "empty control message")
	}
	return nil
}

func checkOptionalAddr(field, s string) error {
	if s == "" {
		return nil
	}
	return checkAddr(field, s)
}

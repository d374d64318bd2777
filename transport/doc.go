// Package transport is strata's wire layer: the gRPC services and protobuf
// messages in package pb, the helpers that carry a micro-batch's hidden
// state over a stage stream in chunks, and the gRPC dial and listen options
// every node uses. Package membership (below it) hides memberlist.
// coordinator and shard meet here and never import each other; of strata's
// packages transport imports only model/sample (sampler parameters), never
// coordinator, shard, sched or kv.
//
// # Values and wire
//
// The data path's messages exist twice: as Go values (MicroBatch, Row,
// Tombstone, BatchResult, Failure, ... in message.go), which the
// coordinator's loop and the shard runtime use, and as protobuf (package
// pb), which the gRPC streams carry. wire.go is the one converter, for both
// sides: the coordinator sends with HeaderToWire then SendBatch; a stage
// receives with RecvBatch then BatchFromWire, forwards with HeaderToWire and
// answers with ResultToWire or FailedToWire; the coordinator reads answers
// with ResultFromWire and FailedFromWire. Reason is the one end-reason enum
// (the tombstone reasons, pb.Tombstone_Reason by value); Code is the one
// vocabulary of dropped rows, failed batches and refusals, carried by name.
//
// # Validation
//
// A receiver never uses a field a peer sent before transport has checked
// it: the From functions of wire.go and the Check functions of control.go
// range-check every field (positions in [0, context), block IDs inside the
// pool, token IDs inside the vocabulary, counts against the named limits of
// refuse.go, epoch and placement version equal to the receiver's, reasons
// from their enums, strings bounded and of their alphabet). A violation is
// a *RefusedError with its Code, which the receiver counts (Refusals:
// strata_wire_refused_total{reason}) and answers, never a panic; the code
// names what the peer sent, never the receiver's own state (its epoch or
// model). Whether an answer belongs to a batch in flight where it came
// from is the coordinator's to check. RecoverOptions adds interceptors that
// recover any panic a handler still has, log it once and count it.
//
// # Servers
//
// The coordinator runs one gRPC server (its --grpc address) with
// pb.CoordinatorServer; every shard runs one (its --grpc address, its stage
// endpoint) with pb.StageServer. Both come from NewServer and Listen;
// clients use Dial. All set MaxMessageBytes explicitly and keepalive, so a
// silently dead peer fails its streams within seconds.
//
// # Protocol order
//
//  1. A shard joins the gossip cluster (membership) and finds the
//     coordinator's gRPC address in its metadata.
//  2. Register: devices, model files, incarnation; the reply gives the
//     epoch and the shard's ID.
//  3. Control: the shard opens the stream and sends StreamHello first, then
//     Status and a Heartbeat every heartbeat_ms. The coordinator sends
//     Assign, Tombstones (acked by ack_id; resent after a reconnect) and a
//     HeartbeatReply per heartbeat (lease renewal, unknown sequences).
//  4. After an Assign, the shard loads its range (streaming Weights when it
//     lacks the file) and reports READY. A stage with next_addr dials it and
//     opens Stage.Stream; the last stage opens Coordinator.Results and sends
//     StreamHello first.
//  5. The coordinator opens Stage.Stream to stage 0 and sends batches with
//     SendBatch. Each stage reads them with RecvBatch, checks them with
//     BatchFromWire (epoch and placement version equal to its own: a newer
//     epoch comes only on the control stream), applies the header's
//     tombstones before touching any row, computes, and forwards the batch
//     downstream with SendBatch (or, on the last stage, sends a BatchResult
//     on Results). Rows a stage refuses go into the header's dropped list
//     and out of its hidden state.
//  6. A stage that fails a batch replies BatchFailed on the stream it came
//     from; each hop relays replies upstream, so the coordinator sees them
//     on its stage-0 stream. A stage whose upstream is gone reports on
//     Control instead. Batches are never retried or reordered.
//
// # Hidden states
//
// Hidden states cross stages as f32 little-endian (F32, the default) or,
// opt-in, bf16 (BF16, ggml rounding), cut into chunks of at most
// MaxChunkBytes. A batch on the stream is a BatchHeader followed by exactly
// hidden_chunks HiddenChunk messages with the same batch_id and indexes
// 0, 1, ...; RecvBatch checks all of it, and bounds its allocation by the
// header's declared size against a limit before allocating. Its errors are
// fatal for the stream.
//
// # Concurrency
//
// A gRPC stream allows one goroutine sending and one receiving at the same
// time, no more: each stream needs a single sender (the coordinator's per-
// link sender with its bounded queue; a stage's forwarding goroutine) and a
// single receiver. SendBatch and RecvBatch hold no state between calls and
// are safe to call on different streams concurrently. A message handed to
// Send belongs to the stream; a Batch returned by RecvBatch belongs to the
// caller. EncodeHidden, DecodeHidden, the options functions and Dial are
// safe for concurrent use.
package transport

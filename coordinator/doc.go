// Package coordinator owns every request from the HTTP socket to the last
// token (DESIGN.md).
//
//   - Engine is the loop: the one goroutine that owns the scheduler (and so
//     the KV allocator). Requests (Submit), client disconnects and stop
//     strings (Stream.Abort, Stream.Stop), and batch results become
//     scheduler events; each Step's tombstones ride in the header of the next
//     batch, and its updates go to the requests' Streams. The loop never
//     blocks: a Stream is a bounded sink whose slow reader is aborted, and
//     Pipeline.Dispatch never waits. Over a Cluster it also runs the
//     cluster's loop (the control core's events and actions), so that one
//     goroutine owns both cores (DESIGN.md, Membership and placement).
//   - Pipeline is where batches go: the shards through Cluster, a
//     DynamicPipeline that pauses while no placement is ready and changes
//     shape on re-placement. Shards run in the coordinator's process
//     (--local-shards, wired by cmd/coordinator) reach it the same way; a
//     LocalView reports their KV read directly.
//   - Cluster is the control plane for remote shards: membership
//     (transport/membership), gRPC service Coordinator (Register, Control,
//     Results, Weights), placement, the acked tombstone backstop, leases and
//     epochs persisted in bbolt (Store).
//   - Server is the OpenAI-compatible HTTP API over an Engine: validation at
//     the edge with errors in OpenAI's envelope, streaming, stop strings,
//     logprobs, /tokenize, /detokenize, /metrics, /v1/cluster and the status
//     page. Its Run (its only goroutine, the caller waits for it) samples
//     the engine and the cluster once a second into a History: 900 samples
//     and 256 events (the cluster's lifecycle log records, through
//     History.LogHandler on its logger), served as /v1/cluster/history.
//   - Generate runs one prompt through the whole model in this process.
//
// Engine, Server and Cluster are safe for concurrent use through their
// exported methods; a Stream is read by one handler.
package coordinator

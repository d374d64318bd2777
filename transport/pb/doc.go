// Package pb holds strata's wire protocol: the protobuf messages and gRPC
// services in strata.proto and the Go code generated from it
// (strata.pb.go, strata_grpc.pb.go; regenerate with transport/gen.sh, never
// edit by hand).
//
// The coordinator serves CoordinatorServer (Register, Control, Results,
// Weights) on its --grpc address; every shard serves StageServer (Stream) on
// its own. strata.proto documents each field's meaning and units; package
// transport (the parent) documents the protocol's order and rules and holds
// the helpers that chunk hidden states onto a Stage stream.
//
// Messages are not safe for concurrent mutation; a message handed to Send
// belongs to the stream until Send returns.
package pb

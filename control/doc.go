// Package control is the coordinator's control plane as pure logic, the
// way sched is the scheduler's: no goroutines, clock, logging or I/O, and
// no import of transport, gRPC or bbolt. The coordinator's loop calls it
// and turns its results into messages, logs and writes.
//
// So far it holds placement: given the model's per-layer sizes (Shape)
// and what each shard offers (Capacity: memory, KV budget, and its
// calibrated Speed), Plan places by memory and PlanFor by measured speed
// (DESIGN.md, Membership and placement). Each returns a new Placement that
// the caller owns. The membership, loss and re-plan decisions still live
// in coordinator/cluster.go and cluster_loss.go (issue 15).
package control

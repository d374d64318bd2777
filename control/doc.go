// Package control is the coordinator's control plane as pure logic, the
// way sched is the scheduler's: no goroutines, clock, logging or I/O, and
// no import of transport, gRPC or bbolt. The coordinator's loop calls it
// and turns its results into messages, logs and writes.
//
// Placement: given the model's per-layer sizes (Shape) and what each shard
// offers (Capacity: memory, KV budget, and its calibrated Speed), Plan
// places by memory and PlanFor by measured speed (DESIGN.md, Membership
// and placement). Each returns a new Placement that the caller owns.
//
// Membership and loss: a Core takes the cluster's events — a shard
// registered or forgotten, its control stream up or down, a heartbeat, a
// load report, gossip about a member, the stage-0 link up or down, a
// stage's downstream unreachable — and Tick(now), and returns the Actions
// the shell carries out, in order: pause dispatch, activate (persist and
// switch to) a placement, send Assigns, open the stage-0 link, resume,
// declare a shard lost, cut its stream, warn (ActOverruled, ActWarn). Its
// rules: membership is a hint and the control stream the truth;
// --min-shards gates only the first formation; a loss re-places at once
// onto whatever can hold the model; a markedly faster plan is made
// make-before-break (its stages load while the active placement serves,
// then a switch), and only when every shard serving a range can hold its
// new range beside it (ReplanSkipped says why not, with an ActWarn); a
// pipeline whose batches go unanswered for 20× its step time is stuck
// (Progress, StageTime); not-ready always has a reason (NotReady). One
// goroutine drives a Core; call Tick after every event, as the
// coordinator's loop does, and periodically. Placements in actions are
// never changed afterwards. CheckInvariants is for tests, after every event
// (testdata/scenarios).
package control

// Package sched is strata's scheduler: it decides which sequences the
// pipeline computes in each micro-batch, and it is the single authority on
// when a sequence ends. It owns the KV block allocator (package kv), so
// every block a row names was picked here and is freed here exactly once.
//
// # Calling contract
//
// One goroutine, the coordinator's loop, owns a Scheduler and makes every
// call; nothing here is safe for concurrent use. The scheduler runs no
// goroutines, reads no clock (time comes in as now), does no I/O, logs
// nothing and keeps no package state. The loop turns its inputs into calls:
//
//   - a new request: Add (a *LimitError wrapping ErrQueueFull means 429;
//     ErrNeverFits means 400, the request could never run);
//   - a client gone, or a stop string matched by the handler: Abort(id,
//     Aborted) or Abort(id, Stop);
//   - a batch result from the last stage: Complete(result, now);
//   - a hop that dropped a batch or rows of it: BatchFailed;
//   - a ticker, and after any of the above: Step(now).
//
// Those inputs only record what happened. Step judges deadlines (queue
// timeout and request deadline; timed-out requests end wherever they are),
// fails batches dispatched ReclaimTimeout ago or earlier without an answer,
// forms new micro-batches up to MaxInFlight, and returns an Output with
// everything since the previous Step: tombstones, batches and per-request
// updates (new tokens, and each request's one ending with its reason). The
// shell sends the tombstones ahead of the batches, in the first batch's
// header (an empty batch when there is none), so no stage sees a row reuse a
// block before the tombstone that freed it. Every slice in an Output belongs
// to the caller.
//
// # Requests and sequences
//
// A request owns one sequence at a time. Every admission (the first, after a
// preemption, after lost work) makes a new sequence with a fresh, increasing
// ID, allocates blocks for all of the request's tokens so far (the prompt and
// anything generated, recomputed as a prompt), and dispatches its first row
// with First set. Prefill goes in chunks inside MaxBatchTokens; a sequence's
// consecutive chunks may ride in consecutive batches, while its next decode
// waits for the token sampled from the previous row. Each batch takes decodes
// first, then prefill chunks, then admissions in FCFS order, which stop at
// the first request the allocator cannot hold. When a decode needs a block
// and none is left, the youngest running sequence is preempted (recomputed
// later) and no one is admitted in that Step.
//
// The scheduler appends sampled tokens and ends requests on a stop token or
// on MaxTokens (or the model's context). Results for ended sequences and
// retired batches are ignored.
//
// # Endings
//
// Every ending — stop, length, abort, timeout, preemption, lost work, failure
// — goes through one function, which removes the sequence from every
// structure, frees its blocks and records exactly one tombstone for it.
// Preempted requests, and requests whose work was lost (until MaxRetries),
// go back to the head of the waiting list with their tokens; the others end
// with one final Update. An abort arriving after a natural finish but before
// the Step that reports it wins: the ending's reason becomes the abort's.
// Aborting an unknown or already reported request does nothing.
//
// CheckInvariants verifies the scheduler's and the allocator's invariants;
// tests run it after every event.
package sched

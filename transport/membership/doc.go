// Package membership is strata's gossip membership: it hides
// hashicorp/memberlist behind a Node that reports joins, graceful leaves,
// deaths and metadata updates as Events, the way serf wraps memberlist.
//
// Every strata process (the coordinator and each shard) is a member. Its
// Meta — role, node ID, incarnation, gRPC address, protocol version — is
// gossiped to all and must encode to at most MaxMetaBytes (memberlist's
// 512-byte limit; New refuses more). Devices and model files go in the
// gRPC Register call, not here. Nothing else travels by gossip: tombstones
// ride in the batch stream and the acked control stream (package transport).
//
// # Use
//
// The owner calls New(cfg), then Join with the address of any member (a
// shard: the coordinator's --gossip address), reads Events from one
// goroutine (the coordinator's loop), and at exit calls Leave, so the
// others see EventLeave rather than EventDead, then Shutdown. Members and
// Local give a snapshot at any time.
//
// A graceful leave is told from a death by a leaving flag that Leave first
// gossips in the metadata (Member.Leaving): memberlist v0.7.0 reports both
// through NotifyLeave without the node's state.
//
// Membership is the slow, confirming failure signal (seconds, see
// DefaultConfig); a broken gRPC stream is the fast one.
//
// # Concurrency
//
// All Node methods are safe for concurrent use. Leave, SetMeta and Shutdown
// are serialised (Shutdown waits for a Leave in progress, at most its
// timeout), because memberlist panics on a Leave after Shutdown; Members,
// Local, Events and Dropped never wait. memberlist's delegates run
// on memberlist's goroutines with its state lock held; here they only
// decode and copy a node's data and do a non-blocking send on the Events
// channel (EventBuffer deep), counting what does not fit (Dropped). They
// never block, so a slow reader cannot stall gossip; after drops the
// reader resyncs from Members. Every Member and Event value is a copy the
// receiver owns. Events is never closed.
package membership

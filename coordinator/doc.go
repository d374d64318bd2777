// Package coordinator owns every request from the HTTP socket to the last
// token: the API, the loop that owns the scheduler and the KV allocator,
// placement and tombstone fan-out (DESIGN.md).
//
// Until the cluster and API land, it offers Generate: the whole model in one
// process, one prompt, greedy or sampled, for trying a model and measuring
// its speed.
package coordinator

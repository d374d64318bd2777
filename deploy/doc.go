// Package deploy holds strata's deployment files: a Dockerfile for scratch
// images of host-built static binaries, a docker compose cluster,
// Kubernetes manifests and systemd units (see README.md). It has no Go API;
// its tests run test-compose.sh and test-partition.sh (a shard cut off the
// network and paused under load, TestPartitionFaults) when asked to
// (STRATA_DOCKER_TESTS=1).
package deploy

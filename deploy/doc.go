// Package deploy holds strata's deployment files: a Dockerfile for scratch
// images of host-built static binaries, a docker compose cluster,
// Kubernetes manifests and systemd units (see README.md). It has no Go API;
// its test runs test-compose.sh when asked to (STRATA_DOCKER_TESTS=1).
package deploy

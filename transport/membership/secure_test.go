package membership

import (
	"bytes"
	"testing"
)

// TestSecretKeyAndLabel: over real loopback sockets, a member with the
// cluster's key and label joins; one without the key, with another key, or
// with another label (another cluster) cannot, and the coordinator never
// lists it.
func TestSecretKeyAndLabel(t *testing.T) {
	key := bytes.Repeat([]byte{7}, 32)
	start := func(name string, role Role, key []byte, label string) *Node {
		cfg := fastConfig(name, role)
		cfg.BindAddr, cfg.BindPort = "127.0.0.1", 0
		cfg.SecretKey, cfg.Label = key, label
		return startNode(t, cfg)
	}
	c := start("coord", RoleCoordinator, key, "cluster-1")
	for _, bad := range []struct {
		name  string
		key   []byte
		label string
	}{
		{"no-key", nil, "cluster-1"},
		{"other-key", bytes.Repeat([]byte{8}, 32), "cluster-1"},
		{"no-label", key, ""},
		{"other-label", key, "cluster-2"},
	} {
		n := start(bad.name, RoleShard, bad.key, bad.label)
		if k, err := n.Join([]string{c.Local().Addr}); err == nil || k != 0 {
			t.Errorf("%s joined the cluster: %d, %v", bad.name, k, err)
		}
	}
	good := start("good", RoleShard, key, "cluster-1")
	if _, err := good.Join([]string{c.Local().Addr}); err != nil {
		t.Fatalf("a member with the key and label: %v", err)
	}
	waitMembers(t, c, "coord", "good")
	waitMembers(t, good, "coord", "good")
}

package shard

import (
	"fmt"
	"os"
	"unicode"
	"unicode/utf8"
)

// MaxNameLen bounds a shard's --name in bytes: long enough for a host name
// and a role, short enough to title a box on the status page.
const MaxNameLen = 64

// checkName refuses a --name over MaxNameLen bytes or with anything but
// printable UTF-8 (it is shown to people, on one line).
func checkName(name string) error {
	if len(name) > MaxNameLen {
		return fmt.Errorf("--name must be at most %d bytes, got %d", MaxNameLen, len(name))
	}
	if !utf8.ValidString(name) {
		return fmt.Errorf("--name must be UTF-8, got %q", name)
	}
	for _, r := range name {
		if !unicode.IsPrint(r) {
			return fmt.Errorf("--name must be printable, got %q", name)
		}
	}
	return nil
}

// defaultName is a shard's name when --name is empty: the host name and
// the first 6 hex digits of the node ID, which tell apart two shards on
// one host and stay the same across restarts.
func defaultName(nodeID string) string {
	id := nodeID[:min(6, len(nodeID))]
	host, err := os.Hostname()
	if err != nil || host == "" {
		return "shard-" + id
	}
	if len(host)+1+len(id) > MaxNameLen {
		host = host[:MaxNameLen-1-len(id)]
	}
	if checkName(host) != nil {
		return "shard-" + id
	}
	return host + "-" + id
}
